"""What one container receives: its cards' device nodes, the tile mask, the device IDs.

Pure: from a container's segment of `gas-container-cards` / `gas-container-tiles` (as gas
wrote them at bind time) and the node's `Card` records, computes

- the device specs: `/dev/dri/cardN` and the card's own `renderD<M>` (from the `Card`
  record, never computed from N), read-write;
- `ZE_AFFINITY_MASK` for the tiles: in the FLAT/COMBINED device hierarchy (Level Zero's
  default) each tile is one device, numbered across the container's cards in order, so
  tile t of the i-th card is `i*tilesPerCard+t`; in COMPOSITE mode (the container's env
  sets `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE`) it is `i.t`. Not set when the cards have one
  tile each: there is nothing to select;
- the preferred device IDs for `GetPreferredAllocation`: from the IDs the kubelet offers,
  the right number of shares of each of the container's cards.

The i-th card is counted in numeric card order, the order in which the container sees its
devices.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gas.core.model import sort_cards
from gas.host.cards import Card
from gas.node.devices import DeviceIdError, id_order, ids_by_card

ZE_AFFINITY_MASK = "ZE_AFFINITY_MASK"
ZE_FLAT_DEVICE_HIERARCHY = "ZE_FLAT_DEVICE_HIERARCHY"
COMPOSITE = "COMPOSITE"
DRI = "dri"
CONTAINER_DRI = "/dev/dri"
PERMISSIONS = "rw"

ContainerTiles = Sequence[tuple[str, Sequence[int]]]
"""One container's segment of `gas-container-tiles`: (card, tile indices) per card."""


class AllocationError(ValueError):
    """The container cannot be given what gas chose; the message says why."""


@dataclass(frozen=True)
class DeviceNode:
    host_path: str
    container_path: str
    permissions: str = PERMISSIONS


@dataclass(frozen=True)
class ContainerGrant:
    """Everything the plugin hands the kubelet for one container."""

    cards: tuple[str, ...]
    devices: tuple[DeviceNode, ...]
    envs: Mapping[str, str] = field(default_factory=dict)


def device_nodes(
    cards: Iterable[str], known: Mapping[str, Card], devfs_root: str = "/dev"
) -> tuple[DeviceNode, ...]:
    """The card and render nodes of `cards`, host paths under `devfs_root`."""
    nodes = []
    for name in sort_cards(cards):
        card = known.get(name)
        if card is None:
            raise AllocationError(f"{name} is not a card of this node (gone, or never found)")
        entries = [name] + ([card.render_node] if card.render_node else [])
        for entry in entries:
            nodes.append(
                DeviceNode(
                    host_path=os.path.join(devfs_root, DRI, entry),
                    container_path=f"{CONTAINER_DRI}/{entry}",
                )
            )
    return tuple(nodes)


def composite_hierarchy(env: Mapping[str, str]) -> bool:
    return env.get(ZE_FLAT_DEVICE_HIERARCHY, "").strip().upper() == COMPOSITE


def affinity_mask(
    tiles: ContainerTiles,
    cards: Sequence[str],
    tiles_per_card: Mapping[str, int],
    composite: bool = False,
) -> str | None:
    """`ZE_AFFINITY_MASK` for the container's tiles, or None when none is needed.

    `tiles_per_card` is each card's tile count; FLAT numbering adds up the tiles of the
    cards before (`i*tilesPerCard+t` when every card has the same count).
    """
    order = sort_cards(cards)
    if not tiles or all(tiles_per_card.get(card, 1) <= 1 for card in order):
        return None
    wanted = {card: sorted(set(indices)) for card, indices in tiles}
    parts: list[str] = []
    offset = 0
    for index, card in enumerate(order):
        count = max(tiles_per_card.get(card, 1), 1)
        for tile in wanted.pop(card, ()):
            if not 0 <= tile < count:
                raise AllocationError(f"{card} has {count} tile(s), gas gave tile gt{tile}")
            parts.append(f"{index}.{tile}" if composite else str(offset + tile))
        offset += count
    if wanted:
        raise AllocationError(
            f"gas-container-tiles names {', '.join(sort_cards(wanted))}, "
            "not among the container's cards"
        )
    return ",".join(parts) or None


def grant(
    cards: Sequence[str],
    tiles: ContainerTiles,
    known: Mapping[str, Card],
    *,
    composite: bool = False,
    devfs_root: str = "/dev",
) -> ContainerGrant:
    """The devices and environment of a container given `cards` (and `tiles`)."""
    devices = device_nodes(cards, known, devfs_root)
    envs: dict[str, str] = {}
    per_card = {name: known[name].tiles for name in cards}
    mask = affinity_mask(tiles, cards, per_card, composite)
    if mask is not None:
        envs[ZE_AFFINITY_MASK] = mask
    return ContainerGrant(cards=sort_cards(cards), devices=devices, envs=envs)


def shares_per_card(cards: Sequence[str], size: int) -> int:
    """How many device IDs of each card a container asking for `size` takes: its devices
    spread evenly over its cards (one each, as gas gives one card per GPU asked for)."""
    if not cards or size <= 0 or size % len(cards):
        raise AllocationError(
            f"{size} device(s) cannot be spread evenly over {len(cards)} card(s) "
            f"({', '.join(cards) or 'none'})"
        )
    return size // len(cards)


def preferred_ids(
    cards: Sequence[str], size: int, available: Iterable[str], must_include: Iterable[str] = ()
) -> list[str] | None:
    """`size` device IDs from `available` covering `cards` evenly, the `must_include` ones
    first, then the lowest shares; None when `available` lacks enough shares of a card or
    a must-include ID is on another card."""
    each = shares_per_card(cards, size)
    try:
        offered = ids_by_card(available)
        required = ids_by_card(must_include)
    except DeviceIdError:
        return None
    if set(required) - set(cards):
        return None
    chosen: list[str] = []
    for card in sort_cards(cards):
        first = required.get(card, [])
        rest = [i for i in offered.get(card, []) if i not in first]
        picked = (first + rest)[:each]
        if len(picked) < each or len(first) > each:
            return None
        chosen.extend(picked)
    return sorted(chosen, key=id_order)


def mismatch(cards: Sequence[str], ids: Iterable[str]) -> str | None:
    """Why the device IDs the kubelet chose are not `cards` with an even share count each;
    None when they are."""
    ids = list(ids)
    try:
        got = ids_by_card(ids)
        each = shares_per_card(cards, len(ids))
    except (DeviceIdError, AllocationError) as exc:
        return str(exc)
    if set(got) != set(cards):
        return (
            f"the kubelet chose devices on {', '.join(sort_cards(got)) or 'no card'}, "
            f"gas chose {', '.join(sort_cards(cards))}"
        )
    uneven = [card for card, group in got.items() if len(group) != each]
    if uneven:
        return f"the kubelet chose {len(ids)} devices unevenly over {', '.join(sort_cards(got))}"
    return None
