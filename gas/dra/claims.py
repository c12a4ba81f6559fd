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
from gas.dra.driver import DRIVER, TILES


class ClaimError(Exception):
    """Why one claim cannot be prepared; the kubelet gets the message for that claim."""


@dataclass(frozen=True)
class Result:
    """One allocation result of this driver: `request` as the allocation names it
    (`<request>/<subrequest>` for a prioritized list), the card, and what it consumes."""

    request: str
    pool: str
    device: str
    share_id: str | None
    tiles: int

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


def _consumed_tiles(entry: Mapping[str, Any], where: str) -> int:
    consumed = _mapping(entry.get("consumedCapacity"))
    if TILES not in consumed:
        return 0
    try:
        tiles = parse_quantity(consumed[TILES])
    except QuantityError as exc:
        raise ClaimError(f"{where}: consumed tiles {consumed[TILES]!r}: {exc}") from None
    if tiles < 0:
        raise ClaimError(f"{where}: consumed tiles {tiles} is negative")
    return tiles


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
                tiles=_consumed_tiles(entry, where),
            )
        )
    return found


def check_devices(results: Sequence[Result], cards: Collection[str], node: str, label: str) -> None:
    """Every result's device must be a card this node has: a container is never handed a
    card in its place."""
    for result in results:
        if result.device not in cards:
            have = ", ".join(sorted(cards)) or "none"
            raise ClaimError(
                f"{label}: request {result.request!r} was allocated device {result.device!r}, "
                f"which node {node} does not have (its cards: {have})"
            )
