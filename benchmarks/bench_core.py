"""Figures for the pure core: allocator calls per second and ledger filter latency.

A filter is timed as the extender asks it, `Ledger.judge_names` over every node: the names
that pass and the reason for each of the others. Three workloads, each at 100, 1,000 and
5,000 nodes, half and nine tenths full:

- same shape: one pod shape asked again and again about the same nodes, nothing changing
  (the last answers are given again);
- 64 shapes: pod shapes in turn, more than the ledger keeps answers for, so every filter
  is for a shape it has no answers for (a real queue has many shapes);
- churn: the 64 shapes, each filter followed by a reserve and commit on a node the pod
  fits and an earlier pod released, so every filter sees nodes that changed.

Prints numbers; never fails on time. Run: .venv/bin/python -m benchmarks.bench_core
(`--quick` for fewer rounds, `--sizes 100,1000` for other node counts).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import deque
from collections.abc import Callable

from gas.core.allocator import Rejection, place
from gas.core.ledger import Ledger
from gas.core.model import NodeGpu, PodRequest, pod_request

MEM = "gpu.intel.com/memory.max"
I915 = "gpu.intel.com/i915"
MILLI = "gpu.intel.com/millicores"
G = 2**30


def make_node(name: str, cards: int) -> NodeGpu:
    return NodeGpu(
        name=name,
        cards=tuple(f"card{i}" for i in range(cards)),
        capacity={I915: 8, MEM: 16 * G, MILLI: 1000},
    )


def pod(gpus: int, mem_g: int, uid: str, millicores: int = 0) -> dict[str, object]:
    limits = {I915: str(gpus), MEM: f"{mem_g * gpus}Gi"}
    if millicores:
        limits[MILLI] = str(millicores * gpus)
    return {
        "metadata": {"name": uid, "namespace": "bench", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


SHAPES = [
    pod_request(pod(gpus, mem, f"shape-{gpus}-{mem}-{milli}", milli))
    for gpus in (1, 2, 3, 4)
    for mem in (1, 2, 4, 6, 8, 12, 14, 16)
    for milli in (0, 300)
]
"""64 pod shapes: one container, 1 to 4 cards, memory and millicores per card."""


def bench_allocator(calls: int = 50_000) -> float:
    node = make_node("n", 8)
    usage = {f"card{i}": {I915: 4, MEM: 10 * G} for i in range(6)}
    request = pod_request(pod(2, 4, "p"))
    start = time.perf_counter()
    for _ in range(calls):
        place(node, usage, request)
    return calls / (time.perf_counter() - start)


def filled_ledger(nodes: int, occupancy: float, seed: int = 1) -> tuple[Ledger, list[str]]:
    """Nodes of 4 or 8 cards with pods of 1 or 2 cards and 2 to 8 GiB per card, until
    `occupancy` of the cluster's GPU memory is held."""
    rng = random.Random(seed)
    ledger = Ledger()
    ledger.replace_nodes(make_node(f"node-{i}", rng.choice((4, 8))) for i in range(nodes))
    names = ledger.node_names()
    total = sum(len(n.cards) for n in map(ledger.node, names) if n is not None) * 16
    held = 0
    count = 0
    fills = [pod_request(pod(g, m, "fill", c)) for g in (1, 2) for m in (2, 4, 8) for c in (0, 200)]
    misses = 0
    while held < total * occupancy and misses < 10_000:
        uid = f"fill-{count}"
        request = rng.choice(fills)
        result = ledger.reserve_placement(uid, "bench", uid, request, rng.choice(names))
        if isinstance(result, Rejection):
            misses += 1
            continue
        ledger.commit(uid)
        count += 1
        need = request.containers[0]
        held += need.requests[MEM] // G
    return ledger, names


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.99) - 1)]


def timed(rounds: int, step: Callable[[int], object]) -> tuple[float, float]:
    samples = []
    for index in range(rounds):
        start = time.perf_counter()
        step(index)
        samples.append((time.perf_counter() - start) * 1000)
    return percentiles(samples)


def bench_filter(nodes: int, occupancy: float, rounds: int = 50) -> tuple[float, float]:
    """Filter p50 and p99 (ms) for one pod shape asked again and again."""
    ledger, names = filled_ledger(nodes, occupancy)
    request = pod_request(pod(1, 6, "probe"))
    ledger.judge_names(request, names)  # the answers the later filters find
    return timed(rounds, lambda _: ledger.judge_names(request, names))


def bench_shapes(nodes: int, occupancy: float, rounds: int) -> tuple[float, float]:
    ledger, names = filled_ledger(nodes, occupancy)
    return timed(rounds, lambda i: ledger.judge_names(SHAPES[i % len(SHAPES)], names))


def bench_churn(nodes: int, occupancy: float, rounds: int) -> tuple[float, float]:
    """Each filter timed alone; between filters a bind on a node it passed, and the
    oldest of those binds released, so occupancy stays put and nodes keep changing."""
    ledger, names = filled_ledger(nodes, occupancy)
    rng = random.Random(2)
    bound: deque[str] = deque()
    samples = []
    for index in range(rounds):
        request: PodRequest = SHAPES[index % len(SHAPES)]
        start = time.perf_counter()
        passed = ledger.judge_names(request, names).passed
        samples.append((time.perf_counter() - start) * 1000)
        if passed:
            uid = f"churn-{index}"
            placed = ledger.reserve_placement(uid, "bench", uid, request, rng.choice(passed))
            if not isinstance(placed, Rejection):
                ledger.commit(uid)
                bound.append(uid)
        if len(bound) > 8:
            ledger.forget(bound.popleft())
    return percentiles(samples)


WORKLOADS = {"same shape": bench_filter, "64 shapes": bench_shapes, "churn": bench_churn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--sizes", default="100,1000,5000", help="node counts, comma-separated")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"allocator: {bench_allocator():,.0f} calls/s (8-card node, 2-GPU container)")
    print(f"{'workload':>10} {'nodes':>6} {'occupancy':>9} {'p50 ms':>9} {'p99 ms':>9}")
    for workload, bench in WORKLOADS.items():
        for nodes in sizes:
            for occupancy in (0.5, 0.9):
                rounds = 128 if nodes < 5000 else 64
                p50, p99 = bench(nodes, occupancy, rounds // 4 if args.quick else rounds)
                print(f"{workload:>10} {nodes:>6} {occupancy:>9.0%} {p50:>9.3f} {p99:>9.3f}")


if __name__ == "__main__":
    main()
