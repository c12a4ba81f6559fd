"""CPU of one `/metrics` scrape (`Metrics.exposition`) on the benchmark cluster.

`python -m benchmarks.scrape [NODES ...]` (default 1000 5000) prints, per cluster size, the
process CPU of the first scrape, of a second one with nothing changed, and of a scrape
after `--binds` pods were bound (reserved and committed) on as many random nodes; the last
two are the median of `--repeats` scrapes (binds before each of the latter). The collector
runs before each timed scrape, so that a collection of the garbage made before it (here
the cluster's set-up) does not fall inside one figure and not the next. Prints figures;
never fails on time.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

from benchmarks.workload import make_cluster
from gas.cluster.demo import DemoCluster
from gas.core.allocator import Rejection
from gas.core.ledger import Ledger
from gas.core.model import PodRequest
from gas.core.scoring import POD_SIZES, size_request
from gas.serving.metrics import Metrics


def _cpu_ms(metrics: Metrics) -> tuple[float, int]:
    gc.collect()
    started = time.process_time()
    text = metrics.exposition()
    return round((time.process_time() - started) * 1000, 1), len(text)


def _bind(ledger: Ledger, rng: random.Random, count: int, first: int = 0) -> int:
    """Binds up to `count` quarter-card pods (numbered from `first`) on random nodes; how
    many landed."""
    names = ledger.node_names()
    bound = 0
    for index in range(count):
        name = rng.choice(names)
        node = ledger.node(name)
        assert node is not None
        request: PodRequest = size_request(node, POD_SIZES[0])
        uid = f"bench-scrape-{first + index}"
        result = ledger.reserve_placement(uid, "default", uid, request, name)
        if not isinstance(result, Rejection):
            ledger.commit(uid)
            bound += 1
    return bound


def measure(nodes: int, binds: int, repeats: int = 3) -> dict[str, object]:
    cluster = make_cluster(nodes, 0.5)
    ledger = Ledger()
    DemoCluster(ledger, cluster.as_demo_file()).start()
    metrics = Metrics()
    metrics.watch_ledger(ledger)
    first, size = _cpu_ms(metrics)
    unchanged = statistics.median(_cpu_ms(metrics)[0] for _ in range(repeats))
    rng = random.Random(nodes)
    afters = []
    bound = 0
    for repeat in range(repeats):
        bound += _bind(ledger, rng, binds, first=repeat * binds)
        afters.append(_cpu_ms(metrics)[0])
    after = statistics.median(afters)
    return {
        "nodes": nodes,
        "bytes": size,
        "first_ms": first,
        "unchanged_ms": unchanged,
        "binds": binds,
        "bound": bound,
        "after_binds_ms": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nodes", nargs="*", type=int, default=[1000, 5000])
    parser.add_argument("--binds", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for nodes in args.nodes:
        print(json.dumps(measure(nodes, args.binds, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
