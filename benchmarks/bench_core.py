"""Figures for the pure core: allocator calls per second and ledger filter latency.

Prints numbers; never fails on time. Run: .venv/bin/python -m benchmarks.bench_core
"""

from __future__ import annotations

import random
import statistics
import time

from gas.core.allocator import Rejection, place
from gas.core.ledger import Ledger
from gas.core.model import NodeGpu, pod_request

MEM = "gpu.intel.com/memory.max"
I915 = "gpu.intel.com/i915"
G = 2**30


def make_node(name: str, cards: int) -> NodeGpu:
    return NodeGpu(
        name=name,
        cards=tuple(f"card{i}" for i in range(cards)),
        capacity={I915: 8, MEM: 16 * G},
    )


def pod(gpus: int, mem_g: int, uid: str) -> dict[str, object]:
    limits = {I915: str(gpus), MEM: f"{mem_g * gpus}Gi"}
    return {
        "metadata": {"name": uid, "namespace": "bench", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def bench_allocator(calls: int = 50_000) -> float:
    node = make_node("n", 8)
    usage = {f"card{i}": {I915: 4, MEM: 10 * G} for i in range(6)}
    request = pod_request(pod(2, 4, "p"))
    start = time.perf_counter()
    for _ in range(calls):
        place(node, usage, request)
    return calls / (time.perf_counter() - start)


def bench_filter(nodes: int, occupancy: float, rounds: int = 50) -> tuple[float, float]:
    rng = random.Random(1)
    ledger = Ledger()
    ledger.replace_nodes(make_node(f"node-{i}", rng.choice((4, 8))) for i in range(nodes))
    names = ledger.node_names()
    placed = 0
    target = int(nodes * 6 * occupancy)
    while placed < target:
        uid = f"fill-{placed}"
        request = pod_request(pod(1, 8, uid))
        result = ledger.reserve_placement(uid, "bench", uid, request, rng.choice(names))
        if isinstance(result, Rejection):
            continue
        ledger.commit(uid)
        placed += 1
    request = pod_request(pod(1, 6, "probe"))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        ledger.check(request, names)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> None:
    print(f"allocator: {bench_allocator():,.0f} calls/s (8-card node, 2-GPU container)")
    print(f"{'nodes':>6} {'occupancy':>9} {'filter p50 ms':>14} {'filter p99 ms':>14}")
    for nodes in (100, 1000, 5000):
        for occupancy in (0.5, 0.9):
            p50, p99 = bench_filter(nodes, occupancy, rounds=20 if nodes == 5000 else 50)
            print(f"{nodes:>6} {occupancy:>9.0%} {p50:>14.2f} {p99:>14.2f}")


if __name__ == "__main__":
    main()
