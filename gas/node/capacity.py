"""The node's GPU capacity as extended resources in its `status.capacity`.

`capacity_for` is a pure function of the cards: the totals `gpu.intel.com/memory.max`
(bytes of local memory), `gpu.intel.com/millicores` (1000 per card) and
`gpu.intel.com/tiles`, which gas divides by the node's card count again. The device
resource (`gpu.intel.com/i915` or `xe`) is not among them: the kubelet advertises it
itself from the device plugin's list.

The write is a JSON merge patch of `nodes/<name>/status` that names only those keys: a
changed total is set, and a total whose cards are all gone is removed (`null` in the merge
patch deletes the key). Every other key of `status` is left as it was; the kubelet copies
extended resources from `capacity` into `allocatable` on its next status update, and drops
from `allocatable` those no longer in `capacity`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gas.core.model import TILES
from gas.core.quantity import QuantityError, parse_quantity
from gas.host.cards import Card
from gas.host.kubeapi import merge_patch, read_node
from gas.kubeapi.core import RawCoreV1Api

MEMORY = "gpu.intel.com/memory.max"
MILLICORES = "gpu.intel.com/millicores"
CAPACITY_KEYS = (MEMORY, MILLICORES, TILES)
MILLICORES_PER_CARD = 1000


def capacity_for(cards: Sequence[Card]) -> dict[str, str]:
    """The node's totals for `cards`; none for no cards. How many containers share a card
    does not enter: a card offers its whole memory and 1000 millicores however many do."""
    if not cards:
        return {}
    return {
        MEMORY: str(sum(card.memory for card in cards)),
        MILLICORES: str(MILLICORES_PER_CARD * len(cards)),
        TILES: str(sum(card.tiles for card in cards)),
    }


def _status_part(node: Mapping[str, Any], part: str) -> dict[str, Any]:
    status = node.get("status")
    found = status.get(part) if isinstance(status, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    return {key: found[key] for key in CAPACITY_KEYS if key in found}


def capacity_of(node: Mapping[str, Any]) -> dict[str, Any]:
    """The node's `status.capacity` values of the keys gas node owns."""
    return _status_part(node, "capacity")


def allocatable_of(node: Mapping[str, Any]) -> dict[str, Any]:
    """The node's `status.allocatable` values of the keys gas node owns."""
    return _status_part(node, "allocatable")


def amount(value: object) -> int | None:
    """A quantity as an integer; None when it cannot be read."""
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def capacity_changes(
    current: Mapping[str, Any], desired: Mapping[str, str]
) -> dict[str, str | None]:
    """The merge patch of `status.capacity` from `current` to `desired`, over the owned keys
    only: a total whose amount differs (the API server may have rewritten `17179869184` as
    `16Gi`: the same amount), and None for an owned key `desired` no longer has."""
    changes: dict[str, str | None] = {}
    for key in CAPACITY_KEYS:
        if key in desired:
            if key not in current or amount(current[key]) != amount(desired[key]):
                changes[key] = desired[key]
        elif key in current:
            changes[key] = None
    return changes


def patch_capacity(api: RawCoreV1Api, node: str, changes: Mapping[str, str | None]) -> None:
    """One merge patch of `nodes/<node>/status` with only these keys of `capacity`; no call
    when there is nothing to change."""
    if changes:
        merge_patch(api.patch_node_status, node, {"status": {"capacity": dict(changes)}})


def apply_capacity(
    api: RawCoreV1Api, node: str, desired: Mapping[str, str]
) -> dict[str, str | None]:
    """Bring the node's owned capacity keys to `desired`; returns the changes made."""
    changes = capacity_changes(capacity_of(read_node(api, node)), desired)
    patch_capacity(api, node, changes)
    return changes
