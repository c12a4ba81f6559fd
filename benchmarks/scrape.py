"""CPU of one `/metrics` scrape (`Metrics.exposition`) on the benchmark cluster.

`python -m benchmarks.scrape [NODES ...]` (default 1000 5000) prints, per cluster size, the
process CPU of the first scrape, of a second one with nothing changed, and of a scrape
after `--binds` pods were bound (reserved and committed) on as many random nodes. Prints
figures; never fails on time.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from benchmarks.workload import make_cluster
from gas.cluster.demo import DemoCluster
from gas.core.allocator import Rejection
from gas.core.ledger import Ledger
from gas.core.model import PodRequest
from gas.core.scoring import POD_SIZES, size_request
from gas.serving.metrics import Metrics


def _cpu_ms(metrics: Metrics) -> tuple[float, int]:
    started = time.process_time()
    text = metrics.exposition()
    return round((time.process_time() - started) * 1000, 1), len(text)


def _bind(ledger: Ledger, rng: random.Random, count: int) -> int:
    """Binds up to `count` quarter-card pods on random nodes; how many landed."""
    names = ledger.node_names()
    bound = 0
    for index in range(count):
        name = rng.choice(names)
        node = ledger.node(name)
        assert node is not None
        request: PodRequest = size_request(node, POD_SIZES[0])
        uid = f"bench-scrape-{index}"
        result = ledger.reserve_placement(uid, "default", uid, request, name)
        if not isinstance(result, Rejection):
            ledger.commit(uid)
            bound += 1
    return bound


def measure(nodes: int, binds: int) -> dict[str, object]:
    cluster = make_cluster(nodes, 0.5)
    ledger = Ledger()
    DemoCluster(ledger, cluster.as_demo_file()).start()
    metrics = Metrics()
    metrics.watch_ledger(ledger)
    first, size = _cpu_ms(metrics)
    unchanged, _ = _cpu_ms(metrics)
    bound = _bind(ledger, random.Random(nodes), binds)
    after, _ = _cpu_ms(metrics)
    return {
        "nodes": nodes,
        "bytes": size,
        "first_ms": first,
        "unchanged_ms": unchanged,
        "binds": bound,
        "after_binds_ms": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nodes", nargs="*", type=int, default=[1000, 5000])
    parser.add_argument("--binds", type=int, default=50)
    args = parser.parse_args()
    for nodes in args.nodes:
        print(json.dumps(measure(nodes, args.binds)), flush=True)


if __name__ == "__main__":
    main()
