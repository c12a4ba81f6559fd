"""The CDI spec of one prepared claim: no I/O.

One spec file per claim (`gpu.gas.intel.com-<claim UID>.json`), one CDI device per card
the claim holds (`<claim UID>-<card>`), so two claims sharing a card never share a spec
and removing one claim's file leaves the other's alone. A device gives the container the
card's two device nodes, read-write, and, when the claim holds only some tiles of a card,
`ZE_AFFINITY_MASK` naming those tiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gas.dra.driver import CDI_KIND, CDI_VERSION, DRIVER
from gas.node.cards import Card

AFFINITY = "ZE_AFFINITY_MASK"


@dataclass(frozen=True)
class Grant:
    """A card a claim holds, and its tiles: empty for the whole card."""

    card: Card
    tiles: tuple[int, ...] = ()


def spec_file_name(claim_uid: str) -> str:
    return f"{DRIVER}-{claim_uid}.json"


def device_name(claim_uid: str, card: str) -> str:
    return f"{claim_uid}-{card}"


def qualified_name(claim_uid: str, card: str) -> str:
    """The CDI device ID the kubelet hands the runtime."""
    return f"{CDI_KIND}={device_name(claim_uid, card)}"


def _by_card(grants: Sequence[Grant]) -> list[Grant]:
    """One grant per card, card-number order; a card held twice by one claim (two requests
    of it) holds the union of their tiles, or the whole card if either does."""
    merged: dict[str, Grant] = {}
    for grant in grants:
        seen = merged.get(grant.card.name)
        if seen is None:
            merged[grant.card.name] = grant
        elif not seen.tiles or not grant.tiles:
            merged[grant.card.name] = Grant(grant.card)
        else:
            merged[grant.card.name] = Grant(grant.card, tuple(sorted({*seen.tiles, *grant.tiles})))
    return sorted(merged.values(), key=lambda g: g.card.number)


def tile_mask(grants: Sequence[Grant]) -> str | None:
    """The Level Zero mask of the claim's tiles, as the container enumerates them (flat
    hierarchy: every tile of every visible card, cards in number order): tile t of a card
    whose cards before it have n tiles in all is n+t. None when every card is whole."""
    cards = _by_card(grants)
    if not any(g.tiles and len(g.tiles) < g.card.tiles for g in cards):
        return None
    indices: list[str] = []
    offset = 0
    for grant in cards:
        chosen = grant.tiles or tuple(range(grant.card.tiles))
        indices.extend(str(offset + t) for t in chosen)
        offset += grant.card.tiles
    return ",".join(indices)


def _device_nodes(card: Card, devfs_root: str) -> list[dict[str, Any]]:
    root = devfs_root.rstrip("/") or "/"
    nodes = [card.name] + ([card.render_node] if card.render_node else [])
    return [
        {
            "path": f"/dev/dri/{name}",
            "hostPath": f"{root}/dri/{name}" if root != "/" else f"/dri/{name}",
            "permissions": "rw",
        }
        for name in nodes
    ]


def claim_spec(claim_uid: str, grants: Sequence[Grant], devfs_root: str) -> dict[str, Any]:
    mask = tile_mask(grants)
    devices = []
    for grant in _by_card(grants):
        edits: dict[str, Any] = {"deviceNodes": _device_nodes(grant.card, devfs_root)}
        if mask is not None:
            edits["env"] = [f"{AFFINITY}={mask}"]
        devices.append({"name": device_name(claim_uid, grant.card.name), "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}
