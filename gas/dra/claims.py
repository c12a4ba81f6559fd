"""What a ResourceClaim's allocation asks of this node, read from the claim as the API
server sends it: no I/O.

The kubelet names a claim only by namespace, name and UID; the allocation results say
which device of which pool each request got, and, on a shared device, its `shareID` and
the capacity it consumes. Only the results of this driver count (a claim may hold other
drivers' devices too); each must name this node's pool and one of its cards.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gas.core.quantity import QuantityError, parse_quantity
from gas.core.shares import Share
from gas.dra.driver import DRIVER, MEMORY, MILLICORES, TILES


class ClaimError(Exception):
    """Why one claim cannot be prepared; the kubelet gets the message for that claim."""


@dataclass(frozen=True)
class Result:
    """One allocation result of this driver: `request` as the allocation names it
    (`<request>/<subrequest>` for a prioritized list), the card, what it consumes, and
    whether it is an administrator's access (a monitoring pod's), which shares nothing
    and is not counted against the card."""

    request: str
    pool: str
    device: str
    share_id: str | None
    tiles: int
    memory: int = 0
    millicores: int = 0
    admin: bool = False

    @property
    def share(self) -> Share:
        return Share(self.memory, self.millicores, self.tiles)

    @property
    def base_request(self) -> str:
        """The claim's own request name, which containers refer to."""
        return self.request.split("/", 1)[0]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def check_identity(claim: Mapping[str, Any], namespace: str, name: str, uid: str) -> None:
    """The claim read must be the one the kubelet means: one deleted and made again under
    the same name has another UID."""
    found = _mapping(claim.get("metadata")).get("uid")
    if found != uid:
        raise ClaimError(
            f"ResourceClaim {namespace}/{name} has UID {found}, not {uid}: it was replaced"
        )


def _consumed(entry: Mapping[str, Any], name: str, where: str) -> int:
    consumed = _mapping(entry.get("consumedCapacity"))
    if name not in consumed:
        return 0
    try:
        amount = parse_quantity(consumed[name])
    except QuantityError as exc:
        raise ClaimError(f"{where}: consumed {name} {consumed[name]!r}: {exc}") from None
    if amount < 0:
        raise ClaimError(f"{where}: consumed {name} {amount} is negative")
    return amount


def reserved_pods(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, UID) of each pod the claim is reserved for (`status.reservedFor`): the pods
    whose containers will see its devices."""
    found = []
    for entry in _mapping(claim.get("status")).get("reservedFor") or []:
        entry = _mapping(entry)
        if entry.get("resource") == "pods" and not entry.get("apiGroup"):
            name, uid = entry.get("name"), entry.get("uid")
            if isinstance(name, str) and isinstance(uid, str):
                found.append((name, uid))
    return found


def results_for(claim: Mapping[str, Any], pool: str) -> list[Result]:
    """This driver's allocation results, each checked to be of `pool` (this node's)."""
    meta = _mapping(claim.get("metadata"))
    label = f"ResourceClaim {meta.get('namespace', '')}/{meta.get('name', '')}"
    allocation = _mapping(_mapping(claim.get("status")).get("allocation"))
    if not allocation:
        raise ClaimError(f"{label} is not allocated")
    entries = _mapping(allocation.get("devices")).get("results") or []
    if not isinstance(entries, list):
        raise ClaimError(f"{label}: status.allocation.devices.results is not a list")
    found = []
    for entry in entries:
        entry = _mapping(entry)
        if entry.get("driver") != DRIVER:
            continue
        where = f"{label}, request {entry.get('request')!r}"
        if entry.get("pool") != pool:
            raise ClaimError(
                f"{where}: allocated in pool {entry.get('pool')!r}, and this node's pool is "
                f"{pool!r}"
            )
        share = entry.get("shareID")
        found.append(
            Result(
                request=str(entry.get("request") or ""),
                pool=pool,
                device=str(entry.get("device") or ""),
                share_id=str(share) if share else None,
                tiles=_consumed(entry, TILES, where),
                memory=_consumed(entry, MEMORY, where),
                millicores=_consumed(entry, MILLICORES, where),
                admin=entry.get("adminAccess") is True,
            )
        )
    return found


def check_devices(
    results: Sequence[Result],
    cards: Collection[str],
    node: str,
    label: str,
    unusable: Mapping[str, str] | None = None,
) -> None:
    """Every result's device must be a card this node has now: a container is never handed
    a card in its place, nor a card that is gone (`unusable`: card -> why)."""
    for result in results:
        why = (unusable or {}).get(result.device)
        if why is not None:
            raise ClaimError(
                f"{label}: request {result.request!r} was allocated {result.device}, which "
                f"cannot be used now: {why}"
            )
        if result.device not in cards:
            have = ", ".join(sorted(cards)) or "none"
            raise ClaimError(
                f"{label}: request {result.request!r} was allocated device {result.device!r}, "
                f"which node {node} does not have (its cards: {have})"
            )
