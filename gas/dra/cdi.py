"""The CDI spec of one prepared claim: no I/O.

One spec file per claim (`gpu.gas.intel.com-<claim UID>.json`), one CDI device per card
the claim holds (`<claim UID>-<card>`), so two claims sharing a card never share a spec
and removing one claim's file leaves the other's alone. A device gives the container the
card's two device nodes, read-write, and the environment `gas.dra.environment` planned
for it (the tile mask, the share variables).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gas.dra.driver import CDI_KIND, CDI_VERSION, DRIVER
from gas.host.cards import Card


def spec_file_name(claim_uid: str) -> str:
    return f"{DRIVER}-{claim_uid}.json"


def device_name(claim_uid: str, card: str) -> str:
    return f"{claim_uid}-{card}"


def qualified_name(claim_uid: str, card: str) -> str:
    """The CDI device ID the kubelet hands the runtime."""
    return f"{CDI_KIND}={device_name(claim_uid, card)}"


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


def claim_spec(
    claim_uid: str, devices: Sequence[tuple[Card, Mapping[str, str]]], devfs_root: str
) -> dict[str, Any]:
    """The spec of a claim's devices: each card once, in card-number order, with its
    environment (sorted by name, so the same plan writes the same file)."""
    entries = []
    for card, environment in sorted(devices, key=lambda d: d[0].number):
        edits: dict[str, Any] = {"deviceNodes": _device_nodes(card, devfs_root)}
        if environment:
            edits["env"] = [f"{name}={environment[name]}" for name in sorted(environment)]
        entries.append({"name": device_name(claim_uid, card.name), "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": entries}
