"""Kubernetes objects for integration tests, as the API server stores them (JSON dicts)."""

from __future__ import annotations

from typing import Any

from gas.core.model import LABEL_GPU_NUMBERS

PREFIX = "gpu.intel.com/"


def _res(short: str) -> str:
    return PREFIX + {"memory_max": "memory.max"}.get(short, short)


def gpu_node(name: str, gpu_numbers: str = "0.1", **allocatable: str) -> dict[str, Any]:
    """A node as the GPU device plugin and labeller publish it; allocatable keys are short
    names (`i915`, `memory_max`, `millicores`)."""
    return {
        "metadata": {"name": name, "labels": {LABEL_GPU_NUMBERS: gpu_numbers}},
        "status": {
            "capacity": {_res(k): v for k, v in allocatable.items()},
            "allocatable": {_res(k): v for k, v in allocatable.items()},
        },
    }


def container(name: str = "app", **limits: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": "busybox",
        "resources": {"limits": {_res(k): v for k, v in limits.items()}},
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
