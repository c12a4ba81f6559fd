"""The devices the plugin advertises: N shares per card, named `<card>-<share>`.

Sharing one card between containers works by advertising several device IDs for it
(`card0-0` ... `card0-9` with 10 shares): the kubelet counts them as separate devices, and
each container asking for `gpu.intel.com/i915: 1` takes one. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gas.core.model import I915, XE, card_number, sort_cards
from gas.host.cards import Card

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEFAULT_SHARES_PER_CARD = 10
MAX_SHARES_PER_CARD = 1000
"""More shares than this is a typo, not a plan: each is a device the kubelet tracks."""

DRIVER_RESOURCES = {"i915": I915, "xe": XE}
"""The card's kernel driver decides the resource its shares are advertised under."""

_DEVICE_ID = re.compile(r"^(card(?:0|[1-9][0-9]{0,5}))-(0|[1-9][0-9]{0,5})$")


class DeviceIdError(ValueError):
    """A device ID that is not `<card>-<share>`: never one this plugin advertised."""


def device_id(card: str, share: int) -> str:
    return f"{card}-{share}"


def parse_device_id(value: str) -> tuple[str, int]:
    """`card3-7` -> (`card3`, 7)."""
    match = _DEVICE_ID.match(value)
    if match is None:
        raise DeviceIdError(f"device ID {value!r} is not <card>-<share> (like card0-3)")
    return match.group(1), int(match.group(2))


def card_of(value: str) -> str:
    return parse_device_id(value)[0]


def id_order(value: str) -> tuple[int, int, str]:
    """Numeric order of device IDs: card2-10 after card2-9, card10-0 after card2-*."""
    match = _DEVICE_ID.match(value)
    if match is None:
        return (1 << 30, 0, value)
    return (card_number(match.group(1)), int(match.group(2)), value)


def ids_by_card(ids: Iterable[str]) -> dict[str, list[str]]:
    """Device IDs grouped by card, each group in share order; DeviceIdError on a bad ID."""
    grouped: dict[str, list[str]] = {}
    for value in ids:
        grouped.setdefault(card_of(value), []).append(value)
    return {card: sorted(group, key=id_order) for card, group in grouped.items()}


def resource_of(card: Card) -> str | None:
    """The extended resource a card's shares belong to; None for a card on another driver
    (vfio-pci for a passed-through card, or no driver yet), which is not advertised."""
    return DRIVER_RESOURCES.get(card.driver)


def cards_by_resource(cards: Iterable[Card]) -> dict[str, list[Card]]:
    grouped: dict[str, list[Card]] = {}
    for card in cards:
        resource = resource_of(card)
        if resource is not None:
            grouped.setdefault(resource, []).append(card)
    return {
        resource: sorted(group, key=lambda c: (c.number, c.name))
        for resource, group in grouped.items()
    }


@dataclass(frozen=True)
class Device:
    """One advertised device: a share of a card, with the card's health and NUMA node."""

    id: str
    card: str
    healthy: bool
    numa_node: int | None


def device_list(
    cards: Sequence[Card], shares_per_card: int, unhealthy: Iterable[str] = ()
) -> list[Device]:
    """Every share of every card, in card then share order. A card named in `unhealthy`
    (vanished from udev) keeps its IDs, marked Unhealthy: the kubelet then stops giving
    them out but keeps the containers that hold them accounted."""
    if not 1 <= shares_per_card <= MAX_SHARES_PER_CARD:
        raise ValueError(f"shares per card must be 1..{MAX_SHARES_PER_CARD}, not {shares_per_card}")
    bad = frozenset(unhealthy)
    devices = []
    for card in sorted(cards, key=lambda c: (c.number, c.name)):
        for share in range(shares_per_card):
            devices.append(
                Device(
                    id=device_id(card.name, share),
                    card=card.name,
                    healthy=card.name not in bad,
                    numa_node=card.numa_node,
                )
            )
    return devices


def cards_named(cards: Iterable[Card]) -> Mapping[str, Card]:
    return {card.name: card for card in cards}


def card_names(cards: Iterable[Card]) -> tuple[str, ...]:
    return sort_cards(card.name for card in cards)
