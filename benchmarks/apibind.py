"""Binds against an API server: `gas serve` list+watching the test suite's API-server double
(in this process), driven as kube-scheduler drives it, one request at a time.

Three windows, each measured at the client (what kube-scheduler waits for) and in gas's
worker (its CPU time, including the watch event each Binding causes and any Event gas
posts), and counted at the API server (the writes it received):

- interleaved: filter a pod, bind it, filter the next one;
- bind: pods filtered beforehand (gas keeps them), then bound one at a time;
- cold bind: pods gas has not filtered, so the bind first reads the pod from the API.

Every window ends once the API server has received nothing for a while, so writes gas
makes after answering (Events) are counted in the window that caused them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.filters import FilterDriver, InterleavedRun
from benchmarks.harness import (
    Client,
    CpuMeter,
    CpuWindow,
    Latencies,
    cpu_window,
    gas_server,
    timed_bind,
)
from benchmarks.workload import SHAPES, make_cluster, pick_shape, pod_object
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import TLSFiles

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
QUIET_SECONDS = 0.4
"""A window ends once the API server has received no write for this long."""
WARMUP = 5
"""Unmeasured filter+bind pairs first: the API connections opened, every path run once."""


@dataclass
class Writes:
    """Write requests the API server received, by what they wrote."""

    bindings: int = 0
    events: int = 0
    patches: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.bindings + self.events + self.patches + self.other

    def add(self, requests: Sequence[tuple[str, str]]) -> None:
        for method, path in requests:
            if method not in WRITES:
                continue
            if path.endswith("/binding"):
                self.bindings += 1
            elif "/events" in path:
                self.events += 1
            elif method == "PATCH":
                self.patches += 1
            else:
                self.other += 1

    def __add__(self, other: Writes) -> Writes:
        return Writes(
            self.bindings + other.bindings,
            self.events + other.events,
            self.patches + other.patches,
            self.other + other.other,
        )


@dataclass
class BindRun:
    bind: Latencies = field(default_factory=Latencies)
    cpu: CpuWindow = field(default_factory=CpuWindow)
    writes: Writes = field(default_factory=Writes)
    errors: list[str] = field(default_factory=list)


@dataclass
class ApiBindResult:
    nodes: int
    pods: int
    interleaved: InterleavedRun
    warm: BindRun
    cold: BindRun
    interleaved_writes: Writes
    startup_seconds: float

    @property
    def errors(self) -> int:
        return len(self.interleaved.errors) + len(self.warm.errors) + len(self.cold.errors)

    @property
    def bind_writes(self) -> Writes:
        """The writes of the two windows that hold binds alone."""
        return self.warm.writes + self.cold.writes

    def per_bind(self, count: int) -> float:
        """`count` writes per bind of the bind-alone windows."""
        binds = len(self.warm.bind.seconds) + len(self.cold.bind.seconds)
        return count / binds if binds else float("nan")


class _Quiet:
    """Waits until the API server has received no write for QUIET_SECONDS."""

    def __init__(self, api: ApiServerDouble) -> None:
        self._api = api

    def __call__(self) -> None:
        deadline = time.monotonic() + 30
        seen = -1
        while time.monotonic() < deadline:
            count = sum(1 for method, _ in self._api.requests if method in WRITES)
            if count == seen:
                return
            seen = count
            time.sleep(QUIET_SECONDS)


def _binds(
    client: Client,
    meter: CpuMeter,
    api: ApiServerDouble,
    targets: Sequence[tuple[dict[str, Any], str]],
    settle: Callable[[], None],
) -> BindRun:
    run = BindRun()
    settle()
    seen = len(api.requests)
    with cpu_window(meter, run.cpu) as window:
        for pod, node in targets:
            seconds, error = timed_bind(client, pod, node)
            run.bind.add(seconds)
            if error:
                run.errors.append(error)
        settle()
        window.requests = len(targets)
    run.writes.add(api.requests[seen:])
    return run


def run_api_binds(
    nodes: int,
    occupancy: float,
    binds: int,
    directory: Path,
    tls: TLSFiles,
    *,
    seed: int = 1,
) -> ApiBindResult:
    """`binds` binds in each window, against a cluster of `nodes` nodes at `occupancy`."""
    cluster = make_cluster(nodes, occupancy, seed)
    names = cluster.node_names
    rng = random.Random(seed)
    serial = iter(range(10**9))

    def pending(shape: Any) -> dict[str, Any]:
        n = next(serial)
        return pod_object(f"pending-{n}", f"uid-pending-{nodes}-{n}", shape)

    # The common mix where filters matter; the smallest size where only binds do, so that
    # the pods fit however full the cluster gets.
    interleaved_pods = [pending(pick_shape(rng)) for _ in range(WARMUP + binds)]
    warm_pods = [pending(SHAPES[0]) for _ in range(binds)]
    cold_pods = [pending(SHAPES[0]) for _ in range(binds)]
    with ApiServerDouble() as api:
        for node in cluster.nodes:
            api.add_node(node)
        for pod in [*cluster.pods, *interleaved_pods, *warm_pods, *cold_pods]:
            api.add_pod(pod)
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        settle = _Quiet(api)
        with gas_server(None, directory, tls, kubeconfig=kubeconfig) as server:
            meter = CpuMeter(server.worker_pid())
            client = Client(server.port, tls)
            driver = FilterDriver(client, names, meter, settle=settle)
            driver.interleaved(interleaved_pods[:WARMUP], rng)

            settle()
            seen = len(api.requests)
            interleaved = driver.interleaved(interleaved_pods[WARMUP:], rng)
            interleaved_writes = Writes()
            interleaved_writes.add(api.requests[seen:])

            # gas keeps these pods from their filters; the binds find them there.
            warm_targets = []
            for pod in warm_pods:
                _, passed = driver.filter(pod)
                if passed:
                    warm_targets.append((pod, rng.choice(passed)))
            warm = _binds(client, meter, api, warm_targets, settle)

            # A namesake with another UID is filtered to find a node, so gas has never
            # seen the pod that is then bound and must read it from the API.
            cold_targets = []
            for pod in cold_pods:
                twin = dict(
                    pod, metadata=dict(pod["metadata"], uid="twin-" + pod["metadata"]["uid"])
                )
                _, passed = driver.filter(twin)
                if passed:
                    cold_targets.append((pod, rng.choice(passed)))
            cold = _binds(client, meter, api, cold_targets, settle)
            client.close()
            startup = server.startup_seconds
    return ApiBindResult(
        nodes=nodes,
        pods=len(cluster.pods),
        interleaved=interleaved,
        warm=warm,
        cold=cold,
        interleaved_writes=interleaved_writes,
        startup_seconds=startup,
    )
