"""The resource kinds the double serves and the fields their field selectors may name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tests.support.apiserver.errors import JSONDict


def field_str(obj: JSONDict, *path: str, default: str = "") -> str:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    if cur is None:
        return default
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _field_getter(*path: str, default: str = "") -> Callable[[JSONDict], str]:
    return lambda obj: field_str(obj, *path, default=default)


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    list_kind: str
    namespaced: bool
    storage_prefix: str
    fields: Mapping[str, Callable[[JSONDict], str]]
    api_version: str = "v1"

    def storage_key(self, namespace: str, name: str) -> str:
        if self.namespaced:
            return f"{self.storage_prefix}/{namespace}/{name}"
        return f"{self.storage_prefix}/{name}"

    def typed(self, obj: JSONDict) -> JSONDict:
        """The object with ``kind``/``apiVersion`` first, as returned by GET/watch."""
        if "kind" in obj:
            return obj
        return {"kind": self.kind, "apiVersion": self.api_version, **obj}


PODS: Final = Kind(
    "pods",
    "Pod",
    "PodList",
    True,
    "/registry/pods",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "metadata.namespace": _field_getter("metadata", "namespace"),
        "spec.nodeName": _field_getter("spec", "nodeName"),
        "spec.restartPolicy": _field_getter("spec", "restartPolicy"),
        "spec.schedulerName": _field_getter("spec", "schedulerName"),
        "spec.serviceAccountName": _field_getter("spec", "serviceAccountName"),
        "spec.hostNetwork": _field_getter("spec", "hostNetwork", default="false"),
        "status.phase": _field_getter("status", "phase"),
        "status.podIP": _field_getter("status", "podIP"),
        "status.nominatedNodeName": _field_getter("status", "nominatedNodeName"),
    },
)
NODES: Final = Kind(
    "nodes",
    "Node",
    "NodeList",
    False,
    "/registry/minions",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "spec.unschedulable": _field_getter("spec", "unschedulable", default="false"),
    },
)
EVENTS: Final = Kind(
    "events",
    "Event",
    "EventList",
    True,
    "/registry/events",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "metadata.namespace": _field_getter("metadata", "namespace"),
    },
)
# Leader election: create/get/update with resourceVersion optimistic concurrency (409).
LEASES: Final = Kind(
    "leases",
    "Lease",
    "LeaseList",
    True,
    "/registry/leases",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "metadata.namespace": _field_getter("metadata", "namespace"),
    },
    "coordination.k8s.io/v1",
)
# DRA (resource.k8s.io/v1): the node's slices, written by gas dra, and the claims it reads.
RESOURCESLICES: Final = Kind(
    "resourceslices",
    "ResourceSlice",
    "ResourceSliceList",
    False,
    "/registry/resourceslices",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "spec.driver": _field_getter("spec", "driver"),
        "spec.nodeName": _field_getter("spec", "nodeName"),
    },
    "resource.k8s.io/v1",
)
RESOURCECLAIMS: Final = Kind(
    "resourceclaims",
    "ResourceClaim",
    "ResourceClaimList",
    True,
    "/registry/resourceclaims",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "metadata.namespace": _field_getter("metadata", "namespace"),
    },
    "resource.k8s.io/v1",
)
KINDS: Final[Mapping[str, Kind]] = {
    k.resource: k for k in (PODS, NODES, EVENTS, LEASES, RESOURCESLICES, RESOURCECLAIMS)
}
