"""The ledger rebuilt from a full pod list, as after a relist: time and memory.

Run alone (`python -m benchmarks.rebuild NODES PODS [SEED]`) so the peak resident memory it
prints is its own; `benchmarks.run` does that. Prints one JSON line of figures.

Two passes over the same generated cluster: the first is timed (`observe_pod` on every pod
object, then `Ledger.replace_pods`) and gives the process's peak RSS with the pod objects
and the ledger alive together; the second, under tracemalloc, gives what the ledger keeps
once the pod objects are gone.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path

from benchmarks.workload import make_cluster
from gas.core.holdings import observe_pod
from gas.core.ledger import Ledger
from gas.core.model import node_from_object


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def rebuild(nodes: int, pods: int, seed: int) -> Ledger:
    cluster = make_cluster(nodes, 0.9, seed, max_pods=pods)
    ledger = Ledger()
    ledger.replace_nodes(node_from_object(n) for n in cluster.nodes)
    observations = [o for o in map(observe_pod, cluster.pods) if o is not None]
    ledger.replace_pods(observations, 0.0)
    return ledger


def main(argv: list[str]) -> int:
    nodes, pods = int(argv[0]), int(argv[1])
    seed = int(argv[2]) if len(argv) > 2 else 1

    cluster = make_cluster(nodes, 0.9, seed, max_pods=pods)
    ledger = Ledger()
    ledger.replace_nodes(node_from_object(n) for n in cluster.nodes)
    gc.collect()
    start = time.perf_counter()
    observations = [o for o in map(observe_pod, cluster.pods) if o is not None]
    observed = time.perf_counter()
    ledger.replace_pods(observations, 0.0)
    replaced = time.perf_counter()
    held = len(ledger.holdings())
    peak_rss = _status_kib("VmHWM") / 1024
    del cluster, observations, ledger
    gc.collect()

    tracemalloc.start()
    kept = rebuild(nodes, pods, seed)
    gc.collect()
    ledger_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept

    figures = {
        "nodes": nodes,
        "pods": held,
        "observe_s": observed - start,
        "replace_s": replaced - observed,
        "peak_rss_mib": peak_rss,
        "ledger_mib": ledger_bytes / 2**20,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
