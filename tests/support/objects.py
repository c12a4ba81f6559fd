"""Builders for tests, and the constants they share.

Three forms: Kubernetes objects as the API server stores them (JSON dicts: `gpu_node`,
`container`, `gpu_pod`, `bound_pod`; `binding_args` binds one), the plainer objects gas's
core reads in unit tests (`make_node`, `ctr`, `pod_object`: allocatable and requests only)
and gas's own node record (`card_node`). Resource keys are short names (`i915`,
`memory_max`, `millicores`) that `res` expands.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gas.core.model import ANNOTATION_CARDS, ANNOTATION_TS, LABEL_GPU_NUMBERS, NodeGpu
from gas.host.cards import Card

PREFIX = "gpu.intel.com/"
MEM = PREFIX + "memory.max"
MILLI = PREFIX + "millicores"
G = 10**9  # what "1G" means
GI = 2**30  # what "1Gi" means


def res(short: str) -> str:
    """`memory_max` -> `gpu.intel.com/memory.max`, `i915` -> `gpu.intel.com/i915`."""
    return PREFIX + {"memory_max": "memory.max"}.get(short, short)


# ---------------------------------------------------------------- as the API server stores them


def gpu_node(name: str, gpu_numbers: str = "0.1", **allocatable: str) -> dict[str, Any]:
    """A node as the GPU device plugin and labeller publish it; allocatable keys are short
    names (`i915`, `memory_max`, `millicores`)."""
    return {
        "metadata": {"name": name, "labels": {LABEL_GPU_NUMBERS: gpu_numbers}},
        "status": {
            "capacity": {res(k): v for k, v in allocatable.items()},
            "allocatable": {res(k): v for k, v in allocatable.items()},
        },
    }


def container(name: str = "app", **limits: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": "busybox",
        "resources": {"limits": {res(k): v for k, v in limits.items()}},
    }


def gpu_pod(
    name: str,
    *containers: dict[str, Any],
    namespace: str = "default",
    node: str | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    """A pod; extended-resource limits are copied into requests as the API server does."""
    spec_containers = []
    for item in containers or (container(i915="1"),):
        item = {**item, "resources": dict(item["resources"])}
        limits = item["resources"].get("limits", {})
        item["resources"]["requests"] = {**limits, **item["resources"].get("requests", {})}
        spec_containers.append(item)
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": spec_containers, "schedulerName": "default-scheduler"},
        "status": {"phase": phase},
    }
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def bound_pod(
    name: str,
    node: str,
    cards: str,
    *containers: dict[str, Any],
    phase: str = "Running",
    namespace: str = "default",
    ts: str | None = None,
) -> dict[str, Any]:
    """A pod as gas leaves it after a bind: on `node`, with gas's annotations (`ts`: the
    gas-ts annotation, now unless given)."""
    annotations = {ANNOTATION_CARDS: cards, ANNOTATION_TS: ts or str(time.time_ns())}
    return gpu_pod(
        name, *containers, namespace=namespace, node=node, annotations=annotations, phase=phase
    )


def binding_args(pod: Mapping[str, Any], node: str) -> dict[str, str]:
    """ExtenderBindingArgs binding `pod` (its name, namespace and UID) to `node`, as
    kube-scheduler sends them."""
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


# ---------------------------------------------------------------- as gas's core reads them


def make_node(
    name: str,
    gpu_numbers: str | None = "0.1",
    *,
    labels: Mapping[str, Any] | None = None,
    **allocatable: Any,
) -> dict[str, Any]:
    """A v1.Node dict with allocatable only; `gpu_numbers` is the gpu-numbers label (None:
    no such label) and `labels` are added after it."""
    all_labels: dict[str, Any] = {}
    if gpu_numbers is not None:
        all_labels[LABEL_GPU_NUMBERS] = gpu_numbers
    all_labels.update(labels or {})
    return {
        "metadata": {"name": name, "labels": all_labels},
        "status": {"allocatable": {res(k): v for k, v in allocatable.items()}},
    }


def ctr(name: str = "c", **requests: Any) -> dict[str, Any]:
    """A container with requests only (no image, no limits)."""
    return {"name": name, "resources": {"requests": {res(k): v for k, v in requests.items()}}}


def pod_object(
    name: str,
    *containers: dict[str, Any],
    namespace: str,
    uid: str | None = None,
    annotations: Mapping[str, Any] | None = None,
    cards_annotation: Any = None,
    deleting: bool = False,
    node: str | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    phase: str | None = "Running",
) -> dict[str, Any]:
    """A pod as gas's core reads it; `uid` defaults to `uid-<name>`, `cards_annotation` is
    the gas-container-cards annotation (any value, to try malformed ones) and a pod whose
    `phase` is None has no status."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    all_annotations = dict(annotations or {})
    if cards_annotation is not None:
        all_annotations[ANNOTATION_CARDS] = cards_annotation
    if all_annotations:
        metadata["annotations"] = all_annotations
    if deleting:
        metadata["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": list(containers)}
    if node is not None:
        spec["nodeName"] = node
    if init_containers is not None:
        spec["initContainers"] = init_containers
    pod: dict[str, Any] = {"metadata": metadata, "spec": spec}
    if phase is not None:
        pod["status"] = {"phase": phase}
    return pod


# ---------------------------------------------------------------- gas's node record


def card_node(cards: int, name: str = "n1", **per_card: int) -> NodeGpu:
    """A node with card0..card{cards-1}, each with `per_card` capacity (default i915 8)."""
    capacity = {res(k): v for k, v in (per_card or {"i915": 8}).items()}
    return NodeGpu(name, tuple(f"card{i}" for i in range(cards)), capacity)


def intel_cards(count: int, memory: int) -> list[Card]:
    """`count` i915 cards as gas's discovery finds them on a node: card0, card1, ..., each
    one tile and `memory` bytes, at PCI addresses 0000:03:00.0 on, render nodes from 128."""
    return [
        Card(
            f"card{i}",
            i,
            "0x8086",
            0,
            f"0000:{i + 3:02x}:00.0",
            f"renderD{128 + i}",
            "i915",
            1,
            memory,
        )
        for i in range(count)
    ]
