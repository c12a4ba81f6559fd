"""gas's two API paths that every scheduled pod goes through, in this process: the pod
watch and the Binding write, against the test suite's API-server double over real HTTP with
the real `kubernetes` client (the double in this process, its threads apart).

    .venv/bin/python -m benchmarks.kubewire [--pods 300] [--runs 5]

Each pod is created at the API server (the watch's ADDED), its cards reserved in the
ledger and its Binding written by `KubeCluster.bind` as gas's bind does (its MODIFIED), one
pod at a time, waiting for the watch to apply each event, as kube-scheduler's pods arrive
milliseconds apart. Pods carry what a real kube-apiserver adds to a created pod (defaults,
the service account volume, managedFields), so each event is as long as a real one. Then
pods that ask for no GPU, created and bound by someone else, and a status-only change of
each (kube-scheduler's "Unschedulable" condition, say).

Figures: the pod reflector thread's own CPU clock per event (so the double's threads and
this one's waits are not counted), and the calling thread's CPU per `KubeCluster.bind`;
medians over the runs, each run on a fresh API server, gas and ledger. Prints JSON; never
fails on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.verbs import as_served
from benchmarks.workload import SHAPES, Shape, make_cluster, pod_object
from gas.cluster.kube import KubeCluster, load_api_client
from gas.core.allocator import Rejection
from gas.core.ledger import Ledger
from gas.core.model import ANNOTATION_CARDS, ANNOTATION_TS, format_cards, pod_request
from tests.support.apiserver import ApiServerDouble

WAIT_SECONDS = 10.0


def api_server_pod(name: str, uid: str, shape: Shape | None) -> dict[str, Any]:
    """A pending pod as kube-apiserver v1.28 stores a created one (`benchmarks.verbs`'s
    `as_served`: its defaults, the service account's projected volume and the creator's
    managedFields), with UID `uid` and GPU limits of `shape`, or none."""
    if shape is None:
        pod = pod_object(name, uid, SHAPES[0])
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    else:
        pod = pod_object(name, uid, shape)
    pod = as_served(pod, 0)
    metadata = pod["metadata"]
    metadata["uid"] = uid
    # Set by the API server on create, not by its client.
    del metadata["resourceVersion"], metadata["creationTimestamp"]
    return pod


class _Watched:
    """The pod reflector's progress and its thread's CPU clock."""

    def __init__(self, api: ApiServerDouble, cluster: KubeCluster) -> None:
        reflector = next(r for r in cluster._reflectors if r.kind == "pods")
        assert reflector.ident is not None
        self._api = api
        self._reflector = reflector
        self._clock = time.pthread_getcpuclockid(reflector.ident)

    def cpu(self) -> float:
        return time.clock_gettime(self._clock)

    def caught_up(self) -> None:
        """Wait until the watch has applied every change the API server made."""
        target = str(self._api.resource_version)
        deadline = time.monotonic() + WAIT_SECONDS
        while self._reflector._version != target:
            if time.monotonic() > deadline:
                raise RuntimeError("the pod watch did not catch up")
            time.sleep(0.0005)


def _wait(ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError("gas did not sync")
        time.sleep(0.01)


def one_run(pods: int, directory: Path, seed: int) -> dict[str, float]:
    # Room for every pod: each takes a quarter of a card, and nodes have 4 to 8 cards.
    cluster_spec = make_cluster(max(10, pods // 12), 0.0, seed)
    with ApiServerDouble() as api:
        for node in cluster_spec.nodes:
            api.add_node(node)
        api_client = load_api_client(api.write_kubeconfig(directory / "kubeconfig"))
        ledger = Ledger()
        cluster = KubeCluster(ledger, api_client)
        cluster.start()
        try:
            _wait(cluster.synced)
            _wait(lambda: len(ledger.node_names()) == len(cluster_spec.nodes))
            watched = _Watched(api, cluster)
            names = cluster_spec.node_names
            # One unmeasured pod first: the connections opened, every path run once.
            _gpu_pods(api, cluster, ledger, watched, names, 1, "warm")
            figures = _gpu_pods(api, cluster, ledger, watched, names, pods, "gpu")
            figures.update(_other_pods(api, watched, names, pods))
        finally:
            cluster.stop()
            api_client.close()  # type: ignore[no-untyped-call]
    return figures


def _gpu_pods(
    api: ApiServerDouble,
    cluster: KubeCluster,
    ledger: Ledger,
    watched: _Watched,
    names: list[str],
    count: int,
    prefix: str,
) -> dict[str, float]:
    added = modified = bind = 0.0
    for index in range(count):
        pod = api_server_pod(f"{prefix}-{index}", f"uid-{prefix}-{index}", SHAPES[0])
        node = names[index % len(names)]
        before = watched.cpu()
        api.add_pod(pod)
        watched.caught_up()
        added += watched.cpu() - before
        # As gas's bind: the cards held, the Binding written, the hold committed.
        meta = pod["metadata"]
        placed = ledger.reserve_placement(
            meta["uid"], meta["namespace"], meta["name"], pod_request(pod), node
        )
        if isinstance(placed, Rejection):
            raise RuntimeError(f"{node} has no room for {meta['name']}: {placed.reason}")
        cards = format_cards(placed.cards)
        annotations = {ANNOTATION_TS: str(time.time_ns()), ANNOTATION_CARDS: cards}
        before = watched.cpu()
        started = time.thread_time()
        cluster.bind(pod, node, annotations)
        bind += time.thread_time() - started
        ledger.commit(meta["uid"])
        watched.caught_up()
        modified += watched.cpu() - before
    return {
        "gpu_added_ms": added / count * 1e3,
        "gpu_bound_ms": modified / count * 1e3,
        "bind_ms": bind / count * 1e3,
    }


def _other_pods(
    api: ApiServerDouble, watched: _Watched, names: list[str], count: int
) -> dict[str, float]:
    added = bound = status = 0.0
    for index in range(count):
        name = f"cpu-{index}"
        before = watched.cpu()
        api.add_pod(api_server_pod(name, f"uid-{name}", None))
        watched.caught_up()
        middle = watched.cpu()
        added += middle - before
        binding = {"metadata": {"name": name}, "target": {"name": names[index % len(names)]}}
        api.store.bind("bench", name, binding)
        watched.caught_up()
        after = watched.cpu()
        bound += after - middle
        api.patch_pod("bench", name, {"status": {"message": f"probe {index}"}})
        watched.caught_up()
        status += watched.cpu() - after
    return {
        "other_added_ms": added / count * 1e3,
        "other_bound_ms": bound / count * 1e3,
        "status_only_ms": status / count * 1e3,
    }


def measure(pods: int, runs: int, seed: int = 1) -> dict[str, float]:
    """Medians over `runs` runs of `pods` pods of each kind: CPU ms per watch event (by
    event) and per Binding write."""
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            results.append(one_run(pods, Path(tmp), seed + run))
    medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
    medians["gpu_event_ms"] = (medians["gpu_added_ms"] + medians["gpu_bound_ms"]) / 2
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=300, help="pods of each kind per run")
    parser.add_argument("--runs", type=int, default=5, help="runs (medians are printed)")
    args = parser.parse_args()
    figures = measure(args.pods, args.runs)
    print(json.dumps({"pods": args.pods, "runs": args.runs, **figures}, indent=1))


if __name__ == "__main__":
    main()
