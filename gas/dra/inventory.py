"""The cards `gas dra` publishes and their health: the cards discovery finds now, and those
it found before that are gone but still matter.

A card that goes away is kept, Unhealthy, while its PCI function is still there (its
driver was unbound: it may be bound again) or a prepared claim still holds it (the pods
on it must be told); the slice then carries it with a taint, and the kubelet's health
stream says it to those pods. It is dropped once it has vanished from the PCI bus and no
claim holds it, or when the same PCI function is back under another card name.

The cards seen are kept in the state directory (`cards.json`), so that a restart while a
card is away still knows it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gas.dra.files import write_json
from gas.host.cards import Card
from gas.host.health import UNKNOWN, Health

log = logging.getLogger(__name__)

CARDS_FILE = "cards.json"


@dataclass(frozen=True)
class Device:
    """A card as published: its facts (as last discovered), its health, and whether
    discovery finds it now."""

    card: Card
    health: Health
    present: bool


Judge = Callable[[Card, bool, str], Health]
"""`judge(card, present, wedged_event)`: the card's health (`gas.host.health.card_health`
with the sysfs root bound)."""


def devices(
    known: Mapping[str, Card],
    present: Sequence[Card] | None,
    held: Collection[str],
    judge: Callable[[Card, bool], Health],
    last_present: Collection[str] = (),
) -> dict[str, Device]:
    """The devices to publish: every card `present`, and the `known` cards gone from it that
    are kept. `present` None: discovery failed, and every known card is of Unknown health,
    present as far as the last discovery that worked (`last_present`) knew."""
    if present is None:
        unknown = Health(UNKNOWN, "Unreadable", "the cards cannot be discovered")
        return {name: Device(card, unknown, name in last_present) for name, card in known.items()}
    found = {card.name: Device(card, judge(card, True), True) for card in present}
    addresses = {card.pci_address for card in present if card.pci_address}
    for name, card in known.items():
        if name in found or (card.pci_address and card.pci_address in addresses):
            continue
        health = judge(card, False)
        if health.reason == "Vanished" and name not in held:
            continue
        found[name] = Device(card, health, False)
    return found


def card_record(card: Card) -> dict[str, Any]:
    return asdict(card)


def card_from(record: Mapping[str, Any]) -> Card:
    numa = record.get("numa_node")
    render = record.get("render_node")
    return Card(
        name=str(record["name"]),
        number=int(record["number"]),
        vendor=str(record.get("vendor", "")),
        numa_node=int(numa) if isinstance(numa, int) else None,
        pci_address=str(record.get("pci_address", "")),
        render_node=str(render) if render else None,
        driver=str(record.get("driver", "")),
        tiles=int(record.get("tiles", 1)),
        memory=int(record.get("memory", 0)),
    )


class Inventory:
    """The devices of the node, kept up to date from discovery and the prepared claims;
    `on_change(devices)` is called after each change (outside the lock)."""

    def __init__(self, directory: str, judge: Judge) -> None:
        self.path = Path(directory) / CARDS_FILE
        self._judge = judge
        self._lock = threading.Lock()
        self._known: dict[str, Card] = self._load()
        self._present: list[Card] | None = None
        """What the last discovery found; None when it failed (or none was made yet)."""
        self._last_present: set[str] = set()
        self._wedged: dict[str, str] = {}
        self._devices: dict[str, Device] = {}
        self._listeners: list[Callable[[Mapping[str, Device]], None]] = []

    def _load(self) -> dict[str, Card]:
        try:
            records = json.loads(self.path.read_text(encoding="utf-8"))
            return {card.name: card for card in map(card_from, records["cards"])}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "the cards seen before are forgotten: %s cannot be read: %s", self.path, exc
            )
            return {}

    def listen(self, listener: Callable[[Mapping[str, Device]], None]) -> None:
        self._listeners.append(listener)

    def devices(self) -> dict[str, Device]:
        with self._lock:
            return dict(self._devices)

    def wedged(self, card: str, method: str) -> None:
        """A wedged uevent from `card`; it stands until the card is added again."""
        with self._lock:
            self._wedged[card] = method

    def added(self, card: str) -> None:
        with self._lock:
            self._wedged.pop(card, None)

    def update(self, present: Sequence[Card] | None, held: Collection[str]) -> bool:
        """Recompute from discovery (None: it failed) and the cards prepared claims hold;
        True when the devices changed."""
        with self._lock:
            self._present = None if present is None else list(present)
            if present is not None:
                self._last_present = {card.name for card in present}
            wedged = dict(self._wedged)

            def judge(card: Card, is_present: bool) -> Health:
                return self._judge(card, is_present, wedged.get(card.name, ""))

            found = devices(self._known, present, held, judge, self._last_present)
            changed = found != self._devices
            self._devices = found
            known = {name: device.card for name, device in found.items()}
            if present is not None and known != self._known:
                self._known = known
                self._save(known)
            snapshot = dict(found)
        if changed:
            for listener in self._listeners:
                listener(snapshot)
        return changed

    def refresh(self, held: Collection[str]) -> bool:
        """Judge the cards again (health read afresh), with the last discovery (still
        Unknown if it failed)."""
        with self._lock:
            present = self._present
        return self.update(present, held)

    def _save(self, known: Mapping[str, Card]) -> None:
        try:
            write_json(self.path, {"cards": [card_record(c) for c in known.values()]})
        except OSError as exc:
            log.warning("the cards seen are not kept across restarts: %s: %s", self.path, exc)
