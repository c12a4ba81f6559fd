"""Scheduling throughput as users see it: the real kube-scheduler, alone and with gas.

    .venv/bin/python -m benchmarks.endtoend                # 1,000 nodes, 1,000 pods, 2 rounds each
    .venv/bin/python -m benchmarks.endtoend --quick        # a smoke size (seconds)
    .venv/bin/python -m benchmarks.endtoend --kubernetes 1.28  # on v1.28's binaries
    .venv/bin/python -m benchmarks.endtoend --nodes 1000 --pods 400 --rounds 3 --json f.json
    .venv/bin/python -m benchmarks.endtoend --prioritize    # and gas with prioritize too
    .venv/bin/python -m benchmarks.endtoend --baseline DIR  # and gas from the tree DIR
    .venv/bin/python -m benchmarks.endtoend --profile DIR   # py-spy stacks of gas, per burst
    .venv/bin/python -m benchmarks.endtoend --cpu-profile DIR  # gas's CPU by function, per burst
    .venv/bin/python -m benchmarks.endtoend --perf DIR      # perf of the three processes, per burst

A real control plane (etcd, kube-apiserver and kube-scheduler of `--kubernetes`, 1.37 unless
told, `tests/support/realk8s.py`) holds N fake GPU nodes of 4 to 8 cards (the labels and
allocatable resources gas reads) and running pods filling their cards to `--occupancy` of GPU
memory. Each round starts a real kube-scheduler
(client QPS and burst raised so that binds are not throttled), and in the gas rounds a real
`gas serve` (gunicorn, mutual TLS, the admin kubeconfig) registered as its extender as the
shipped configurations register it: filter, preempt and bind (`--prioritize` adds rounds
with the prioritize verb too, as binpack and spread need). Once the scheduler has bound a
warm-up pod, a burst of P pending GPU pods of mixed shapes is created from a few threads
on kept-alive connections; a watch notes when each pod is bound. Rounds alternate (alone,
no-op, gas, alone, no-op, gas, ...), so a noisy machine weighs on all alike.

The no-op rounds (`benchmarks.noopext`, when ../shared/tools/noopext is there; `--no-noop`
leaves them out) put the cheapest extender there can be in gas's place: the same TLS, the
same registration but for the paths, the same pods and nodes. They show the extender way's
ceiling on the machine, and gas / no-op how near gas comes to it (each gas round against
the no-op round of its turn); the extender CPU of those rounds is the no-op's.

Per round: pods bound per second (from the first create to the last bind), create -> bound
latency p50/p99, gas's CPU time per bound pod split by thread (from
/proc/<worker>/task/*/stat; the names from `py-spy dump` when py-spy is on PATH, else the
main thread apart from the rest), gas's requests per pod by verb (its metrics) and the
connections gas accepted meanwhile (its `gas_connections_total`: kube-scheduler's, and the
benchmark's reader of gas's metrics should its kept-alive connection close),
kube-scheduler's, kube-apiserver's and the whole machine's busy CPU per pod (on two cores,
2,000 ms of CPU a second bounds the pods per second) and how much of that the hypervisor
gave to others (steal), and the cards: with gas,
every bound pod's cards against capacity (gas.tools.audit.check_invariants); alone, the
pods that no card could hold (first fit on the cards left, in bind order), which the
scheduler cannot see. Prints Markdown tables; never fails on time.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks import noopext
from benchmarks.harness import percentile
from benchmarks.noopext import NoopExtender
from benchmarks.workload import (
    CARD_MEMORY_GI,
    CARD_MILLICORES,
    CARD_SLOTS,
    MEMORY,
    MILLICORES,
    SHAPES,
    Cluster,
    Shape,
    make_cluster,
    pick_shape,
    pod_object,
)
from tests.support import realk8s
from tests.support.gasproc import GasProcess, TLSFiles, child_pids, make_tls_files

NAMESPACE = "bench"
CREATORS = 4
"""Threads creating the burst, each on its own kept-alive connection."""

SCHEDULER_QPS = 5000
"""kube-scheduler's client QPS and burst: binds are not throttled."""

SETUPS = {
    "alone": "kube-scheduler alone",
    "noop": "kube-scheduler + no-op extender",
    "gas": "kube-scheduler + gas",
    "baseline": "kube-scheduler + baseline gas",
    "prioritize": "kube-scheduler + gas, with prioritize",
}
GAS_MODES = ("gas", "baseline", "prioritize")
"""The setups with a `gas serve` as kube-scheduler's extender."""
NOOP = "noop"
# Put first on gas's PYTHONPATH under --cpu-profile: its sitecustomize profiles the worker.
CPU_PROFILER = Path(__file__).resolve().parent / "cpuprofile"
"""The setup with the no-op extender in gas's place (`benchmarks.noopext`)."""


# ---------------------------------------------------------------- the API server, raw


class Api:
    """Kept-alive HTTPS connections to the API server with the admin certificate (one per
    thread: http.client connections are not thread-safe)."""

    def __init__(self, plane: realk8s.ControlPlane) -> None:
        self._context = plane.admin_ssl_context()
        self._port = plane.port
        self._local = threading.local()

    def connection(self, timeout: float = 60) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self._port, context=self._context, timeout=timeout
        )

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connection()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self._local.conn = None
            raise
        return response.status, orjson.loads(data) if data else None

    def create(self, path: str, obj: dict[str, Any]) -> None:
        status, answer = self.call("POST", path, orjson.dumps(obj))
        if status != 201:
            raise RuntimeError(f"POST {path}: {status} {str(answer)[:500]}")

    def get(self, path: str) -> Any:
        status, answer = self.call("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {str(answer)[:500]}")
        return answer


def create_all(api: Api, path: str, objects: Sequence[dict[str, Any]], threads: int) -> None:
    """POST every object, `threads` at a time on kept-alive connections."""
    errors: list[BaseException] = []

    def run(part: Sequence[dict[str, Any]]) -> None:
        try:
            for obj in part:
                api.create(path, obj)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(objects[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


# ---------------------------------------------------------------- the cluster


def node_for_api(node: dict[str, Any]) -> dict[str, Any]:
    allocatable = dict(node["status"]["allocatable"], pods="250")
    return {
        "metadata": node["metadata"],
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def running_for_api(pod: dict[str, Any]) -> dict[str, Any]:
    """A running pod of the generated cluster, as the API server takes it (it assigns the
    UID; the status is the server's)."""
    metadata = {k: v for k, v in pod["metadata"].items() if k != "uid"}
    return {"metadata": metadata, "spec": pod["spec"]}


def burst_pods(count: int, round_name: str, seed: int) -> list[tuple[dict[str, Any], Shape]]:
    rng = random.Random(f"burst-{seed}")
    pods = []
    for index in range(count):
        shape = pick_shape(rng)
        pod = pod_object(f"{round_name}-{index:05d}", "", shape)
        del pod["metadata"]["uid"]
        del pod["status"]
        pod["metadata"]["labels"] = {"round": round_name}
        pods.append((pod, shape))
    return pods


@dataclass
class Cards:
    """Each node's cards: GPU memory (GiB), millicores and pod slots still free."""

    free: dict[str, list[list[int]]]

    @classmethod
    def of(cls, nodes: Iterable[dict[str, Any]], running: Iterable[dict[str, Any]]) -> Cards:
        free: dict[str, list[list[int]]] = {}
        for node in nodes:
            count = len(node["metadata"]["labels"]["gpu.intel.com/gpu-numbers"].split("."))
            free[node["metadata"]["name"]] = [
                [CARD_MEMORY_GI, CARD_MILLICORES, CARD_SLOTS] for _ in range(count)
            ]
        for pod in running:
            cards = pod["metadata"]["annotations"]["gas-container-cards"].split(",")
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            memory = int(limits[MEMORY].removesuffix("Gi")) // len(cards)
            millicores = int(limits[MILLICORES]) // len(cards)
            for card in cards:
                row = free[pod["spec"]["nodeName"]][int(card.removeprefix("card"))]
                row[0] -= memory
                row[1] -= millicores
                row[2] -= 1
        return cls(free)

    def place(self, node: str, shape: Shape) -> bool:
        """Take `shape` on the first cards of `node` that hold it; False if none do."""
        rows = self.free[node]
        fitting = [
            row
            for row in rows
            if row[0] >= shape.memory_gi and row[1] >= shape.millicores and row[2] >= 1
        ]
        if len(fitting) < shape.cards:
            return False
        for row in fitting[: shape.cards]:
            row[0] -= shape.memory_gi
            row[1] -= shape.millicores
            row[2] -= 1
        return True


# ---------------------------------------------------------------- CPU by thread


def thread_ticks(pid: int) -> dict[int, int]:
    """utime + stime (clock ticks) of every thread of `pid`."""
    ticks: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ticks
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def machine_ticks() -> tuple[int, int]:
    """CPU time every core of the machine spent busy (not idle or waiting for I/O), in
    clock ticks: the three processes, etcd, the benchmark's own clients and anything else
    running; and of it the time the hypervisor gave the virtual cores' turn to others
    (steal), which makes everything on the machine look slower."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = f.readline().split()[1:9]
    return sum(int(v) for v in (user, nice, system, irq, softirq, steal)), int(steal)


def process_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def system_ticks(pid: int) -> int:
    """stime of all of `pid`'s threads: the kernel's part of its CPU (its socket reads and
    writes, and on the loopback the delivery to the peer they set off)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[12])


_PYSPY_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \([^)]*\): "([^"]*)"', re.MULTILINE)


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by OS thread id, from `py-spy dump` (empty without py-spy)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names: dict[int, str] = {}
    for ident, name in _PYSPY_THREAD.findall(done.stdout):
        if not ident.startswith("0x"):
            names[int(ident)] = name
    return names


def _recorder(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """`command` started, its output in `log_path` (whose directory it makes)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def thread_group(tid: int, pid: int, names: dict[int, str]) -> str:
    """What a thread does, by its Python name: request threads are the pool's."""
    name = names.get(tid)
    if name is None:
        return "main" if tid == pid else "other threads"
    if name == "MainThread":
        return "main"
    if name.startswith("ThreadPoolExecutor"):
        return "requests"
    if name.startswith("reflector-"):
        return "watch " + name.removeprefix("reflector-")
    return re.sub(r"[-_]?\d+$", "", name) or "other threads"


_REQUESTS = re.compile(r"^gas_requests_total\{([^}]*)\} ([0-9.e+]+)$", re.MULTILINE)
_CONNECTIONS = re.compile(r"^gas_connections_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


def gas_counts(gas: GasProcess) -> tuple[dict[str, float], float]:
    """gas's requests so far by verb, and the connections it accepted (NaN from a gas that
    does not count them), from its metrics."""
    response = gas.session.get(gas.url + "/metrics", timeout=10)
    response.raise_for_status()
    counts: dict[str, float] = {}
    for labels, value in _REQUESTS.findall(response.text):
        verb = re.search(r'verb="([^"]*)"', labels)
        if verb:
            counts[verb.group(1)] = counts.get(verb.group(1), 0.0) + float(value)
    connections = _CONNECTIONS.findall(response.text)
    return counts, sum(map(float, connections)) if connections else float("nan")


# ---------------------------------------------------------------- one round


@dataclass
class Round:
    mode: str
    name: str
    pods: int
    bound: int = 0
    wall_s: float = float("nan")
    create_s: float = float("nan")
    latencies_s: list[float] = field(default_factory=list)
    gas_cpu_ms: dict[str, float] = field(default_factory=dict)
    extender_system_ms: float = float("nan")
    """Of the extender's CPU, the kernel's (`system_ticks`)."""
    scheduler_cpu_ms: float = float("nan")
    apiserver_cpu_ms: float = float("nan")
    machine_cpu_ms: float = float("nan")
    steal_ms: float = float("nan")
    no_card_fits: int = 0
    requests: dict[str, float] = field(default_factory=dict)
    connections: float = float("nan")
    over_commit: list[str] = field(default_factory=list)

    @property
    def pods_per_s(self) -> float:
        return self.bound / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def p50_s(self) -> float:
        return statistics.median(self.latencies_s) if self.latencies_s else float("nan")

    @property
    def p99_s(self) -> float:
        return percentile(self.latencies_s, 0.99) if self.latencies_s else float("nan")

    def gas_ms_per_pod(self, group: str | None = None) -> float:
        if not self.bound or not self.gas_cpu_ms:
            return float("nan")
        total = sum(self.gas_cpu_ms.values()) if group is None else self.gas_cpu_ms.get(group, 0.0)
        return total / self.bound

    def record(self) -> dict[str, Any]:
        record = asdict(self)
        del record["latencies_s"]
        record.update(
            pods_per_s=self.pods_per_s,
            p50_s=self.p50_s,
            p99_s=self.p99_s,
            gas_cpu_ms_per_pod=self.gas_ms_per_pod(),
            over_committed=len(self.over_commit),
        )
        return record


class Watch(threading.Thread):
    """Notes the moment each pod of the round is first seen bound."""

    def __init__(self, api: Api, round_name: str, version: str) -> None:
        super().__init__(name="watch", daemon=True)
        self.bound: dict[str, tuple[float, str]] = {}
        self.changed = threading.Condition()
        self._conn = api.connection(timeout=600)
        self._path = (
            f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&labelSelector=round%3D{round_name}"
            f"&resourceVersion={version}&allowWatchBookmarks=false"
        )
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._conn.request("GET", self._path)
            response = self._conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"watch: {response.status} {response.read()[:300]!r}")
            pending = b""
            while chunk := response.read1(65536):
                now = time.monotonic()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line:
                        self._event(orjson.loads(line), now)
        except (OSError, http.client.HTTPException):
            pass  # closed by stop()
        except BaseException as exc:
            self.error = exc

    def _event(self, event: dict[str, Any], now: float) -> None:
        pod = event.get("object") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        name = (pod.get("metadata") or {}).get("name")
        if node and name and name not in self.bound:
            with self.changed:
                self.bound[name] = (now, node)
                self.changed.notify_all()

    def stop(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(2)
        self._conn.close()


def scheduler_config(
    gas_port: int | None, tls: TLSFiles, prioritize: bool = False, noop: bool = False
) -> str:
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": SCHEDULER_QPS, "burst": SCHEDULER_QPS},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler"}],
    }
    if gas_port is not None:
        extender = realk8s.gas_extender(gas_port, tls, ignorable=False, httpTimeout="10s")
        if not prioritize:
            # As shipped: under first fit every score is 0, and the call changes nothing.
            del extender["prioritizeVerb"], extender["weight"]
        if noop:
            # The same registration but for the paths: the no-op serves /filter and /bind
            # (and no preempt, which none of these bursts needs: every pod fits).
            extender["urlPrefix"] = f"https://127.0.0.1:{gas_port}"
            del extender["preemptVerb"]
        config["extenders"] = [extender]
    return json.dumps(config)


class Bench:
    def __init__(
        self,
        plane: realk8s.ControlPlane,
        workdir: Path,
        nodes: list[dict[str, Any]],
        running: list[dict[str, Any]],
        pods: int,
        settle_s: float,
        gas_args: Sequence[str],
        profile: Path | None = None,
        baseline: str | None = None,
        perf: Path | None = None,
        cpu_profile: Path | None = None,
    ) -> None:
        self.plane = plane
        self.api = Api(plane)
        self.workdir = workdir
        self.tls = make_tls_files(workdir)
        self.nodes = nodes
        self.running = running
        self.pods = pods
        self.settle_s = settle_s
        self.profile = profile
        self.perf = perf
        self.cpu_profile = cpu_profile
        self.baseline = baseline
        self.gas_args = list(gas_args)
        self.rounds = 0

    def run(self, mode: str) -> Round:
        self.rounds += 1
        name = f"r{self.rounds}-{mode}"
        result = Round(mode, name, self.pods)
        gas: GasProcess | None = None
        noop: NoopExtender | None = None
        scheduler: realk8s.Process | None = None
        try:
            if mode in GAS_MODES:
                gas = self._start_gas(name, self.baseline if mode == "baseline" else None)
            if mode == NOOP:
                noop = NoopExtender(
                    self.plane.admin_kubeconfig, self.tls, self.workdir / f"noopext-{name}.log"
                )
                noop.wait_ready()
            port = gas.port if gas else noop.port if noop else None
            scheduler = self.plane.start_scheduler(
                scheduler_config(port, self.tls, mode == "prioritize", noop is not None),
                name=f"scheduler-{name}",
            )
            self._warm_up(name)
            self._burst(result, name, gas, scheduler, noop)
        finally:
            if scheduler is not None:
                scheduler.stop()
                self.plane.processes.remove(scheduler)
            if gas is not None:
                gas.stop(signal.SIGTERM)
            if noop is not None:
                noop.stop()
        self._check(result, name)
        self._clean(name)
        return result

    def burst(self, name: str) -> list[tuple[dict[str, Any], Shape]]:
        """The round's pending pods, made before its clock starts (benchmarks.dra makes
        pods of other kinds, and the claims they use)."""
        return burst_pods(self.pods, name, self.rounds)

    def _start_gas(self, name: str, source: str | None) -> GasProcess:
        """`gas serve` over the plane, from this tree or (baseline) from the tree `source`,
        put first on its PYTHONPATH."""
        previous = os.environ.get("PYTHONPATH")
        if source is not None:
            os.environ["PYTHONPATH"] = source
            # `python -m` puts the working directory (this tree) first on sys.path, ahead
            # of PYTHONPATH: without this the baseline rounds ran this tree's gas.
            os.environ["PYTHONSAFEPATH"] = "1"
        if self.cpu_profile is not None:
            self.cpu_profile.mkdir(parents=True, exist_ok=True)
            os.environ["GAS_BENCH_CPU_PROFILE"] = str(self.cpu_profile.resolve())
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [str(CPU_PROFILER), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        try:
            gas = GasProcess(
                ["--kubeConfig", self.plane.admin_kubeconfig, *self.gas_args],
                self.workdir / f"gas-{name}.log",
                self.tls,
            )
        finally:
            os.environ.pop("GAS_BENCH_CPU_PROFILE", None)
            if source is not None:
                del os.environ["PYTHONSAFEPATH"]
            if source is not None or self.cpu_profile is not None:
                if previous is None:
                    del os.environ["PYTHONPATH"]
                else:
                    os.environ["PYTHONPATH"] = previous
        gas.wait_ready(timeout=300)
        return gas

    def _warm_up(self, name: str) -> None:
        """One pod bound: the scheduler's caches are filled and gas is reached."""
        pod = pod_object(f"{name}-warm", "", SHAPES[0])
        del pod["metadata"]["uid"], pod["status"]
        pod["metadata"]["labels"] = {"round": name, "warm": "1"}
        self.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, answer = self.api.call(
                "GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}-warm"
            )
            if status == 200 and answer["spec"].get("nodeName"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"round {name}: the warm-up pod was never bound")

    def _burst(
        self,
        result: Round,
        name: str,
        gas: GasProcess | None,
        scheduler: realk8s.Process,
        noop: NoopExtender | None = None,
    ) -> None:
        pods = self.burst(name)
        bodies = [orjson.dumps(pod) for pod, _ in pods]
        listed = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        watch = Watch(self.api, name, listed["metadata"]["resourceVersion"])
        watch.start()
        worker = None
        if gas is not None:
            (worker,) = child_pids(gas.process.pid)
        elif noop is not None:
            worker = noop.pid
        apiserver = self.plane.apiserver
        assert apiserver is not None
        created: dict[str, float] = {}
        errors: list[BaseException] = []

        def create(indices: range) -> None:
            try:
                for index in indices:
                    created[pods[index][0]["metadata"]["name"]] = time.monotonic()
                    status, answer = self.api.call(
                        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", bodies[index]
                    )
                    if status != 201:
                        raise RuntimeError(f"create: {status} {str(answer)[:300]}")
            except BaseException as exc:
                errors.append(exc)

        # Each creator's connection opened before the clock starts.
        creators = [
            threading.Thread(target=create, args=(range(i, len(pods), CREATORS),))
            for i in range(CREATORS)
        ]
        # Read before the CPU clock starts: the metrics' exposition is not the burst's work.
        requests_before, connections_before = gas_counts(gas) if gas else ({}, float("nan"))
        if noop is not None:
            requests_before = {verb: float(n) for verb, n in noop.counts().items()}
        recorders = self._profiler(worker, name) if gas is not None and worker else []
        recorders += self._perf(
            name,
            {"scheduler": scheduler.pid, "apiserver": apiserver.pid}
            | ({"noop" if noop is not None else "gas": worker} if worker else {}),
        )
        if gas is not None and self.cpu_profile is not None:
            (self.cpu_profile / ".start").write_text(name)
        if recorders or (gas is not None and self.cpu_profile is not None):
            time.sleep(1)  # attached before the burst
        gas_before = thread_ticks(worker) if worker else {}
        system_before = system_ticks(worker) if worker else 0
        scheduler_before = process_ticks(scheduler.pid)
        apiserver_before = process_ticks(apiserver.pid)
        machine_before = machine_ticks()
        started = time.monotonic()
        for creator in creators:
            creator.start()
        for creator in creators:
            creator.join()
        result.create_s = time.monotonic() - started
        if errors:
            watch.stop()
            raise errors[0]
        # Until every pod is bound, or none has been for settle_s (pods that fit nowhere
        # stay pending).
        with watch.changed:
            while len(watch.bound) < len(pods):
                seen = len(watch.bound)
                watch.changed.wait(self.settle_s)
                if len(watch.bound) == seen:
                    break
        gas_after = thread_ticks(worker) if worker else {}
        system_after = system_ticks(worker) if worker else 0
        if gas is not None and self.cpu_profile is not None:
            self._cpu_profile_written(name)
        if gas is not None:
            # A Binding is seen by the watch before gas's bind handler returns and counts
            # itself: read the counts again until every bound pod's bind is in them.
            counted_by = time.monotonic() + 5
            while True:
                after, connections_after = gas_counts(gas)
                result.requests = {v: n - requests_before.get(v, 0) for v, n in after.items()}
                if result.requests.get("bind", 0) >= len(watch.bound):
                    break
                if time.monotonic() > counted_by:
                    break
                time.sleep(0.05)
            result.connections = connections_after - connections_before
        if noop is not None:
            counted = noop.counts()
            result.requests = {v: n - requests_before.get(v, 0) for v, n in counted.items()}
        scheduler_after = process_ticks(scheduler.pid)
        apiserver_after = process_ticks(apiserver.pid)
        machine_after = machine_ticks()
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)
        for recorder in recorders:
            recorder.wait(timeout=120)
        names = thread_names(worker) if gas is not None and worker else {}
        watch.stop()
        watch.join(timeout=10)

        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        bound = dict(watch.bound)
        result.bound = len(bound)
        if bound:
            result.wall_s = max(t for t, _ in bound.values()) - started
        result.latencies_s = [t - created[pod] for pod, (t, _) in bound.items()]
        result.scheduler_cpu_ms = (scheduler_after - scheduler_before) * tick_ms
        result.apiserver_cpu_ms = (apiserver_after - apiserver_before) * tick_ms
        result.machine_cpu_ms = (machine_after[0] - machine_before[0]) * tick_ms
        result.steal_ms = (machine_after[1] - machine_before[1]) * tick_ms
        if worker:
            result.extender_system_ms = (system_after - system_before) * tick_ms
            groups: dict[str, float] = {}
            for tid, ticks in gas_after.items():
                spent = (ticks - gas_before.get(tid, 0)) * tick_ms
                # The no-op's goroutines move between its threads: one figure.
                group = NOOP if noop is not None else thread_group(tid, worker, names)
                groups[group] = groups.get(group, 0.0) + spent
            result.gas_cpu_ms = groups
        if result.mode in ("alone", NOOP):
            cards = Cards.of(self.nodes, self.running)
            shapes = {pod["metadata"]["name"]: shape for pod, shape in pods}
            for pod_name, (_, node) in sorted(bound.items(), key=lambda item: item[1][0]):
                if not cards.place(node, shapes[pod_name]):
                    result.no_card_fits += 1

    def _cpu_profile_written(self, name: str) -> None:
        """The burst's CPU profile ended, and waited for (`benchmarks/cpuprofile`)."""
        assert self.cpu_profile is not None
        (self.cpu_profile / ".stop").touch()
        done = self.cpu_profile / f"{name}.done"
        deadline = time.monotonic() + 120
        while not done.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"round {name}: gas wrote no CPU profile in 120 s")
            time.sleep(0.1)

    def _profiler(self, worker: int, name: str) -> list[subprocess.Popen[bytes]]:
        """`py-spy record` of the gas worker over the burst (with --profile), its stacks
        collapsed, one line per stack and thread, into <profile>/<round>.txt."""
        spy = shutil.which("py-spy")
        if self.profile is None or spy is None:
            return []
        command = [spy, "record", "--pid", str(worker), "--rate", "200", "--threads", "--gil"]
        command += ["--nonblocking"]
        command += ["--format", "raw", "--output", str(self.profile / f"{name}.txt")]
        return [_recorder(command, self.profile / f"{name}.py-spy.log")]

    def _perf(self, name: str, pids: dict[str, int]) -> list[subprocess.Popen[bytes]]:
        """`perf record -g` of each process over the burst (with --perf), into
        <perf>/<round>-<process>.data; `perf report -i FILE --no-children` reads one (gas's
        Python frames show as the interpreter's: its native and kernel time apart)."""
        perf = shutil.which("perf")
        if self.perf is None or perf is None:
            return []
        recorders = []
        for process, pid in pids.items():
            data = str(self.perf / f"{name}-{process}.data")
            command = [perf, "record", "-F", "499", "-g", "-p", str(pid), "-o", data]
            recorders.append(_recorder(command, self.perf / f"{name}-{process}.perf.log"))
        return recorders

    def _check(self, result: Round, name: str) -> None:
        if result.mode not in GAS_MODES:
            return
        from gas.tools.audit import check_invariants

        nodes = self.api.get("/api/v1/nodes")["items"]
        pods = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        result.over_commit = check_invariants(nodes, pods, require_annotations=True)

    def _clean(self, name: str) -> None:
        status, answer = self.api.call(
            "DELETE",
            f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=round%3D{name}"
            "&gracePeriodSeconds=0",
        )
        if status != 200:
            raise RuntimeError(f"deleting round {name}'s pods: {status} {str(answer)[:300]}")


# ---------------------------------------------------------------- report


def fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"


def rounds_table(rounds: Sequence[Round]) -> list[str]:
    groups = sorted({g for r in rounds for g in r.gas_cpu_ms})
    header = [
        "round",
        "setup",
        "bound",
        "pods/s",
        "created in s",
        "p50 s",
        "p99 s",
        "extender CPU ms/pod",
        "of it system ms/pod",
        *[f"{g} ms/pod" for g in groups if g != NOOP],
        "scheduler CPU ms/pod",
        "apiserver CPU ms/pod",
        "machine CPU ms/pod",
        "of it stolen ms/pod",
        "no card fits",
        "over-committed",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for r in rounds:
        per_pod = r.bound or 1
        cells = [
            r.name,
            SETUPS[r.mode],
            f"{r.bound:,}/{r.pods:,}",
            fmt(r.pods_per_s, 0),
            fmt(r.create_s, 1),
            fmt(r.p50_s, 2),
            fmt(r.p99_s, 2),
            fmt(r.gas_ms_per_pod(), 2),
            fmt(r.extender_system_ms / per_pod, 2),
            *[
                "n/a" if r.mode == NOOP else fmt(r.gas_ms_per_pod(g), 2)
                for g in groups
                if g != NOOP
            ],
            fmt(r.scheduler_cpu_ms / per_pod, 2),
            fmt(r.apiserver_cpu_ms / per_pod, 2),
            fmt(r.machine_cpu_ms / per_pod, 2),
            fmt(r.steal_ms / per_pod, 2),
            str(r.no_card_fits) if r.mode in ("alone", NOOP) else "n/a",
            str(len(r.over_commit)) if r.mode in GAS_MODES else "n/a",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(rounds: Sequence[Round]) -> dict[str, float]:
    def median(mode: str, attribute: str) -> float:
        values = [getattr(r, attribute) for r in rounds if r.mode == mode]
        return statistics.median(values) if values else float("nan")

    gas_cpu = [r.gas_ms_per_pod() for r in rounds if r.mode == "gas"]
    alone, with_gas = median("alone", "pods_per_s"), median("gas", "pods_per_s")
    figures = {
        "alone_pods_per_s": alone,
        "gas_pods_per_s": with_gas,
        "throughput_ratio": with_gas / alone if alone else float("nan"),
        "alone_p99_s": median("alone", "p99_s"),
        "gas_p99_s": median("gas", "p99_s"),
        "p99_ratio": median("gas", "p99_s") / median("alone", "p99_s"),
        "gas_cpu_ms_per_pod": statistics.median(gas_cpu) if gas_cpu else float("nan"),
    }
    noop = [r for r in rounds if r.mode == NOOP]
    if noop:
        with_noop = median(NOOP, "pods_per_s")
        figures["noop_pods_per_s"] = with_noop
        figures["noop_p99_s"] = median(NOOP, "p99_s")
        figures["noop_cpu_ms_per_pod"] = statistics.median(r.gas_ms_per_pod() for r in noop)
        figures["noop_ratio"] = with_noop / alone if alone else float("nan")
        # Each gas round against the no-op round of its turn: a busy spell of the machine
        # weighs on both alike.
        gas_rounds = [r for r in rounds if r.mode == "gas"]
        pairs = [g.pods_per_s / n.pods_per_s for g, n in zip(gas_rounds, noop, strict=False)]
        figures["gas_noop_ratio"] = statistics.median(pairs) if pairs else float("nan")
    for mode in ("baseline", "prioritize"):
        cpu = [r.gas_ms_per_pod() for r in rounds if r.mode == mode]
        if cpu:
            figures[f"{mode}_pods_per_s"] = median(mode, "pods_per_s")
            figures[f"{mode}_p99_s"] = median(mode, "p99_s")
            figures[f"{mode}_cpu_ms_per_pod"] = statistics.median(cpu)
    return figures


def summary_table(figures: dict[str, float]) -> list[str]:
    lines = [
        "| measure | median | goal |",
        "|---|---:|---:|",
        f"| pods/s, kube-scheduler alone | {fmt(figures['alone_pods_per_s'], 0)} | |",
        f"| pods/s, kube-scheduler + gas | {fmt(figures['gas_pods_per_s'], 0)} | |",
        f"| gas / alone, pods/s | {fmt(figures['throughput_ratio'], 2)} | >= 0.70 |",
        f"| p99 create -> bound, gas / alone | {fmt(figures['p99_ratio'], 2)} | <= 1.5 |",
        f"| gas CPU ms per bound pod | {fmt(figures['gas_cpu_ms_per_pod'], 2)} | <= 1.2 |",
    ]
    if "noop_pods_per_s" in figures:
        lines += [
            f"| pods/s, {SETUPS[NOOP]} | {fmt(figures['noop_pods_per_s'], 0)} | |",
            f"| no-op / alone, pods/s | {fmt(figures['noop_ratio'], 2)} | |",
            f"| gas / no-op, pods/s (median of the rounds' pairs) "
            f"| {fmt(figures['gas_noop_ratio'], 2)} | >= 0.95 |",
            f"| no-op CPU ms per bound pod | {fmt(figures['noop_cpu_ms_per_pod'], 2)} | |",
        ]
    for mode in ("baseline", "prioritize"):
        if f"{mode}_pods_per_s" in figures:
            lines += [
                f"| pods/s, {SETUPS[mode]} | {fmt(figures[f'{mode}_pods_per_s'], 0)} | |",
                f"| p99 s, {SETUPS[mode]} | {fmt(figures[f'{mode}_p99_s'], 2)} | |",
                f"| gas CPU ms per bound pod, {SETUPS[mode]} | "
                f"{fmt(figures[f'{mode}_cpu_ms_per_pod'], 2)} | |",
            ]
    return lines


# ---------------------------------------------------------------- main


def run_rounds(
    args: argparse.Namespace, cluster: Cluster, modes: Sequence[str], workdir: Path
) -> list[Round]:
    """The plane with `cluster`, then `args.rounds` rounds of each of `modes` in turn."""
    rounds: list[Round] = []
    plane = realk8s.ControlPlane(
        workdir,
        version=args.kubernetes,
        apiserver_args=[
            # No kubelet lifts the not-ready taint this admission puts on a new node.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--max-requests-inflight=2000",
            "--max-mutating-requests-inflight=1000",
        ],
    )
    with plane:
        plane.prepare_namespace(NAMESPACE)
        api = Api(plane)
        began = time.monotonic()
        create_all(api, "/api/v1/nodes", [node_for_api(n) for n in cluster.nodes], CREATORS)
        create_all(
            api,
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            [running_for_api(p) for p in cluster.pods],
            CREATORS,
        )
        print(
            f"{args.nodes:,} nodes ({cluster.cards:,} cards), {len(cluster.pods):,} running pods "
            f"created in {time.monotonic() - began:.1f} s; bursts of {args.pods:,} pods "
            f"({', '.join(s.name for s in SHAPES)}), {args.rounds} round(s) per setup\n",
            flush=True,
        )
        bench = Bench(
            plane,
            workdir,
            cluster.nodes,
            cluster.pods,
            args.pods,
            args.settle,
            args.gasArgs.split(),
            Path(args.profile) if args.profile else None,
            args.baseline,
            Path(args.perf) if args.perf else None,
            Path(args.cpu_profile) if args.cpu_profile else None,
        )
        for _ in range(args.rounds):
            for mode in modes:
                result = bench.run(mode)
                rounds.append(result)
                print(
                    f"{result.name}: {result.bound}/{result.pods} bound, "
                    f"{fmt(result.pods_per_s, 0)} pods/s, p50 {fmt(result.p50_s, 2)} s, "
                    f"p99 {fmt(result.p99_s, 2)} s, gas {fmt(result.gas_ms_per_pod(), 2)} ms/pod"
                    + "".join(
                        f", {verb} {n / max(1, result.bound):.2f}/pod"
                        for verb, n in sorted(result.requests.items())
                    )
                    + (
                        f", {result.connections:.0f} new connections"
                        if not math.isnan(result.connections)
                        else ""
                    ),
                    flush=True,
                )
    return rounds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.endtoend", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000, help="pods in each round's burst")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each setup")
    parser.add_argument(
        "--occupancy", type=float, default=0.5, help="share of GPU memory held before a burst"
    )
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds without a bind that end a round"
    )
    parser.add_argument("--only", choices=("alone", NOOP, "gas"), help="run one setup only")
    parser.add_argument(
        "--no-noop",
        dest="noop",
        action="store_false",
        help="leave out the no-op extender's rounds (run when ../shared/tools/noopext is there)",
    )
    parser.add_argument(
        "--prioritize",
        action="store_true",
        help="also run gas registered with its prioritize verb too (binpack and spread need "
        "it; the shipped configurations leave it out)",
    )
    parser.add_argument(
        "--baseline",
        help="also run gas from this source tree (e.g. a `git archive` of an earlier commit), "
        "alternated with this one's",
    )
    parser.add_argument("--gasArgs", default="", help="extra `gas serve` flags (one string)")
    parser.add_argument(
        "--profile", help="directory for py-spy stacks of gas over each burst (py-spy on PATH)"
    )
    parser.add_argument(
        "--cpu-profile",
        help="directory for a CPU-clock profile of gas's worker by function over each burst "
        "(yappi; benchmarks/cpuprofile)",
    )
    parser.add_argument(
        "--perf",
        help="directory for `perf record -g` of kube-scheduler, kube-apiserver and gas's worker "
        "over each burst (perf on PATH)",
    )
    parser.add_argument(
        "--kubernetes",
        choices=realk8s.VERSIONS,
        default=realk8s.NEWEST,
        help="the real binaries' version (default: %(default)s)",
    )
    parser.add_argument("--keep", help="working directory to keep (logs), else a temporary one")
    parser.add_argument("--quick", action="store_true", help="smoke size: 20 nodes, 30 pods")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.quick:
        # A long settle costs nothing when every pod binds at once; on a machine busy with
        # other work kube-scheduler alone once bound 3 of 30 pods and then none for 5 s.
        args.nodes, args.pods, args.rounds, args.settle = 20, 30, 1, 15.0
    reason = realk8s.missing(args.kubernetes)
    if reason is not None:
        print(f"skipped: {reason}")
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": reason}))
        return 0

    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gas-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = make_cluster(args.nodes, args.occupancy)
    modes = [args.only] if args.only else ["alone", "gas"]
    if not args.only and args.noop:
        reason = noopext.missing()
        if reason is None:
            modes.insert(1, NOOP)
        else:
            print(f"no no-op extender rounds: {reason}")
    if args.baseline:
        modes.append("baseline")
    if args.prioritize:
        modes.append("prioritize")
    try:
        rounds = run_rounds(args, cluster, modes, workdir)
    except BaseException:
        shutil.rmtree(workdir / "etcd", ignore_errors=True)
        print(f"failed; the processes' logs are in {workdir}", file=sys.stderr)
        raise
    figures = summary(rounds)
    print()
    print("\n".join(rounds_table(rounds)))
    print()
    print("\n".join(summary_table(figures)))
    for r in rounds:
        for problem in r.over_commit[:10]:
            print(f"{r.name}: {problem}")
    if args.keep:
        print(f"\nlogs: {workdir}")
    if args.json:
        record = {
            "kubernetes": args.kubernetes,
            "nodes": args.nodes,
            "cards": cluster.cards,
            "running_pods": len(cluster.pods),
            "pods": args.pods,
            "rounds": [r.record() for r in rounds],
            "summary": figures,
        }
        Path(args.json).write_text(json.dumps(record, indent=2))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
