"""Synthetic clusters and pods for the benchmarks, as plain Kubernetes JSON objects.

Nodes carry 4 to 8 cards with the labels and allocatable resources the GPU device plugin
publishes; running pods carry `gas-container-cards` as if gas had bound them. Occupancy is
the share of the cluster's GPU memory the running pods hold. Everything is derived from a
seed, so two runs compare the same cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

I915 = "gpu.intel.com/i915"
MEMORY = "gpu.intel.com/memory.max"
MILLICORES = "gpu.intel.com/millicores"
GI = 2**30

# Per card: four pods may share one (the device plugin's shared-dev-num), 16 GiB, 1000m.
CARD_SLOTS = 4
CARD_MEMORY_GI = 16
CARD_MILLICORES = 1000


@dataclass(frozen=True)
class Shape:
    """A pod size: `cards` cards, each with `memory_gi` GiB and `millicores`."""

    name: str
    cards: int
    memory_gi: int
    millicores: int
    weight: float


# A mix of inference-sized and training-sized pods; the weights are the share of pods.
SHAPES = (
    Shape("quarter-card", 1, 4, 250, 0.30),
    Shape("half-card", 1, 8, 500, 0.40),
    Shape("one-card", 1, 16, 1000, 0.15),
    Shape("two-half-cards", 2, 8, 500, 0.15),
)


@dataclass
class Cluster:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    cards: int

    def as_demo_file(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "pods": self.pods}

    @property
    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.nodes]


def node_object(name: str, cards: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "gpu.intel.com/gpu-numbers": ".".join(str(i) for i in range(cards)),
                "kubernetes.io/os": "linux",
            },
        },
        "status": {
            "allocatable": {
                I915: str(cards * CARD_SLOTS),
                MEMORY: f"{cards * CARD_MEMORY_GI}Gi",
                MILLICORES: str(cards * CARD_MILLICORES),
                "cpu": "64",
                "memory": "512Gi",
            }
        },
    }


def pod_object(
    name: str,
    uid: str,
    shape: Shape,
    node: str | None = None,
    cards: list[str] | None = None,
    namespace: str = "bench",
) -> dict[str, Any]:
    """A one-container pod of `shape`; bound to `node` on `cards` when both are given."""
    limits = {
        I915: str(shape.cards),
        MEMORY: f"{shape.memory_gi * shape.cards}Gi",
        MILLICORES: str(shape.millicores * shape.cards),
    }
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "containers": [
            {
                "name": "app",
                "image": "registry.example/app:1",
                "resources": {"limits": limits, "requests": dict(limits)},
            }
        ],
    }
    pod: dict[str, Any] = {"metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}
    if node is not None and cards:
        metadata["annotations"] = {
            "gas-ts": "1700000000000000000",
            "gas-container-cards": ",".join(cards),
        }
        spec["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod


def queue_shapes(count: int = 64) -> list[Shape]:
    """`count` distinct pod shapes, as a real queue holds: one to four cards, 1 to 16 GiB
    and 50 to 1000 millicores per card, mixed so neighbours differ in every dimension.

    More shapes than gas keeps answers for, so cycling through them measures a filter
    that finds no kept answer for its shape."""
    shapes: dict[tuple[int, int, int], Shape] = {}
    index = 0
    while len(shapes) < count:
        cards = (1, 1, 2, 1, 3, 1, 2, 4)[index % 8]
        memory_gi = 1 + (index * 5) % CARD_MEMORY_GI
        millicores = 50 * (1 + (index * 7 + index // 16) % 20)
        key = (cards, memory_gi, millicores)
        shapes.setdefault(key, Shape(f"queue-{index}", cards, memory_gi, millicores, 1.0))
        index += 1
    return list(shapes.values())


def pick_shape(rng: random.Random) -> Shape:
    return rng.choices(SHAPES, weights=[s.weight for s in SHAPES])[0]


def make_cluster(
    nodes: int, occupancy: float, seed: int = 1, max_pods: int | None = None
) -> Cluster:
    """`nodes` nodes of 4 to 8 cards, filled with running pods to about `occupancy` of
    their GPU memory (each node within ten points of it), at most `max_pods` pods."""
    rng = random.Random(f"{seed}-{nodes}-{occupancy}")
    node_objects = []
    pods: list[dict[str, Any]] = []
    total_cards = 0
    for index in range(nodes):
        name = f"node-{index:05d}"
        cards = rng.randint(4, 8)
        total_cards += cards
        node_objects.append(node_object(name, cards))
        memory = [0] * cards
        slots = [0] * cards
        target = min(1.0, max(0.0, occupancy + rng.uniform(-0.1, 0.1)))
        budget = target * cards * CARD_MEMORY_GI
        misses = 0
        while sum(memory) < budget and misses < 8:
            if max_pods is not None and len(pods) >= max_pods:
                break
            shape = pick_shape(rng)
            if sum(memory) + shape.memory_gi * shape.cards > budget + 2:
                misses += 1
                continue
            fitting = [
                c
                for c in range(cards)
                if memory[c] + shape.memory_gi <= CARD_MEMORY_GI and slots[c] < CARD_SLOTS
            ]
            if len(fitting) < shape.cards:
                misses += 1
                continue
            chosen = sorted(rng.sample(fitting, shape.cards))
            for c in chosen:
                memory[c] += shape.memory_gi
                slots[c] += 1
            serial = len(pods)
            pods.append(
                pod_object(
                    f"run-{serial}", f"uid-run-{serial}", shape, name, [f"card{c}" for c in chosen]
                )
            )
    return Cluster(node_objects, pods, total_cards)


def memory_share(cluster: Cluster) -> float:
    """The share of the cluster's GPU memory its running pods hold."""
    used = 0
    for pod in cluster.pods:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        used += int(limits[MEMORY].removesuffix("Gi"))
    return used / max(1, cluster.cards * CARD_MEMORY_GI)
