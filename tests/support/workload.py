"""A seeded, randomised cluster workload for the reliability tests.

`Workload.run(n)` performs `n` operations against the API-server double while a real gas
serves the kube-scheduler emulator: pod creations (1-3 containers, 1-2 GPUs each, varied
memory, millicores and tiles) scheduled asynchronously (several binds in flight, filters
during binds), retries of pods left pending, deletions, completions, graceful
terminations, node label and allocatable changes, node additions and deletions, and, per
`FaultMix`, API-server faults. After every operation the cluster-side invariants are
checked; every `ledger_every` operations (and at the end) the ledger too, after a bounded
wait for gas's watch to catch up. A failure names the seed and the step.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import requests

from gas.cluster.kube import BIND_TIMEOUT
from gas.tools.audit import check_invariants, in_flight
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.scheduler import Outcome, SchedulerEmulator

NAMESPACES = ("default", "team-a")
LISTS = r"^/api/v1/(pods|nodes)$"


@dataclass(frozen=True)
class FaultMix:
    """Probability per operation of each injected fault."""

    bind_timeout_after_write: float = 0.0  # the Binding lands, the reply outlasts gas's timeout
    bind_write_after_timeout: float = 0.0  # gas times out first, the Binding lands later
    slow_list_watch: float = 0.0  # gas's next lists/watches are slow (connections cut first)
    watch_drop: float = 0.0  # every connection cut (watches mid-stream, binds in flight)
    outage: float = 0.0  # the API server answers 503 to everything for a while


@dataclass
class Stats:
    operations: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    binds_ok: int = 0
    bind_errors: int = 0
    filter_errors: int = 0
    cluster_checks: int = 0
    ledger_checks: int = 0
    max_in_flight: int = 0
    violations: int = 0

    def summary(self) -> str:
        return (
            f"operations={self.operations} binds_ok={self.binds_ok} "
            f"bind_errors={self.bind_errors} filter_errors={self.filter_errors} "
            f"max_binds_in_flight={self.max_in_flight} cluster_checks={self.cluster_checks} "
            f"ledger_checks={self.ledger_checks} violations={self.violations} "
            f"ops={dict(sorted(self.ops.items()))} faults={dict(sorted(self.faults.items()))}"
        )


class InvariantViolation(AssertionError):
    pass


def cut_connections(api: ApiServerDouble) -> None:
    """Close every open connection to the double: watches mid-stream, requests mid-flight."""
    server = api._server
    assert server is not None
    server.close_all_connections()


class Workload:
    def __init__(
        self,
        api: ApiServerDouble,
        gas: GasProcess,
        scheduler: SchedulerEmulator,
        seed: int,
        *,
        faults: FaultMix | None = None,
        ledger_every: int = 1,
        max_pods: int = 70,
        settle_timeout: float = 30.0,
        slow_binds: float = 0.3,
    ) -> None:
        self.api = api
        self.gas = gas
        self.scheduler = scheduler
        self.seed = seed
        self.random = random.Random(seed)
        self.faults = faults or FaultMix()
        self.ledger_every = ledger_every
        self.max_pods = max_pods
        self.settle_timeout = settle_timeout
        self.slow_binds = slow_binds
        self.stats = Stats()
        self.step = 0
        self._count = 0
        self._nodes = 0
        self._base: dict[str, dict[str, Any]] = {}  # node name -> object as first added
        self._in_flight: dict[str, Future[Outcome]] = {}  # "ns/name" -> bind
        self._attempts: Counter[str] = Counter()
        self._late_write_next = False
        # "ns/name" -> the path of the Binding fault added for its scheduling: dropped once
        # the pod is no longer in flight, used or not (a pod that failed its filter is
        # never bound), or such rules would pile up and every refill would re-add them all.
        self._bind_rules: dict[str, str] = {}
        self._in_outage = False
        # Until then a Binding may land after its bind call ended: no node is shrunk or
        # deleted (a pod bound to a gone node is for the pod garbage collector, not gas).
        self._late_until = 0.0

    # ------------------------------------------------------------ set-up

    def add_nodes(self, count: int) -> None:
        for _ in range(count):
            self._add_node()

    def _add_node(self, name: str | None = None) -> str:
        if name is None:
            self._nodes += 1
            name = f"node-{self._nodes}"
        cards = self.random.choice((1, 2, 2, 4))
        numbers = ".".join(str(i) for i in range(cards))
        node = gpu_node(
            name,
            numbers,
            i915=str(2 * cards),
            memory_max=f"{8 * cards}Gi",
            millicores=str(1000 * cards),
            tiles=str(2 * cards),
        )
        self._base[name] = node
        self.api.put_node(node)
        return name

    # ------------------------------------------------------------ driving

    def run(self, operations: int, *, deadline: float | None = None) -> Stats:
        for _ in range(operations):
            if deadline is not None and time.monotonic() > deadline:
                break
            self.step += 1
            self._reap()
            self._one_operation()
            self.stats.operations += 1
            self.check_cluster()
            if self.step % self.ledger_every == 0:
                self.check_ledger()
        return self.stats

    def finish(self) -> None:
        """Let every bind end, place or remove every pending pod, and check that the ledger
        converges: no RESERVED or PENDING entry left, and equal to the annotations."""
        self.drain()
        for _ in range(3):
            for pod in self._pending_pods():
                self._schedule(pod)
            self.drain()
        for pod in self._pending_pods():
            self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.check_ledger(converged=True)

    def drain(self) -> None:
        for future in list(self._in_flight.values()):
            future.result(timeout=60)
        self._reap()

    def _reap(self) -> None:
        for key, future in list(self._in_flight.items()):
            if future.done():
                del self._in_flight[key]
                outcome = future.result()
                if outcome.bound:
                    self.stats.binds_ok += 1
                else:
                    self.stats.bind_errors += 1

    def _one_operation(self) -> None:
        self._maybe_fault()
        live = [p for p in self.api.list_pods() if not _terminal(p)]
        nodes_stable = time.monotonic() > self._late_until
        choices: list[tuple[str, int]] = [
            ("create", 30 if len(live) < self.max_pods else 2),
            ("retry", 12),
            ("delete", 8 if len(live) < self.max_pods else 25),
            ("complete", 10),
            ("terminate", 5),
            ("finish_termination", 5),
            ("touch_pod", 4),
            ("node_label", 3),
            ("node_grow", 2),
            ("node_restore", 1 if nodes_stable else 0),
            ("node_add", 1 if len(self._base) < 10 else 0),
            ("node_delete", 1 if len(self._base) > 3 and nodes_stable else 0),
            ("purge", 3),
        ]
        names = [name for name, _ in choices]
        weights = [weight for _, weight in choices]
        op = self.random.choices(names, weights)[0]
        self.stats.ops[op] += 1
        getattr(self, f"_op_{op}")()

    # ------------------------------------------------------------ operations

    def _op_create(self) -> None:
        self._count += 1
        containers = []
        for index in range(self.random.choice((1, 1, 1, 2, 2, 3))):
            gpus = self.random.choice((1, 1, 1, 2))
            limits = {"i915": str(gpus)}
            memory = self.random.choice((0, 1, 2, 3, 4, 6))
            if memory:
                limits["memory_max"] = f"{memory * gpus}Gi"
            millicores = self.random.choice((0, 100, 250, 500))
            if millicores:
                limits["millicores"] = str(millicores * gpus)
            if self.random.random() < 0.25:
                limits["tiles"] = str(gpus)
            containers.append(container(f"c{index}", **limits))
        namespace = self.random.choice(NAMESPACES)
        pod = self.api.add_pod(gpu_pod(f"p{self._count}", *containers, namespace=namespace))
        self._schedule(pod)

    def _op_retry(self) -> None:
        pending = self._pending_pods()
        if pending:
            self._schedule(self.random.choice(pending))

    def _op_delete(self) -> None:
        pods = self.api.list_pods()
        if pods:
            self._delete(self.random.choice(pods))

    def _op_complete(self) -> None:
        bound = [p for p in self._bound_pods() if not p["metadata"].get("deletionTimestamp")]
        if bound:
            pod = self.random.choice(bound)
            phase = self.random.choice(("Succeeded", "Failed"))
            self.api.set_pod_phase(pod["metadata"]["namespace"], pod["metadata"]["name"], phase)

    def _op_terminate(self) -> None:
        pods = [p for p in self.api.list_pods() if not p["metadata"].get("deletionTimestamp")]
        if pods:
            pod = self.random.choice(pods)
            self.api.mark_pod_terminating(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _op_finish_termination(self) -> None:
        for pod in self.api.list_pods():
            if pod["metadata"].get("deletionTimestamp") and self.random.random() < 0.5:
                self._delete(pod)

    def _op_touch_pod(self) -> None:
        bound = self._bound_pods()
        if bound:
            pod = self.random.choice(bound)
            patch = {"status": {"phase": "Running"}, "metadata": {"labels": {"t": str(self.step)}}}
            self.api.patch_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], patch)

    def _op_node_label(self) -> None:
        node = self.api.get_node(self.random.choice(sorted(self._base)))
        if node is not None:
            node["metadata"]["labels"]["example.com/step"] = str(self.step)
            self.api.put_node(node)

    def _op_node_grow(self) -> None:
        """More allocatable on a node (never less than what is held: no false overcommit)."""
        node = self.api.get_node(self.random.choice(sorted(self._base)))
        if node is not None:
            allocatable = node["status"]["allocatable"]
            memory = allocatable["gpu.intel.com/memory.max"]
            allocatable["gpu.intel.com/memory.max"] = f"{2 * int(memory[:-2])}Gi"
            self.api.put_node(node)

    def _op_node_restore(self) -> None:
        """Back to the node's first allocatable: only once no bind is in flight and the
        node's pods fit, as a device plugin shrinking a node is not gas's fault."""
        name = self.random.choice(sorted(self._base))
        self.drain()
        trial = [n for n in self.api.list_nodes() if n["metadata"]["name"] != name]
        if not check_invariants([*trial, self._base[name]], self.api.list_pods()):
            self.api.put_node(self._base[name])

    def _op_node_add(self) -> None:
        gone = [name for name in self._base if self.api.get_node(name) is None]
        self._add_node(gone[0] if gone and self.random.random() < 0.5 else None)

    def _op_node_delete(self) -> None:
        """A node drained and removed: its pods are deleted first (as the pod garbage
        collector would), with no bind in flight that could still land on it."""
        name = self.random.choice(sorted(self._base))
        self.drain()
        for pod in self.api.list_pods():
            if pod["spec"].get("nodeName") == name:
                self._delete(pod)
        self.api.delete_node(name)
        del self._base[name]

    def _op_purge(self) -> None:
        for pod in self.api.list_pods():
            if _terminal(pod) and self.random.random() < 0.7:
                self._delete(pod)

    # ------------------------------------------------------------ faults

    def _maybe_fault(self) -> None:
        mix, roll = self.faults, self.random.random
        faults = self.api.faults
        if roll() < mix.bind_timeout_after_write:
            self.stats.faults["bind_timeout_after_write"] += 1
            faults.add("POST", r"/binding$", ("after_write_delay", BIND_TIMEOUT[1] + 0.5))
        if roll() < mix.bind_write_after_timeout:
            self.stats.faults["bind_write_after_timeout"] += 1
            self._late_write_next = True  # for the next pod scheduled: see _schedule
        if roll() < mix.slow_list_watch:
            self.stats.faults["slow_list_watch"] += 1
            faults.add("GET", LISTS, ("delay", self.random.uniform(0.3, 1.5)), times=2)
            if roll() < 0.3:
                self.api.compact()  # the resumed watch gets 410 Gone: a slow relist
            cut_connections(self.api)
        if roll() < mix.watch_drop:
            self.stats.faults["watch_drop"] += 1
            faults.add("GET", LISTS, ("drop_watch", None), times=self.random.choice((1, 2)))
            cut_connections(self.api)
        # Not while one is on: the inner one would wait for gas to be ready again while
        # the outer outage still keeps the API server down.
        if roll() < mix.outage and not self._in_outage:
            self.stats.faults["outage"] += 1
            self._in_outage = True
            try:
                self._outage()
            finally:
                self._in_outage = False

    def _outage(self) -> None:
        """The API server down for a while (every request 503, connections cut): gas turns
        unready, the workload goes on, then the API server is back and gas resyncs."""
        # First match wins: the outage goes ahead of the rules already registered.
        self._refill_faults(first=("*", r"^/api", ("status", 503), None))
        cut_connections(self.api)
        self._wait_ready(503, "gas to turn unready in an API-server outage")
        for _ in range(self.random.randint(3, 10)):
            self.step += 1
            self._reap()
            self._one_operation()
            self.stats.operations += 1
            self.check_cluster()
        self._refill_faults(skip_first=True)
        self._wait_ready(200, "gas to turn ready again after the outage")

    def _refill_faults(
        self,
        first: tuple[str, str, tuple[str, float | None], int | None] | None = None,
        skip_first: bool = False,
    ) -> None:
        """Re-register the live fault rules (dropping used-up ones), optionally with a new
        rule first or without the current first one."""
        rules = self.api.faults.rules[1 if skip_first else 0 :]
        done = {k: path for k, path in self._bind_rules.items() if k not in self._in_flight}
        for key in done:
            del self._bind_rules[key]
        stale = set(done.values())
        kept = [r for r in rules if r.remaining != 0 and r.path_regex.pattern not in stale]
        self.api.faults.clear()
        if first is not None:
            self.api.faults.add(first[0], first[1], first[2], first[3])
        for rule in kept:
            self.api.faults.add(
                rule.method, rule.path_regex.pattern, (rule.action, rule.arg), rule.remaining
            )

    def _wait_ready(self, status: int, what: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                got = self.gas.session.get(self.gas.url + "/readyz", timeout=5).status_code
            except requests.RequestException:
                got = 0
            if got == status:
                return
            time.sleep(0.05)
        self._fail([f"timed out waiting for {what}"])

    # ------------------------------------------------------------ checks

    def check_cluster(self) -> None:
        self.stats.cluster_checks += 1
        nodes = self.api.list_nodes()
        pods = self._collect_orphans(nodes)
        problems = check_invariants(nodes, pods, require_annotations=True)
        if problems:
            self._fail(problems)

    def _collect_orphans(self, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Delete the pods bound to nodes that no longer exist, as Kubernetes' pod garbage
        collector does, and return the other pods. A bind whose node was deleted while
        gas's watch lagged behind (as kube-scheduler's cache can) lands on no GPU."""
        names = {n["metadata"]["name"] for n in nodes}
        kept = []
        for pod in self.api.list_pods():
            node = pod["spec"].get("nodeName")
            if node and node not in names:
                self._delete(pod)
                self.stats.ops["orphan_collected"] += 1
            else:
                kept.append(pod)
        return kept

    def check_ledger(self, converged: bool = False) -> None:
        """The ledger against the cluster, retried until the watch has caught up; with
        `converged`, also no RESERVED or PENDING entry may remain."""
        self.stats.ledger_checks += 1
        self._refill_faults()
        deadline = time.monotonic() + self.settle_timeout
        while True:
            nodes = self.api.list_nodes()
            pods = self._collect_orphans(nodes)
            ledger = self.ledger()
            problems = check_invariants(nodes, pods, ledger, require_annotations=True)
            if converged:
                problems += [f"left in flight: {line}" for line in in_flight(ledger)]
            if not problems:
                return
            if time.monotonic() > deadline:
                self._fail(problems)
            time.sleep(0.05)

    def ledger(self) -> dict[str, Any]:
        snapshot = self.gas.get_json("/debug/ledger")
        assert isinstance(snapshot, dict)
        return snapshot

    def _fail(self, problems: list[str]) -> None:
        self.stats.violations += len(problems)
        shown = "\n  ".join(problems[:20])
        raise InvariantViolation(
            f"seed {self.seed}, step {self.step}: {len(problems)} violation(s):\n  {shown}\n"
            f"{self.stats.summary()}"
        )

    # ------------------------------------------------------------ helpers

    def _bind_rule(self, key: str) -> str:
        namespace, name = key.split("/", 1)
        path = rf"/namespaces/{namespace}/pods/{name}/binding$"
        self._bind_rules[key] = path
        return path

    def _schedule(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if key in self._in_flight or pod["spec"].get("nodeName") or _terminal(pod):
            return
        if meta.get("deletionTimestamp"):
            return
        self._attempts[key] += 1
        if self._late_write_next:
            # gas gives up on the Binding before the API server writes it.
            self._late_write_next = False
            late = ("delay", BIND_TIMEOUT[1] + 0.5)
            self.api.faults.add("POST", self._bind_rule(key), late)
            self._late_until = time.monotonic() + BIND_TIMEOUT[1] + 30
        elif self.random.random() < self.slow_binds:
            # A slow Binding write: more binds in flight, more filters during binds.
            delay = ("delay", self.random.uniform(0.05, 0.4))
            self.api.faults.add("POST", self._bind_rule(key), delay)
        try:
            future = self.scheduler.schedule(meta["namespace"], meta["name"])
        except KeyError:
            return
        if future.done():
            outcome = future.result()
            if outcome.error.startswith("filter"):
                self.stats.filter_errors += 1
            return
        self._in_flight[key] = future
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self._in_flight))

    def _delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if self.api.get_pod(meta["namespace"], meta["name"]) is not None:
            self.api.delete_pod(meta["namespace"], meta["name"])

    def _pending_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.api.list_pods()
            if not p["spec"].get("nodeName")
            and not _terminal(p)
            and not p["metadata"].get("deletionTimestamp")
        ]

    def _bound_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.api.list_pods() if p["spec"].get("nodeName") and not _terminal(p)]


def _terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
