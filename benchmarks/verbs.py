"""gas's verbs in process, called as kube-scheduler calls them: the CPU of each per pod.

The end-to-end benchmark (`benchmarks.endtoend`) measures what users see, but three busy
processes on two cores make gas's CPU per pod swing by a fifth from round to round. This
one replays the same traffic into gas's app alone, so that a change to the verbs can be
told from noise:

- the cluster of `benchmarks.endtoend` (1,000 nodes of 4 to 8 cards, running pods holding
  half their GPU memory) in a demo cluster, whose binds reach the ledger as the pod watch
  would bring them;
- a burst of pods of the same mixed shapes, each as the API server hands it to
  kube-scheduler (defaults, managedFields, the service-account volume, tolerations);
- per pod, what kube-scheduler v1.28 sends: a filter naming the nodes its own plugins found
  feasible, `numFeasibleNodesToFind` of them (420 of 1,000) from where the last cycle
  stopped, in about the order its parallel workers find them (blocks of the window,
  shuffled: an approximation of their chunks);
  a bind to one of those gas passed, at random (under first fit every score is 0 and
  kube-scheduler breaks ties at random); with `--prioritize`, as registered for binpack and
  spread, a prioritize naming them first when two or more passed.

Each request goes through the app's direct POST (`hooks.DIRECT_POST`: decoding, the
verb, encoding, metrics and the decision log line, logged to /dev/null at INFO as `gas
serve` logs it, `gas.serving.logformat`); HTTP, TLS and the API write are not in it, and
a bind's figure holds the demo cluster's own store of the pod and the ledger's update that
gas's watch thread would make. Prints the thread CPU per call
of each verb and per pod, the median of `--runs`; never fails on time.

Back to back, the calls run with the interpreter's and numpy's code and data in the CPU's
caches. Under the real scheduler gas waits a few milliseconds between calls and each one
starts cold: `--gap MS` waits that long before each pod, to show what that costs.

    .venv/bin/python -m benchmarks.verbs [--nodes 1000] [--pods 1000] [--runs 3] [--gap 5]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson

from benchmarks.workload import make_cluster, pick_shape, pod_object
from gas.cluster.demo import DemoCluster
from gas.core.ledger import Ledger
from gas.httpserver import hooks
from gas.serving import logformat, routes
from gas.serving.extender import create_app
from tests.support.objects import binding_args

Post = Callable[[str, bytes], Any]
PATHS = {verb: path for path, verb in routes.VERBS.items()}


def feasible_count(nodes: int, percentage: int = 0) -> int:
    """kube-scheduler's `numFeasibleNodesToFind` (v1.28) with percentageOfNodesToScore
    `percentage` (0: its adaptive default)."""
    if nodes < 100 or percentage >= 100:
        return nodes
    if percentage == 0:
        percentage = max(5, 50 - nodes // 125)
    return max(100, nodes * percentage // 100)


def as_served(pod: dict[str, Any], index: int) -> dict[str, Any]:
    """`pod` as the API server hands it to kube-scheduler: what admission and defaulting
    add, and the fields manager's record."""
    metadata = pod["metadata"]
    metadata.update(
        uid=str(uuid.UUID(int=random.Random(index).getrandbits(128))),
        resourceVersion=str(100_000 + index),
        creationTimestamp="2026-11-25T04:54:43Z",
        labels={"round": "verbs"},
        managedFields=[
            {
                "manager": "bench",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-11-25T04:54:43Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {".": {}, "f:round": {}}},
                    "f:spec": {
                        "f:containers": {
                            'k:{"name":"app"}': {
                                ".": {},
                                "f:image": {},
                                "f:name": {},
                                "f:resources": {".": {}, "f:limits": {}, "f:requests": {}},
                            }
                        },
                        "f:schedulerName": {},
                    },
                },
            }
        ],
    )
    spec = pod["spec"]
    mount = "/var/run/secrets/kubernetes.io/serviceaccount"
    spec["volumes"] = [
        {
            "name": "kube-api-access-x",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt"}]}},
                ],
                "defaultMode": 420,
            },
        }
    ]
    for container in spec["containers"]:
        container.update(
            volumeMounts=[{"name": "kube-api-access-x", "readOnly": True, "mountPath": mount}],
            terminationMessagePath="/dev/termination-log",
            terminationMessagePolicy="File",
            imagePullPolicy="IfNotPresent",
        )
    spec.update(
        restartPolicy="Always",
        terminationGracePeriodSeconds=30,
        dnsPolicy="ClusterFirst",
        serviceAccountName="default",
        serviceAccount="default",
        securityContext={},
        tolerations=[
            {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute"}
            for taint in ("not-ready", "unreachable")
        ],
        priority=0,
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
    )
    pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    return pod


class Scheduler:
    """kube-scheduler's calls to its extender, one pod at a time."""

    def __init__(
        self,
        post: Post,
        names: Sequence[str],
        seed: int,
        gap: float = 0.0,
        prioritize: bool = False,
    ) -> None:
        self.post = post
        self.gap = gap
        self.prioritize = prioritize
        self.rng = random.Random(seed)
        self.order = list(names)
        self.rng.shuffle(self.order)
        self.count = feasible_count(len(self.order))
        self.start = 0
        verbs = ("filter", "prioritize", "bind") if prioritize else ("filter", "bind")
        self.cpu: dict[str, float] = dict.fromkeys(verbs, 0.0)
        self.bound = 0

    def window(self) -> list[str]:
        """The next cycle's feasible nodes: the window from where the last stopped, in
        blocks (one per parallel worker's chunk) that finish in any order."""
        order, count = self.order, self.count
        names = [order[(self.start + i) % len(order)] for i in range(count)]
        self.start = (self.start + count) % len(order)
        size = max(1, math.isqrt(count))
        blocks = [names[i : i + size] for i in range(0, count, size)]
        self.rng.shuffle(blocks)
        return [name for block in blocks for name in block]

    def call(self, verb: str, body: dict[str, Any]) -> Any:
        data = orjson.dumps(body)
        started = time.thread_time()
        answer = self.post(PATHS[verb], data)
        self.cpu[verb] += time.thread_time() - started
        return orjson.loads(answer[2])

    def schedule(self, pod: dict[str, Any]) -> None:
        if self.gap:
            time.sleep(self.gap)
        filtered = self.call("filter", {"Pod": pod, "Nodes": None, "NodeNames": self.window()})
        passed = filtered.get("NodeNames") or []
        if not passed:
            return
        if self.prioritize and len(passed) >= 2:
            self.call("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
        binding = binding_args(pod, self.rng.choice(passed))
        if not self.call("bind", binding).get("Error"):
            self.bound += 1


def run(
    nodes: int, pods: int, occupancy: float, seed: int, gap: float = 0.0, prioritize: bool = False
) -> tuple[Scheduler, list[dict[str, Any]], list[dict[str, Any]]]:
    """The burst scheduled: the calls' record, the nodes, and every pod as it ends."""
    cluster = make_cluster(nodes, occupancy)
    rng = random.Random(f"verbs-{seed}")
    burst = [
        as_served(pod_object(f"verbs-{i:05d}", "", pick_shape(rng)), seed * 100_000 + i)
        for i in range(pods)
    ]
    data = cluster.as_demo_file()
    data["pods"] = [*data["pods"], *burst]
    ledger = Ledger()
    demo = DemoCluster(ledger, data)
    demo.start()
    app = create_app(ledger, demo)
    post = getattr(app, hooks.DIRECT_POST)
    scheduler = Scheduler(post, cluster.node_names, seed, gap, prioritize)
    for pod in burst:
        scheduler.schedule(pod)
    keys = [
        (p["metadata"].get("namespace", "default"), p["metadata"]["name"]) for p in data["pods"]
    ]
    return scheduler, cluster.nodes, [p for k in keys if (p := demo.get_pod(*k)) is not None]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--occupancy", type=float, default=0.5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="ms the scheduler waits before each pod (0: back to back); at kube-scheduler's "
        "pace gas is idle between calls, and each call then starts cold",
    )
    parser.add_argument(
        "--prioritize",
        action="store_true",
        help="also send prioritize, as a scheduler registered for binpack and spread does "
        "(the shipped configurations leave it out)",
    )
    args = parser.parse_args(argv)
    with _decisions_to_devnull():
        return _measure(args)


@contextlib.contextmanager
def _decisions_to_devnull() -> Iterator[None]:
    """The decision log at INFO, formatted as `gas serve` formats it, written to /dev/null;
    the logger as it was afterwards."""
    decisions = logging.getLogger("gas.decisions")
    level, propagate = decisions.level, decisions.propagate
    with open(os.devnull, "w") as sink:
        handler = logging.StreamHandler(sink)
        handler.setFormatter(logformat.SecondFormatter())
        decisions.addHandler(handler)
        decisions.setLevel(logging.INFO)
        decisions.propagate = False
        restore = logformat.lean_records()
        try:
            yield
        finally:
            decisions.removeHandler(handler)
            decisions.setLevel(level)
            decisions.propagate = propagate
            restore()


def _measure(args: argparse.Namespace) -> int:
    per_verb: dict[str, list[float]] = {}
    per_pod: list[float] = []
    print(
        f"{args.nodes:,} nodes at {args.occupancy:.0%}, {args.pods:,} pods, filters naming "
        f"{feasible_count(args.nodes)} nodes, {args.gap:g} ms before each pod; thread CPU in "
        "microseconds"
    )
    for index in range(args.runs):
        scheduler, _, _ = run(
            args.nodes,
            args.pods,
            args.occupancy,
            seed=index + 1,
            gap=args.gap / 1000,
            prioritize=args.prioritize,
        )
        bound = max(1, scheduler.bound)
        for verb, seconds in scheduler.cpu.items():
            per_verb.setdefault(verb, []).append(seconds / bound * 1e6)
        per_pod.append(sum(scheduler.cpu.values()) / bound * 1e6)
        print(
            f"run {index + 1}: {scheduler.bound} bound; per pod "
            + ", ".join(f"{v} {s / bound * 1e6:.0f}" for v, s in scheduler.cpu.items())
            + f", all {per_pod[-1]:.0f}"
        )
    print(
        "median per pod: "
        + ", ".join(f"{v} {statistics.median(x):.0f}" for v, x in per_verb.items())
        + f", all {statistics.median(per_pod):.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
