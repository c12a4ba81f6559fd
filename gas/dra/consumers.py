"""Which containers see which claims, read from the pods the claims are reserved for: no
I/O.

The kubelet gives a container the devices of every claim it names, and of no other: in
`resources.claims` (`{name, request}`, the name a pod-level claim entry whose
`resourceClaimName` names the claim, or whose template's claim
`status.resourceClaimStatuses` names), or through kube-scheduler's extended-resource
mapping (`status.extendedResourceClaimStatus`, for a pod that asked for
`gpu.intel.com/i915` and named no claim). Init containers count as containers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gas.core.model import as_list, as_mapping


@dataclass(frozen=True)
class ClaimUse:
    """A container's use of a claim: every request of it (`request` None) or one."""

    claim: str
    """`namespace/name` of the ResourceClaim (always in the pod's namespace)."""
    request: str | None = None

    def covers(self, request: str) -> bool:
        return self.request is None or self.request == request


@dataclass(frozen=True)
class Consumer:
    """One container of a pod, and the claims it sees."""

    namespace: str
    pod: str
    container: str
    uses: tuple[ClaimUse, ...]

    @property
    def label(self) -> str:
        return f"container {self.container} of pod {self.namespace}/{self.pod}"

    def sees(self, claim: str, request: str) -> bool:
        return any(use.claim == claim and use.covers(request) for use in self.uses)


def _claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim entries (`spec.resourceClaims[].name`) -> the claim each stands for;
    an entry whose claim is not made yet is left out."""
    generated = {
        str(entry.get("name")): str(entry.get("resourceClaimName"))
        for entry in map(
            as_mapping, as_list(as_mapping(pod.get("status")).get("resourceClaimStatuses"))
        )
        if entry.get("resourceClaimName")
    }
    names = {}
    for entry in map(as_mapping, as_list(as_mapping(pod.get("spec")).get("resourceClaims"))):
        name = str(entry.get("name") or "")
        if entry.get("resourceClaimName"):
            names[name] = str(entry["resourceClaimName"])
        elif name in generated:
            names[name] = generated[name]
    return names


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    spec = as_mapping(pod.get("spec"))
    for key in ("initContainers", "containers"):
        yield from map(as_mapping, as_list(spec.get(key)))


def consumers(pod: Mapping[str, Any]) -> list[Consumer]:
    """Every container of the pod that sees at least one claim."""
    meta = as_mapping(pod.get("metadata"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    claims = _claim_names(pod)
    extended = as_mapping(as_mapping(pod.get("status")).get("extendedResourceClaimStatus"))
    extended_claim = extended.get("resourceClaimName")
    found = []
    for container in _containers(pod):
        container_name = str(container.get("name") or "")
        uses: list[ClaimUse] = []
        for ref in map(as_mapping, as_list(as_mapping(container.get("resources")).get("claims"))):
            claim = claims.get(str(ref.get("name") or ""))
            if claim is not None:
                request = ref.get("request")
                uses.append(ClaimUse(f"{namespace}/{claim}", str(request) if request else None))
        if isinstance(extended_claim, str) and extended_claim:
            for mapping in map(as_mapping, as_list(extended.get("requestMappings"))):
                if mapping.get("containerName") == container_name and mapping.get("requestName"):
                    request = str(mapping["requestName"])
                    uses.append(ClaimUse(f"{namespace}/{extended_claim}", request))
        if uses:
            found.append(Consumer(namespace, name, container_name, tuple(dict.fromkeys(uses))))
    return found
