"""One benchmark scenario on the demo cluster: `gas serve --demo` on a generated cluster,
driven over HTTPS as kube-scheduler drives it (see `benchmarks.run` for the whole set).

The demo cluster's bind writes in memory, so bind figures here are gas's own work without
the API write (`benchmarks.apibind` measures binds against an API server).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.filters import (
    FilterDriver,
    FilterRun,
    InterleavedRun,
    PodFactory,
    many_shape_pods,
    one_shape_pods,
)
from benchmarks.harness import (
    BIND_CONCURRENCY,
    Binder,
    Client,
    CpuMeter,
    CpuWindow,
    Latencies,
    check_reply,
    cpu_window,
    filter_body,
    gas_server,
)
from benchmarks.workload import (
    SHAPES,
    Shape,
    make_cluster,
    memory_share,
    node_object,
    pick_shape,
    pod_object,
    queue_shapes,
)
from tests.support.gasproc import TLSFiles

QUEUE_SHAPES = 64
"""Pod shapes the many-shape filter workload cycles through."""


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
    bind_alone_cpu: CpuWindow
    bind_burst: Latencies
    nodes_mode: Latencies
    one_shape: FilterRun
    many_shapes: FilterRun
    interleaved: InterleavedRun
    passed_share: float
    bind_errors: int
    rss_mib: float
    peak_rss_mib: float
    startup_seconds: float


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
    rng = random.Random(seed)
    serial = iter(range(10**9))

    def new_pod(shape: Shape | None = None) -> dict[str, Any]:
        n = next(serial)
        shape = shape or pick_shape(rng)
        return pod_object(f"new-{n}", f"uid-new-{nodes}-{occupancy}-{n}", shape)

    with gas_server(cluster, directory, tls) as server:
        client = Client(server.port, tls)
        filters, binder, passed_total = _filters_with_binds(
            client, server.port, tls, names, rounds, new_pod, rng
        )
        driver = FilterDriver(client, names, CpuMeter(server.worker_pid()))
        one_shape = driver.filters(one_shape_pods(new_pod, SHAPES[1], rounds))
        many_shapes = driver.filters(many_shape_pods(new_pod, queue_shapes(QUEUE_SHAPES), rounds))
        interleaved = driver.interleaved([new_pod() for _ in range(rounds)], rng)

        # Pods of shapes gas has not seen: every node is fitted afresh.
        new_shape = Latencies()
        for memory_gi in range(1, 1 + new_shape_rounds):
            shape = Shape("unseen", 1 + memory_gi % 2, 16 - memory_gi, 100 + memory_gi, 0)
            new_shape.add(driver.filter(new_pod(shape))[0])

        def filtered(count: int) -> list[tuple[dict[str, Any], str]]:
            """Pods first seen by a filter of a few nodes, each with a node that fits."""
            pending = []
            for _ in range(count):
                pod = new_pod()
                sample = json.dumps(rng.sample(names, min(20, len(names)))).encode()
                _, _, data = client.timed_post("/scheduler/filter", filter_body(pod, sample))
                passed = check_reply(data, min(20, len(names)))
                if passed:
                    pending.append((pod, passed[0]))
            return pending

        # Binds one at a time, nothing else running: gas's own bind work.
        lone_binder = Binder(server.port, tls, 1)
        lone_targets = filtered(burst)
        lone_cpu = CpuWindow()
        with cpu_window(driver.meter, lone_cpu) as window:
            for pod, node in lone_targets:
                lone_binder.submit(pod, node)
            lone_binder.close()
            window.requests = len(lone_targets)

        # Bind throughput: binds sent all at once, BIND_CONCURRENCY in flight.
        burst_binder = Binder(server.port, tls, BIND_CONCURRENCY)
        pending = filtered(burst)
        started = time.perf_counter()
        for pod, node in pending:
            burst_binder.submit(pod, node)
        burst_binder.close()
        burst_binder.latencies.wall = time.perf_counter() - started

        nodes_mode = _nodes_mode(client, cluster.nodes, nodes_mode_rounds, new_pod)
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
        bind_alone_cpu=lone_cpu,
        bind_burst=burst_binder.latencies,
        nodes_mode=nodes_mode,
        one_shape=one_shape,
        many_shapes=many_shapes,
        interleaved=interleaved,
        passed_share=passed_total / max(1, rounds * len(names)),
        bind_errors=len(binder.errors)
        + len(lone_binder.errors)
        + len(burst_binder.errors)
        + len(interleaved.errors),
        rss_mib=rss,
        peak_rss_mib=peak,
        startup_seconds=startup,
    )


def _filters_with_binds(
    client: Client,
    port: int,
    tls: TLSFiles,
    names: list[str],
    rounds: int,
    new_pod: PodFactory,
    rng: random.Random,
) -> tuple[Latencies, Binder, int]:
    """kube-scheduler's cycle: `rounds` filters of the common shapes, each followed by an
    asynchronous bind. The filters' latencies, the binder (closed) and the nodes passed."""
    names_json = json.dumps(names).encode()
    binder = Binder(port, tls, BIND_CONCURRENCY)
    filters = Latencies()
    passed_total = 0
    # The first pod of each shape is not measured here: gas then fits every node
    # afresh, where later pods of the shape reuse what did not change (new shapes
    # are measured apart).
    warmup = [*SHAPES, *(None for _ in range(5))]
    started = time.perf_counter()
    for index in range(len(warmup) + rounds):
        pod = new_pod(warmup[index] if index < len(warmup) else None)
        if index == len(warmup):
            started = time.perf_counter()
        seconds, status, data = client.timed_post("/scheduler/filter", filter_body(pod, names_json))
        if status != 200:
            raise RuntimeError(f"filter answered {status}: {data[:300]!r}")
        passed = check_reply(data, len(names))
        if index >= len(warmup):
            filters.add(seconds)
            passed_total += len(passed)
        if passed:
            binder.submit(pod, rng.choice(passed))
    filters.wall = time.perf_counter() - started
    binder.close()
    return filters, binder, passed_total


def _nodes_mode(
    client: Client, nodes: list[dict[str, Any]], rounds: int, new_pod: PodFactory
) -> Latencies:
    """Filters carrying whole Node objects (`nodeCacheCapable: false`)."""
    latencies = Latencies()
    if not rounds:
        return latencies
    items = [node_object(n["metadata"]["name"], len(_cards(n))) for n in nodes]
    node_list = json.dumps({"items": items}).encode()
    started = time.perf_counter()
    for _ in range(rounds):
        body = b'{"Pod":' + json.dumps(new_pod(None)).encode() + b',"Nodes":' + node_list
        seconds, status, data = client.timed_post("/scheduler/filter", body + b"}")
        if status != 200:
            raise RuntimeError(f"Nodes-mode filter answered {status}: {data[:300]!r}")
        latencies.add(seconds)
    latencies.wall = time.perf_counter() - started
    return latencies


def _cards(node: dict[str, Any]) -> list[str]:
    value: str = node["metadata"]["labels"]["gpu.intel.com/gpu-numbers"]
    return value.split(".")
