"""Whose a container is, and what gas gave it, read from its pod: no I/O.

The kernel names a process's pod by UID and its container by the runtime's id
(`gas.host.cgroups`); the pod's status maps each container's id to its name
(`containerStatuses[].containerID`, `<runtime>://<id>`, init containers too). In the
extender way the pod also says each container's share of its cards
(`gas.core.shares.extender_shares`); in the DRA way that is in the container's own
environment, which the agent reads beside its use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gas.core.model import SpecError, as_list, as_mapping
from gas.core.shares import Share, extender_shares


@dataclass(frozen=True)
class Holder:
    """A container, named as people name it, and its shares by card (None: not known from
    the pod; in the DRA way, read from its environment)."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    shares: Mapping[str, Share] | None = None
    devices: bool = True
    """False: it asks for no GPU (no `gpu.intel.com/*` resource, no claim) and is not
    privileged, so its device cgroup keeps it from opening one."""


def container_ids(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container id (without its runtime prefix) -> container name."""
    status = as_mapping(pod.get("status"))
    found = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in map(as_mapping, as_list(status.get(key))):
            raw, name = entry.get("containerID"), entry.get("name")
            if isinstance(raw, str) and isinstance(name, str) and raw:
                found[raw.split("://", 1)[-1]] = name
    return found


def _with_devices(pod: Mapping[str, Any]) -> set[str]:
    """The names of the pod's containers that may hold a GPU open."""
    spec, status = as_mapping(pod.get("spec")), as_mapping(pod.get("status"))
    mapped = {
        str(m.get("containerName"))
        for m in map(
            as_mapping,
            as_list(as_mapping(status.get("extendedResourceClaimStatus")).get("requestMappings")),
        )
    }
    found = set()
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in map(as_mapping, as_list(spec.get(key))):
            name = str(container.get("name") or "")
            resources = as_mapping(container.get("resources"))
            asked = {**as_mapping(resources.get("limits")), **as_mapping(resources.get("requests"))}
            privileged = as_mapping(container.get("securityContext")).get("privileged") is True
            if (
                privileged
                or name in mapped
                or as_list(resources.get("claims"))
                or any(str(k).startswith("gpu.intel.com/") for k in asked)
            ):
                found.add(name)
    return found


def holders(pod: Mapping[str, Any], extender: bool) -> dict[str, Holder]:
    """Container id -> its holder; with `extender`, with its shares from the pod (a pod
    whose annotations cannot be read has none: its use is shown, never judged)."""
    metadata = as_mapping(pod.get("metadata"))
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    uid = str(metadata.get("uid") or "")
    shares: dict[str, dict[str, Share]] = {}
    if extender:
        try:
            shares = extender_shares(pod)
        except SpecError:
            shares = {}
    devices = _with_devices(pod)
    return {
        container_id: Holder(
            namespace,
            name,
            uid,
            container,
            (shares.get(container, {}) if extender else None),
            container in devices,
        )
        for container_id, container in container_ids(pod).items()
    }
