"""A card's health as the kernel tells it, over fake sysfs trees: Healthy while discovery
finds it and its driver says nothing against it; Unbound, Vanished or Unreadable once
discovery no longer finds it, by what is left of its PCI function; and Unhealthy when xe's
RAS indicator or survivability mode, i915's debugfs or a wedged uevent says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gas.host.cards import Card
from gas.host.discovery import discover_sysfs
from gas.host.health import FINE, HEALTHY, UNHEALTHY, UNKNOWN, Health, card_health
from tests.support.fakesysfs import FakeCard, kernel_link, remove_card, unbind_card, write_sysfs


def tree(tmp_path: Path, *cards: FakeCard) -> tuple[Path, dict[str, Card]]:
    """A sysfs tree with these cards, and the cards as discovery finds them."""
    sysfs = write_sysfs(tmp_path / "sys", cards)
    return sysfs, {card.name: card for card in discover_sysfs(sysfs)}


def judged(sysfs: Path, card: Card, wedged_event: str = "") -> Health:
    """The verdict on `card`, present as discovery finds it now."""
    present = card.name in {found.name for found in discover_sysfs(sysfs)}
    return card_health(sysfs, card, present, wedged_event)


def pci_dir(sysfs: Path, card: Card) -> Path:
    """The card's PCI function folder (`devices/pci0000:00/<address>`)."""
    return (sysfs / "bus" / "pci" / "devices" / card.pci_address).resolve(strict=True)


def bind_to(sysfs: Path, card: Card, driver: str) -> None:
    """Link the card's PCI function to `driver`, as binding it to that driver does."""
    drivers = sysfs / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    kernel_link(pci_dir(sysfs, card) / "driver", drivers)


# ------------------------------------------------------------------ present cards


@pytest.mark.parametrize("driver", ["i915", "xe"])
def test_a_card_discovery_finds_with_nothing_against_it_is_healthy(
    tmp_path: Path, driver: str
) -> None:
    sysfs, cards = tree(tmp_path, FakeCard(0, driver=driver))
    health = judged(sysfs, cards["card0"])
    assert health == FINE
    assert health.status == HEALTHY and health.healthy
    assert health.reason == "" and health.message == ""


def test_xe_critical_gpu_health_makes_the_card_unhealthy(tmp_path: Path) -> None:
    sysfs, cards = tree(tmp_path, FakeCard(0, driver="xe"), FakeCard(1, driver="xe"))
    (pci_dir(sysfs, cards["card0"]) / "gpu_health").write_text("critical\n")
    health = judged(sysfs, cards["card0"])
    assert (health.status, health.reason) == (UNHEALTHY, "Critical")
    assert not health.healthy
    assert "card0" in health.message and "critical" in health.message
    # The other card's indicator is its own.
    assert judged(sysfs, cards["card1"]) == FINE


def test_xe_warning_keeps_the_card_healthy_with_the_word_in_the_message(tmp_path: Path) -> None:
    sysfs, cards = tree(tmp_path, FakeCard(0, driver="xe"))
    (pci_dir(sysfs, cards["card0"]) / "gpu_health").write_text("warning\n")
    health = judged(sysfs, cards["card0"])
    assert health.healthy and health.status == HEALTHY
    assert health.reason == ""
    assert "warning" in health.message


def test_an_ok_gpu_health_reading_is_simply_healthy(tmp_path: Path) -> None:
    sysfs, cards = tree(tmp_path, FakeCard(0, driver="xe"))
    (pci_dir(sysfs, cards["card0"]) / "gpu_health").write_text("ok\n")
    assert judged(sysfs, cards["card0"]) == FINE


def test_survivability_mode_makes_the_card_unhealthy_whatever_gpu_health_says(
    tmp_path: Path,
) -> None:
    sysfs, cards = tree(tmp_path, FakeCard(0, driver="xe"))
    pci = pci_dir(sysfs, cards["card0"])
    (pci / "survivability_mode").write_text("")
    health = judged(sysfs, cards["card0"])
    assert (health.status, health.reason) == (UNHEALTHY, "Survivability")
    assert "firmware" in health.message
    (pci / "gpu_health").write_text("warning\n")
    assert judged(sysfs, cards["card0"]).reason == "Survivability"


def test_i915_wedged_in_debugfs_marks_the_card_wedged_and_zero_does_not(tmp_path: Path) -> None:
    sysfs, cards = tree(tmp_path, FakeCard(0), FakeCard(1))
    debug = sysfs / "kernel" / "debug" / "dri"
    (debug / "0").mkdir(parents=True)
    (debug / "1").mkdir(parents=True)
    (debug / "0" / "i915_wedged").write_text("1\n")
    (debug / "1" / "i915_wedged").write_text("0\n")
    wedged = judged(sysfs, cards["card0"])
    assert (wedged.status, wedged.reason) == (UNHEALTHY, "Wedged")
    assert "card0" in wedged.message and "(1)" in wedged.message
    assert judged(sysfs, cards["card1"]) == FINE


def test_a_wedged_uevent_marks_a_present_card_wedged_naming_the_method(tmp_path: Path) -> None:
    sysfs, cards = tree(tmp_path, FakeCard(0))
    health = judged(sysfs, cards["card0"], wedged_event="rebind")
    assert (health.status, health.reason) == (UNHEALTHY, "Wedged")
    assert "WEDGED=rebind" in health.message


# ------------------------------------------------------------------ absent cards


def test_a_card_whose_driver_was_unbound_is_unbound_not_vanished(tmp_path: Path) -> None:
    fake = FakeCard(0)
    sysfs, cards = tree(tmp_path, fake, FakeCard(1))
    unbind_card(sysfs, fake)
    health = judged(sysfs, cards["card0"])
    assert (health.status, health.reason) == (UNHEALTHY, "Unbound")
    assert "0000:03:00.0" in health.message and "no driver" in health.message
    assert judged(sysfs, cards["card1"]) == FINE


def test_a_card_bound_to_vfio_pci_is_unbound(tmp_path: Path) -> None:
    fake = FakeCard(0)
    sysfs, cards = tree(tmp_path, fake)
    unbind_card(sysfs, fake)
    bind_to(sysfs, cards["card0"], "vfio-pci")
    health = judged(sysfs, cards["card0"])
    assert (health.status, health.reason) == (UNHEALTHY, "Unbound")
    assert "vfio-pci" in health.message


def test_a_card_bound_to_i915_without_a_drm_device_is_unbound(tmp_path: Path) -> None:
    fake = FakeCard(0)
    sysfs, cards = tree(tmp_path, fake)
    unbind_card(sysfs, fake)
    bind_to(sysfs, cards["card0"], "i915")
    health = judged(sysfs, cards["card0"])
    assert (health.status, health.reason) == (UNHEALTHY, "Unbound")
    assert "i915" in health.message and "no DRM device" in health.message


def test_a_card_gone_from_the_pci_bus_has_vanished(tmp_path: Path) -> None:
    fake = FakeCard(0)
    sysfs, cards = tree(tmp_path, fake, FakeCard(1))
    remove_card(sysfs, fake)
    health = judged(sysfs, cards["card0"])
    assert (health.status, health.reason) == (UNHEALTHY, "Vanished")
    assert "0000:03:00.0" in health.message


def test_an_absent_card_without_a_pci_address_has_vanished(tmp_path: Path) -> None:
    sysfs, _ = tree(tmp_path)
    card = Card("card4", 4, "0x8086", None)
    health = card_health(sysfs, card, False)
    assert (health.status, health.reason) == (UNHEALTHY, "Vanished")


def test_a_wedged_uevent_does_not_hide_that_the_card_is_gone(tmp_path: Path) -> None:
    fake = FakeCard(0)
    sysfs, cards = tree(tmp_path, fake)
    remove_card(sysfs, fake)
    assert judged(sysfs, cards["card0"], wedged_event="rebind").reason == "Vanished"


def test_a_pci_bus_that_cannot_be_read_leaves_the_card_unknown(tmp_path: Path) -> None:
    _, cards = tree(tmp_path, FakeCard(0))
    # A sysfs root whose bus/pci is not a folder: reading below it fails with an error
    # other than "no such file" (ENOTDIR), even for root, whom permissions do not stop.
    broken = tmp_path / "broken"
    (broken / "bus").mkdir(parents=True)
    (broken / "bus" / "pci").write_text("")
    health = card_health(broken, cards["card0"], False)
    assert (health.status, health.reason) == (UNKNOWN, "Unreadable")
    assert not health.healthy
    assert "card0" in health.message


def test_a_driver_entry_that_is_not_a_link_leaves_the_card_unknown(tmp_path: Path) -> None:
    fake = FakeCard(0)
    sysfs, cards = tree(tmp_path, fake)
    unbind_card(sysfs, fake)
    (pci_dir(sysfs, cards["card0"]) / "driver").write_text("")
    assert not os.path.islink(pci_dir(sysfs, cards["card0"]) / "driver")
    health = card_health(sysfs, cards["card0"], False)
    assert (health.status, health.reason) == (UNKNOWN, "Unreadable")
    assert "driver" in health.message
