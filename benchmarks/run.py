"""The benchmark runner: gas measured through real HTTPS and gunicorn, and its core alone.

    .venv/bin/python -m benchmarks.run            # the full set (several minutes)
    .venv/bin/python -m benchmarks.run --quick    # a small smoke size (seconds)
    .venv/bin/python -m benchmarks.run --sizes 1000 --occupancy 0.9 --rounds 500

For each cluster size and occupancy it writes a demo-cluster file (nodes of 4 to 8 cards,
running pods carrying `gas-container-cards`), starts `gas serve --demo --demoFile` with a
throwaway CA and mutual TLS, and drives it as kube-scheduler does: one filter at a time
(`NodeNames` mode, every node a candidate), each followed by an asynchronous bind to a node
that passed, several binds in flight at once. The demo cluster's bind writes in memory, so
bind latency is gas's own work without the API write. Latencies are measured at the client,
from sending the request to having read the whole reply.

Then: a burst of concurrent binds (bind throughput), a few filters with whole Node objects
(`Nodes` mode), the gas worker's resident memory, the ledger rebuilt from 50,000 pods in a
fresh process (time and peak memory), allocator calls per second, and `Ledger.check`
in-process. Prints figures as Markdown tables; never fails on time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import random
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.workload import (
    SHAPES,
    Cluster,
    Shape,
    make_cluster,
    memory_share,
    node_object,
    pick_shape,
    pod_object,
)
from tests.support.gasproc import GasProcess, TLSFiles, child_pids, make_tls_files

BIND_CONCURRENCY = 4
"""Binds in flight at once, as kube-scheduler's binding goroutines."""


# ---------------------------------------------------------------- statistics


def percentile(samples: Sequence[float], share: float) -> float:
    """Nearest-rank percentile (`share` in 0..1) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(share * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Latencies:
    seconds: list[float] = field(default_factory=list)
    wall: float = 0.0

    def add(self, value: float) -> None:
        self.seconds.append(value)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.seconds) * 1000 if self.seconds else float("nan")

    @property
    def p99_ms(self) -> float:
        return percentile(self.seconds, 0.99) * 1000 if self.seconds else float("nan")

    @property
    def rps(self) -> float:
        return len(self.seconds) / self.wall if self.wall > 0 else float("nan")


# ---------------------------------------------------------------- HTTPS client


class Client:
    """One kept-alive HTTPS connection with a client certificate (not thread-safe)."""

    def __init__(self, port: int, tls: TLSFiles) -> None:
        context = ssl.create_default_context(cafile=tls.ca)
        context.load_cert_chain(tls.client_cert, tls.client_key)
        self._connection = http.client.HTTPSConnection(
            "127.0.0.1", port, context=context, timeout=120
        )

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            self._connection.request(method, path, body=body, headers=headers)
            response = self._connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self._connection.close()  # reconnects on the next request
            raise

    def timed_post(self, path: str, body: bytes) -> tuple[float, int, bytes]:
        start = time.perf_counter()
        status, data = self.request("POST", path, body)
        return time.perf_counter() - start, status, data

    def close(self) -> None:
        self._connection.close()


# ---------------------------------------------------------------- gas serve


def _proc_status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _kib(value: str) -> int:
    return int(value.split()[0]) if value else 0


@dataclass
class GasServer:
    gas: GasProcess
    startup_seconds: float

    @property
    def port(self) -> int:
        return self.gas.port

    def worker_memory_mib(self) -> tuple[float, float]:
        """(current, peak) resident memory of the gunicorn worker, MiB."""
        for child in child_pids(self.gas.process.pid):
            status = _proc_status(child)
            if status:
                return _kib(status.get("VmRSS", "")) / 1024, _kib(status.get("VmHWM", "")) / 1024
        return float("nan"), float("nan")


@contextmanager
def gas_server(
    cluster: Cluster | None,
    directory: Path,
    tls: TLSFiles,
    threads: int = 8,
    kubeconfig: str | None = None,
) -> Iterator[GasServer]:
    """`gas serve` on the demo cluster `cluster`, or on the API server of `kubeconfig`."""
    if cluster is not None:
        demo_file = directory / "cluster.json"
        demo_file.write_text(json.dumps(cluster.as_demo_file(), separators=(",", ":")))
        source = ["--demo", "--demoFile", str(demo_file)]
    else:
        source = ["--kubeConfig", str(kubeconfig)]
    started = time.perf_counter()
    gas = GasProcess([*source, "--threads", str(threads)], directory / "gas.log", tls)
    try:
        gas.wait_ready(timeout=300)
        yield GasServer(gas, time.perf_counter() - started)
    finally:
        gas.stop(signal.SIGTERM)


# ---------------------------------------------------------------- one scenario


@dataclass
class ScenarioResult:
    nodes: int
    occupancy: float
    cards: int
    pods: int
    filter: Latencies
    new_shape: Latencies
    bind: Latencies
    bind_alone: Latencies
    bind_burst: Latencies
    nodes_mode: Latencies
    passed_share: float
    bind_errors: int
    rss_mib: float
    peak_rss_mib: float
    startup_seconds: float


_bind_client: Client | None = None


def _bind_worker_start(port: int, tls: TLSFiles) -> None:
    global _bind_client
    _bind_client = Client(port, tls)
    # Connected (TLS handshake done) before the first timed bind, as kube-scheduler's
    # kept-alive connections are.
    _bind_client.request("GET", "/healthz")


def _bind_in_worker(body: bytes) -> tuple[float, str]:
    assert _bind_client is not None
    seconds, status, data = _bind_client.timed_post("/scheduler/bind", body)
    error: str = json.loads(data).get("Error", "") if status == 200 else data.decode()
    return seconds, error


class _Binder:
    """kube-scheduler's binding cycle: binds run concurrently with the next filters.

    Binds are sent from worker processes: kube-scheduler's goroutines do not share an
    interpreter lock with its filter calls, and client threads here would (a filter's
    reply could wait on a bind thread's Python work and be measured slower)."""

    def __init__(self, port: int, tls: TLSFiles, concurrency: int) -> None:
        self._pool = ProcessPoolExecutor(
            concurrency,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_bind_worker_start,
            initargs=(port, tls),
        )
        # Every worker started and connected before anything is timed.
        list(self._pool.map(time.sleep, [0.2] * concurrency))
        self._futures: list[Future[tuple[float, str]]] = []
        self.latencies = Latencies()
        self.errors: list[str] = []

    def submit(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        body = json.dumps(
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": node,
            }
        ).encode()
        self._futures.append(self._pool.submit(_bind_in_worker, body))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for future in self._futures:
            seconds, error = future.result()
            self.latencies.add(seconds)
            if error:
                self.errors.append(error)


def _filter_body(pod: dict[str, Any], names_json: bytes) -> bytes:
    return b'{"Pod":' + json.dumps(pod).encode() + b',"NodeNames":' + names_json + b"}"


def _check_reply(data: bytes, expected: int) -> list[str]:
    reply = json.loads(data)
    judged = len(reply["NodeNames"]) + len(reply["FailedNodes"])
    judged += len(reply["FailedAndUnresolvableNodes"])
    if judged != expected or reply.get("Error"):
        raise RuntimeError(f"malformed filter reply: {judged} of {expected} nodes judged")
    passed: list[str] = reply["NodeNames"]
    return passed


def run_scenario(
    nodes: int,
    occupancy: float,
    rounds: int,
    directory: Path,
    tls: TLSFiles,
    *,
    seed: int = 1,
    burst: int = 200,
    nodes_mode_rounds: int = 10,
    new_shape_rounds: int = 5,
) -> ScenarioResult:
    cluster = make_cluster(nodes, occupancy, seed)
    names = cluster.node_names
    names_json = json.dumps(names).encode()
    rng = random.Random(seed)
    serial = iter(range(10**9))

    def new_pod(shape: Shape | None = None) -> dict[str, Any]:
        n = next(serial)
        shape = shape or pick_shape(rng)
        return pod_object(f"new-{n}", f"uid-new-{nodes}-{occupancy}-{n}", shape)

    with gas_server(cluster, directory, tls) as server:
        client = Client(server.port, tls)
        binder = _Binder(server.port, tls, BIND_CONCURRENCY)
        filters = Latencies()
        passed_total = 0
        # The first pod of each shape is not measured here: gas then fits every node
        # afresh, where later pods of the shape reuse what did not change (new shapes
        # are measured apart, below).
        warmup = [*SHAPES, *(None for _ in range(5))]
        started = time.perf_counter()
        for index in range(len(warmup) + rounds):
            pod = new_pod(warmup[index] if index < len(warmup) else None)
            if index == len(warmup):
                started = time.perf_counter()
            seconds, status, data = client.timed_post(
                "/scheduler/filter", _filter_body(pod, names_json)
            )
            if status != 200:
                raise RuntimeError(f"filter answered {status}: {data[:300]!r}")
            passed = _check_reply(data, len(names))
            if index >= len(warmup):
                filters.add(seconds)
                passed_total += len(passed)
            if passed:
                binder.submit(pod, rng.choice(passed))
        filters.wall = time.perf_counter() - started
        binder.close()

        # Pods of shapes gas has not seen: every node is fitted afresh.
        new_shape = Latencies()
        for memory_gi in range(1, 1 + new_shape_rounds):
            shape = Shape("unseen", 1 + memory_gi % 2, 16 - memory_gi, 100 + memory_gi, 0)
            seconds, status, data = client.timed_post(
                "/scheduler/filter", _filter_body(new_pod(shape), names_json)
            )
            _check_reply(data, len(names))
            new_shape.add(seconds)

        def filtered(count: int) -> list[tuple[dict[str, Any], str]]:
            """Pods first seen by a filter of a few nodes, each with a node that fits."""
            pending = []
            for _ in range(count):
                pod = new_pod()
                sample = json.dumps(rng.sample(names, min(20, len(names)))).encode()
                _, _, data = client.timed_post("/scheduler/filter", _filter_body(pod, sample))
                passed = _check_reply(data, min(20, len(names)))
                if passed:
                    pending.append((pod, passed[0]))
            return pending

        # Binds one at a time, nothing else running: gas's own bind work.
        lone_binder = _Binder(server.port, tls, 1)
        for pod, node in filtered(burst):
            lone_binder.submit(pod, node)
        lone_binder.close()

        # Bind throughput: binds sent all at once, BIND_CONCURRENCY in flight.
        burst_binder = _Binder(server.port, tls, BIND_CONCURRENCY)
        pending = filtered(burst)
        started = time.perf_counter()
        for pod, node in pending:
            burst_binder.submit(pod, node)
        burst_binder.close()
        burst_binder.latencies.wall = time.perf_counter() - started

        nodes_mode = Latencies()
        if nodes_mode_rounds:
            items = [node_object(n["metadata"]["name"], len(_cards(n))) for n in cluster.nodes]
            node_list = json.dumps({"items": items}).encode()
            started = time.perf_counter()
            for _ in range(nodes_mode_rounds):
                body = b'{"Pod":' + json.dumps(new_pod()).encode() + b',"Nodes":' + node_list
                seconds, status, data = client.timed_post("/scheduler/filter", body + b"}")
                if status != 200:
                    raise RuntimeError(f"Nodes-mode filter answered {status}: {data[:300]!r}")
                nodes_mode.add(seconds)
            nodes_mode.wall = time.perf_counter() - started
        client.close()
        rss, peak = server.worker_memory_mib()
        startup = server.startup_seconds
    return ScenarioResult(
        nodes=nodes,
        occupancy=memory_share(cluster),
        cards=cluster.cards,
        pods=len(cluster.pods),
        filter=filters,
        new_shape=new_shape,
        bind=binder.latencies,
        bind_alone=lone_binder.latencies,
        bind_burst=burst_binder.latencies,
        nodes_mode=nodes_mode,
        passed_share=passed_total / max(1, rounds * len(names)),
        bind_errors=len(binder.errors) + len(lone_binder.errors) + len(burst_binder.errors),
        rss_mib=rss,
        peak_rss_mib=peak,
        startup_seconds=startup,
    )


def _cards(node: dict[str, Any]) -> list[str]:
    value: str = node["metadata"]["labels"]["gpu.intel.com/gpu-numbers"]
    return value.split(".")


# ---------------------------------------------------------------- memory against an API server


def production_memory(
    nodes: int, pods: int, directory: Path, tls: TLSFiles, seed: int = 1
) -> dict[str, float]:
    """gas as deployed: list+watch from an API server (the test suite's double, in this
    process), so the worker holds only what gas itself keeps of the pods. Its resident
    memory once synced, and the time from start to ready (list, rebuild, serve)."""
    from tests.support.apiserver import ApiServerDouble

    cluster = make_cluster(nodes, 0.9, seed, max_pods=pods)
    with ApiServerDouble() as api:
        for node in cluster.nodes:
            api.add_node(node)
        for pod in cluster.pods:
            api.add_pod(pod)
        count = len(cluster.pods)
        del cluster
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        with gas_server(None, directory, tls, kubeconfig=kubeconfig) as server:
            rss, peak = server.worker_memory_mib()
            startup = server.startup_seconds
    return {"nodes": nodes, "pods": count, "rss_mib": rss, "peak_mib": peak, "ready_s": startup}


# ---------------------------------------------------------------- rebuild, in a fresh process


def rebuild_figures(nodes: int, pods: int, seed: int = 1) -> dict[str, float]:
    """Run `benchmarks.rebuild` in a fresh interpreter so its peak memory is its own."""
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.rebuild", str(nodes), str(pods), str(seed)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return figures


# ---------------------------------------------------------------- report


def _fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"


def scenario_table(results: Sequence[ScenarioResult]) -> list[str]:
    lines = [
        "| nodes | cards | pods | occupancy | filter p50 ms | filter p99 ms | filter/s "
        "| new-shape filter ms | bind p50 ms | bind p99 ms | lone bind p50 ms "
        "| lone bind p99 ms | bind/s | Nodes-mode filter p50 ms | gas RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.nodes:,} | {r.cards:,} | {r.pods:,} | {r.occupancy:.0%} "
            f"| {_fmt(r.filter.p50_ms, 2)} | {_fmt(r.filter.p99_ms, 2)} | {_fmt(r.filter.rps, 0)} "
            f"| {_fmt(r.new_shape.p50_ms, 1)} "
            f"| {_fmt(r.bind.p50_ms, 2)} | {_fmt(r.bind.p99_ms, 2)} "
            f"| {_fmt(r.bind_alone.p50_ms, 2)} | {_fmt(r.bind_alone.p99_ms, 2)} "
            f"| {_fmt(r.bind_burst.rps, 0)} | {_fmt(r.nodes_mode.p50_ms, 1)} "
            f"| {_fmt(r.rss_mib, 0)} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke size, in seconds")
    parser.add_argument("--sizes", help="node counts, comma-separated (100,1000,5000)")
    parser.add_argument("--occupancy", help="occupancies, comma-separated (0.5,0.9)")
    parser.add_argument("--rounds", type=int, help="measured filters per scenario (300)")
    parser.add_argument("--burst", type=int, help="binds in the throughput burst (300)")
    parser.add_argument(
        "--nodes-mode-rounds", type=int, help="filters with whole Node objects (10)"
    )
    parser.add_argument("--rebuild-nodes", type=int, help="nodes for the rebuild (5000)")
    parser.add_argument("--rebuild-pods", type=int, help="pods for the rebuild (50000)")
    parser.add_argument("--allocator-calls", type=int, help="allocator calls timed (50000)")
    parser.add_argument("--skip-http", action="store_true", help="in-process figures only")
    parser.add_argument("--core", action="store_true", help="also time Ledger.check in-process")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    quick = args.quick
    sizes = _ints(args.sizes) or ([50] if quick else [100, 1000, 5000])
    occupancies = _floats(args.occupancy) or ([0.5] if quick else [0.5, 0.9])
    rounds = args.rounds or (20 if quick else 300)
    burst = args.burst if args.burst is not None else (20 if quick else 300)
    nodes_rounds = args.nodes_mode_rounds
    if nodes_rounds is None:
        nodes_rounds = 3 if quick else 10
    rebuild_nodes = args.rebuild_nodes or (200 if quick else 5000)
    rebuild_pods = args.rebuild_pods or (2000 if quick else 50_000)
    allocator_calls = args.allocator_calls or (2000 if quick else 50_000)

    print(
        f"gas benchmarks: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.machine()}",
        flush=True,
    )
    report: dict[str, Any] = {}
    if not args.skip_http:
        results = []
        with tempfile.TemporaryDirectory(prefix="gas-bench-") as tmp:
            tls = make_tls_files(Path(tmp))
            for nodes in sizes:
                for occupancy in occupancies:
                    directory = Path(tmp) / f"{nodes}-{occupancy}"
                    directory.mkdir()
                    result = run_scenario(
                        nodes,
                        occupancy,
                        rounds,
                        directory,
                        tls,
                        seed=args.seed,
                        burst=burst,
                        nodes_mode_rounds=nodes_rounds,
                    )
                    results.append(result)
                    print(
                        f"  {nodes} nodes at {occupancy:.0%}: gas ready in "
                        f"{result.startup_seconds:.1f} s, {result.passed_share:.0%} of nodes "
                        f"passed, {result.bind_errors} bind errors, peak RSS "
                        f"{_fmt(result.peak_rss_mib, 0)} MiB",
                        flush=True,
                    )
        print()
        print(
            f"Filter (NodeNames mode, every node a candidate) and bind over HTTPS with mutual "
            f"TLS, one gunicorn worker, demo cluster; {rounds} filters, each followed by an "
            f"asynchronous bind ({BIND_CONCURRENCY} in flight at most). New-shape filter: a "
            f"pod shape gas has not seen. Lone bind: {burst} binds one at a time; bind/s: "
            f"{burst} binds at once. gas RSS includes the demo cluster's own pod store."
        )
        print()
        print("\n".join(scenario_table(results)))
        report["scenarios"] = [_scenario_json(r) for r in results]

        print()
        with tempfile.TemporaryDirectory(prefix="gas-bench-") as tmp:
            memory = production_memory(
                rebuild_nodes, rebuild_pods, Path(tmp), make_tls_files(Path(tmp)), args.seed
            )
        report["production_memory"] = memory
        print(
            "gas against an API server (list+watch of the test suite's API-server double), "
            "synced and idle:"
        )
        print()
        print("| nodes | pods | ready s | gas RSS MiB | gas peak RSS MiB |")
        print("|---:|---:|---:|---:|---:|")
        print(
            f"| {int(memory['nodes']):,} | {int(memory['pods']):,} | {memory['ready_s']:.1f} "
            f"| {memory['rss_mib']:.0f} | {memory['peak_mib']:.0f} |"
        )

    print()
    rebuild = rebuild_figures(rebuild_nodes, rebuild_pods, args.seed)
    report["rebuild"] = rebuild
    print(
        f"Ledger rebuild from {int(rebuild['pods']):,} running pods on "
        f"{int(rebuild['nodes']):,} nodes (fresh process):"
    )
    print()
    print("| observe_pod s | replace_pods s | total s | ledger MiB | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {rebuild['observe_s']:.2f} | {rebuild['replace_s']:.2f} "
        f"| {rebuild['observe_s'] + rebuild['replace_s']:.2f} "
        f"| {rebuild['ledger_mib']:.0f} | {rebuild['peak_rss_mib']:.0f} |"
    )

    from benchmarks import bench_core

    print()
    allocator = bench_core.bench_allocator(allocator_calls)
    report["allocator_calls_per_s"] = allocator
    print(f"Allocator alone: {allocator:,.0f} calls/s (8-card node, 2-GPU container)")
    if args.core:
        print()
        print("| nodes | occupancy | Ledger.check p50 ms | Ledger.check p99 ms |")
        print("|---:|---:|---:|---:|")
        report["core"] = []
        for nodes in sizes:
            for occupancy in occupancies:
                p50, p99 = bench_core.bench_filter(nodes, occupancy, rounds=20)
                report["core"].append({"nodes": nodes, "occupancy": occupancy, "p50": p50})
                print(f"| {nodes:,} | {occupancy:.0%} | {p50:.2f} | {p99:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _scenario_json(r: ScenarioResult) -> dict[str, Any]:
    return {
        "nodes": r.nodes,
        "occupancy": r.occupancy,
        "pods": r.pods,
        "filter_p50_ms": r.filter.p50_ms,
        "filter_p99_ms": r.filter.p99_ms,
        "filter_rps": r.filter.rps,
        "new_shape_filter_p50_ms": r.new_shape.p50_ms,
        "bind_p50_ms": r.bind.p50_ms,
        "bind_p99_ms": r.bind.p99_ms,
        "lone_bind_p50_ms": r.bind_alone.p50_ms,
        "lone_bind_p99_ms": r.bind_alone.p99_ms,
        "bind_rps": r.bind_burst.rps,
        "nodes_mode_p50_ms": r.nodes_mode.p50_ms,
        "rss_mib": r.rss_mib,
        "peak_rss_mib": r.peak_rss_mib,
    }


def _ints(text: str | None) -> list[int]:
    return [int(part) for part in text.split(",")] if text else []


def _floats(text: str | None) -> list[float]:
    return [float(part) for part in text.split(",")] if text else []


if __name__ == "__main__":
    sys.exit(main())
