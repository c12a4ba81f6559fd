"""The cards `gas dra` publishes, over fake sysfs trees: every card discovery finds, and of
those it found before, the unbound ones and those a claim still holds, Unhealthy; a card
gone from the bus that nothing holds, or back under another name, dropped; every card
Unknown while discovery fails. The inventory tells its listeners of changes only, keeps
the cards seen across restarts in cards.json, and forgets a cards.json it cannot read."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from gas.dra.inventory import CARDS_FILE, Device, Inventory, devices
from gas.host.cards import Card
from gas.host.discovery import discover_sysfs
from gas.host.health import FINE, HEALTHY, UNHEALTHY, UNKNOWN, Health, card_health
from tests.support.fakesysfs import (
    FakeCard,
    add_card,
    bind_card,
    remove_card,
    unbind_card,
    write_sysfs,
)


def judge_of(sysfs: Path) -> Callable[[Card, bool], Health]:
    def judge(card: Card, present: bool) -> Health:
        return card_health(sysfs, card, present)

    return judge


def inventory_judge(sysfs: Path) -> Callable[[Card, bool, str], Health]:
    def judge(card: Card, present: bool, wedged: str) -> Health:
        return card_health(sysfs, card, present, wedged)

    return judge


def by_name(cards: list[Card]) -> dict[str, Card]:
    return {card.name: card for card in cards}


def summary(found: Mapping[str, Device]) -> dict[str, tuple[str, str, bool]]:
    """Each device's health status, reason, and whether discovery finds it."""
    return {
        name: (device.health.status, device.health.reason, device.present)
        for name, device in found.items()
    }


class Recorder:
    """A listener that keeps each snapshot it is given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Device]] = []

    def __call__(self, found: Mapping[str, Device]) -> None:
        self.calls.append(dict(found))


# ------------------------------------------------------------------ devices()


def test_every_card_discovery_finds_is_published_healthy(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1, driver="xe")])
    present = discover_sysfs(sysfs)
    found = devices({}, present, (), judge_of(sysfs))
    assert summary(found) == {
        "card0": (HEALTHY, "", True),
        "card1": (HEALTHY, "", True),
    }
    assert [d.card for d in found.values()] == present


def test_a_vanished_card_no_claim_holds_is_dropped(tmp_path: Path) -> None:
    gone = FakeCard(1)
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), gone])
    known = by_name(discover_sysfs(sysfs))
    remove_card(sysfs, gone)
    found = devices(known, discover_sysfs(sysfs), (), judge_of(sysfs))
    assert summary(found) == {"card0": (HEALTHY, "", True)}


def test_a_vanished_card_a_claim_holds_is_kept_unhealthy(tmp_path: Path) -> None:
    gone = FakeCard(1)
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), gone])
    known = by_name(discover_sysfs(sysfs))
    remove_card(sysfs, gone)
    found = devices(known, discover_sysfs(sysfs), {"card1"}, judge_of(sysfs))
    assert summary(found) == {
        "card0": (HEALTHY, "", True),
        "card1": (UNHEALTHY, "Vanished", False),
    }
    # Its facts are those last discovered.
    assert found["card1"].card == known["card1"]


def test_an_unbound_card_is_kept_even_when_no_claim_holds_it(tmp_path: Path) -> None:
    unbound = FakeCard(1)
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), unbound])
    known = by_name(discover_sysfs(sysfs))
    unbind_card(sysfs, unbound)
    found = devices(known, discover_sysfs(sysfs), (), judge_of(sysfs))
    assert summary(found) == {
        "card0": (HEALTHY, "", True),
        "card1": (UNHEALTHY, "Unbound", False),
    }


def test_a_card_back_under_another_name_drops_the_old_name(tmp_path: Path) -> None:
    before = FakeCard(1, bus=0x20)
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), before])
    known = by_name(discover_sysfs(sysfs))
    # The same PCI function, rebound, comes back as card2.
    remove_card(sysfs, before)
    add_card(sysfs, FakeCard(2, bus=0x20))
    present = discover_sysfs(sysfs)
    # Held or not, the old name goes: the card is published under its new one.
    found = devices(known, present, {"card1"}, judge_of(sysfs))
    assert summary(found) == {
        "card0": (HEALTHY, "", True),
        "card2": (HEALTHY, "", True),
    }
    assert found["card2"].card.pci_address == known["card1"].pci_address


def test_while_discovery_fails_every_known_card_is_unknown(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1)])
    known = by_name(discover_sysfs(sysfs))
    asked: list[str] = []

    def judge(card: Card, present: bool) -> Health:
        asked.append(card.name)
        return FINE

    found = devices(known, None, (), judge)
    assert summary(found) == {
        "card0": (UNKNOWN, "Unreadable", False),
        "card1": (UNKNOWN, "Unreadable", False),
    }
    assert asked == []  # nothing is judged when nothing could be discovered
    assert devices({}, None, (), judge) == {}


# ------------------------------------------------------------------ Inventory


def test_listeners_hear_of_changes_only(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    inventory = Inventory(str(tmp_path / "state"), inventory_judge(sysfs))
    heard = Recorder()
    inventory.listen(heard)
    cards = discover_sysfs(sysfs)
    assert inventory.update(cards, ()) is True
    assert inventory.update(cards, ()) is False
    assert inventory.refresh(()) is False
    assert len(heard.calls) == 1
    assert summary(heard.calls[0]) == {"card0": (HEALTHY, "", True)}
    assert inventory.devices() == heard.calls[0]


def test_a_health_change_read_afresh_is_heard(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0, driver="xe")])
    inventory = Inventory(str(tmp_path / "state"), inventory_judge(sysfs))
    heard = Recorder()
    inventory.listen(heard)
    inventory.update(discover_sysfs(sysfs), ())
    indicator = sysfs / "bus" / "pci" / "devices" / "0000:03:00.0" / "gpu_health"
    indicator.write_text("critical\n")
    assert inventory.refresh(()) is True
    assert summary(heard.calls[-1]) == {"card0": (UNHEALTHY, "Critical", True)}
    indicator.write_text("ok\n")
    assert inventory.refresh(()) is True
    assert summary(heard.calls[-1]) == {"card0": (HEALTHY, "", True)}
    assert len(heard.calls) == 3


def test_a_wedged_mark_stands_until_the_card_is_added_again(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1)])
    inventory = Inventory(str(tmp_path / "state"), inventory_judge(sysfs))
    heard = Recorder()
    inventory.listen(heard)
    cards = discover_sysfs(sysfs)
    inventory.update(cards, ())
    inventory.wedged("card0", "rebind")
    assert inventory.refresh(()) is True
    assert summary(inventory.devices()) == {
        "card0": (UNHEALTHY, "Wedged", True),
        "card1": (HEALTHY, "", True),
    }
    assert "WEDGED=rebind" in inventory.devices()["card0"].health.message
    # A rediscovery of the same cards keeps the mark: only an add clears it.
    assert inventory.update(cards, ()) is False
    inventory.added("card0")
    assert inventory.refresh(()) is True
    assert summary(inventory.devices())["card0"] == (HEALTHY, "", True)
    assert len(heard.calls) == 3


def test_an_added_card_never_marked_changes_nothing(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    inventory = Inventory(str(tmp_path / "state"), inventory_judge(sysfs))
    inventory.update(discover_sysfs(sysfs), ())
    inventory.added("card0")
    inventory.added("card7")
    assert inventory.refresh(()) is False


def test_a_card_unbound_and_bound_again_is_heard_both_ways(tmp_path: Path) -> None:
    fake = FakeCard(0)
    sysfs = write_sysfs(tmp_path / "sys", [fake])
    inventory = Inventory(str(tmp_path / "state"), inventory_judge(sysfs))
    heard = Recorder()
    inventory.listen(heard)
    inventory.update(discover_sysfs(sysfs), ())
    unbind_card(sysfs, fake)
    assert inventory.update(discover_sysfs(sysfs), ()) is True
    assert summary(heard.calls[-1]) == {"card0": (UNHEALTHY, "Unbound", False)}
    bind_card(sysfs, fake)
    assert inventory.update(discover_sysfs(sysfs), ()) is True
    assert summary(heard.calls[-1]) == {"card0": (HEALTHY, "", True)}


def test_the_cards_seen_are_known_again_after_a_restart(tmp_path: Path) -> None:
    away = FakeCard(1, driver="xe", tiles=2, numa=None)
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), away])
    state = str(tmp_path / "state")
    first = Inventory(state, inventory_judge(sysfs))
    cards = discover_sysfs(sysfs)
    first.update(cards, ())
    written = json.loads((tmp_path / "state" / CARDS_FILE).read_text())
    assert sorted(record["name"] for record in written["cards"]) == ["card0", "card1"]
    # The card goes while gas dra is down; a claim still holds it.
    remove_card(sysfs, away)
    second = Inventory(state, inventory_judge(sysfs))
    assert second.update(discover_sysfs(sysfs), {"card1"}) is True
    found = second.devices()
    assert summary(found) == {
        "card0": (HEALTHY, "", True),
        "card1": (UNHEALTHY, "Vanished", False),
    }
    # Every fact comes back as it was discovered.
    assert found["card1"].card == by_name(cards)["card1"]


def test_a_card_dropped_is_forgotten_across_restarts(tmp_path: Path) -> None:
    gone = FakeCard(1)
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), gone])
    state = str(tmp_path / "state")
    first = Inventory(state, inventory_judge(sysfs))
    first.update(discover_sysfs(sysfs), ())
    remove_card(sysfs, gone)
    first.update(discover_sysfs(sysfs), ())
    second = Inventory(state, inventory_judge(sysfs))
    second.update(None, ())
    assert list(second.devices()) == ["card0"]


def test_a_failed_discovery_neither_writes_nor_forgets_the_cards_seen(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1)])
    state = tmp_path / "state"
    first = Inventory(str(state), inventory_judge(sysfs))
    first.update(discover_sysfs(sysfs), ())
    before = (state / CARDS_FILE).read_text()
    assert first.update(None, ()) is True
    # Unknown health; present as far as the last discovery that worked knew, so that
    # claims on them are still prepared.
    assert summary(first.devices()) == {
        "card0": (UNKNOWN, "Unreadable", True),
        "card1": (UNKNOWN, "Unreadable", True),
    }
    assert (state / CARDS_FILE).read_text() == before
    second = Inventory(str(state), inventory_judge(sysfs))
    second.update(None, ())
    assert sorted(second.devices()) == ["card0", "card1"]


def test_a_health_refresh_after_a_failed_discovery_keeps_the_cards_unknown(
    tmp_path: Path,
) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    inventory = Inventory(str(tmp_path / "state"), inventory_judge(sysfs))
    inventory.update(discover_sysfs(sysfs), ())
    inventory.update(None, ())
    inventory.refresh(())
    assert summary(inventory.devices()) == {"card0": (UNKNOWN, "Unreadable", True)}


@pytest.mark.parametrize(
    "content",
    ["{not json", "[]", '{"cards": [{"name": "card0"}]}', '{"cards": 3}', '{"other": []}'],
)
def test_a_cards_file_that_cannot_be_read_is_forgotten_with_a_warning(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / CARDS_FILE).write_text(content)
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(3)])
    with caplog.at_level(logging.WARNING, logger="gas.dra.inventory"):
        inventory = Inventory(str(state), inventory_judge(sysfs))
    assert any(
        "forgotten" in r.getMessage() and CARDS_FILE in r.getMessage() for r in caplog.records
    )
    inventory.update(None, ())
    assert inventory.devices() == {}
    # The next discovery writes it anew.
    inventory.update(discover_sysfs(sysfs), ())
    written = json.loads((state / CARDS_FILE).read_text())
    assert [record["name"] for record in written["cards"]] == ["card3"]


def test_no_cards_file_is_no_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [])
    with caplog.at_level(logging.WARNING, logger="gas.dra.inventory"):
        inventory = Inventory(str(tmp_path / "state"), inventory_judge(sysfs))
    assert caplog.records == []
    assert inventory.update(None, ()) is False
    assert inventory.devices() == {}
