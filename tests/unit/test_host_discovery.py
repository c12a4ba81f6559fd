"""Node discovery over fake sysfs trees: every fact of a card as sysfs states it, SR-IOV
physical functions and other vendors left out, the udev backend agreeing with the sysfs
one, and the watcher following a card unplugged and plugged back."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from gas.host import discovery
from gas.host.cards import Card
from gas.host.discovery import (
    discover_sysfs,
    discover_udev,
    memory_options,
    pci_cards_sysfs,
)
from gas.host.errors import NodeError
from gas.host.watch import CardWatcher
from tests.support.fakesysfs import GIB, FakeCard, add_card, remove_card, write_sysfs


def names(cards: list[Card]) -> list[str]:
    return [c.name for c in cards]


# ---------------------------------------------------------------- the fake tree itself


def test_the_fake_tree_is_linked_like_the_kernels(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    assert os.readlink(sysfs / "class/drm/card0") == (
        "../../devices/pci0000:00/0000:03:00.0/drm/card0"
    )
    pci = sysfs / "devices/pci0000:00/0000:03:00.0"
    assert os.readlink(pci / "drm/card0/device") == "../../../0000:03:00.0"
    assert os.readlink(pci / "driver") == "../../../bus/pci/drivers/i915"
    assert sorted(os.listdir(sysfs / "class/drm")) == ["card0", "card0-DP-1", "renderD128"]
    assert sorted(os.listdir(pci / "drm")) == ["card0", "renderD128"]


# ---------------------------------------------------------------- cards and their facts


@pytest.mark.parametrize("count", [1, 2, 8])
def test_every_fact_of_every_card(tmp_path: Path, count: int) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(n, numa=n % 2) for n in range(count)])
    assert discover_sysfs(sysfs) == [
        Card(
            f"card{n}",
            n,
            "0x8086",
            n % 2,
            f"0000:{n + 3:02x}:00.0",
            render_node=f"renderD{128 + n}",
            driver="i915",
            tiles=1,
            memory=16 * GIB,
        )
        for n in range(count)
    ]


def test_no_drm_class_is_no_cards(tmp_path: Path) -> None:
    assert discover_sysfs(tmp_path) == []


def test_i915_and_xe_cards_with_their_tiles(tmp_path: Path) -> None:
    sysfs = write_sysfs(
        tmp_path / "sys",
        [
            FakeCard(0, "i915", tiles=2, lmem_per_tile=8 * GIB),
            FakeCard(1, "xe", tiles=4, lmem_per_tile=None),
            FakeCard(2, "i915", tiles=0),  # a driver that lists no gt folders: one tile
            FakeCard(3, "xe", tiles=0, lmem_per_tile=4 * GIB),
        ],
    )
    cards = discover_sysfs(sysfs, memory_override=12 * GIB)
    assert [(c.driver, c.tiles, c.memory) for c in cards] == [
        ("i915", 2, 16 * GIB),
        ("xe", 4, 12 * GIB),  # no lmem_total_bytes: the override
        ("i915", 1, 16 * GIB),
        ("xe", 1, 4 * GIB),
    ]


def test_tiles_are_counted_by_the_cards_driver(tmp_path: Path) -> None:
    """An i915 card's tiles are its gt folders: a stray `tile0` beside its device (as an
    xe card would have) is not one of them, and the other way round."""
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0, "i915", tiles=2), FakeCard(1, "xe")])
    (sysfs / "devices/pci0000:00/0000:03:00.0/tile0").mkdir()
    (sysfs / "devices/pci0000:00/0000:04:00.0/drm/card1/gt/gt0").mkdir(parents=True)
    (sysfs / "devices/pci0000:00/0000:04:00.0/drm/card1/gt/gt1").mkdir(parents=True)
    assert [c.tiles for c in discover_sysfs(sysfs)] == [2, 1]


def test_render_node_is_read_never_computed(tmp_path: Path) -> None:
    sysfs = write_sysfs(
        tmp_path / "sys",
        [FakeCard(0, render_minor=129), FakeCard(1, render_minor=128), FakeCard(2, render=False)],
    )
    assert [c.render_node for c in discover_sysfs(sysfs)] == ["renderD129", "renderD128", None]


def test_memory_is_per_tile_times_tiles_less_the_reserve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sysfs = write_sysfs(
        tmp_path / "sys",
        [FakeCard(0, tiles=2, lmem_per_tile=16 * GIB), FakeCard(1, lmem_per_tile=GIB // 2)],
    )
    with caplog.at_level(logging.WARNING):
        cards = discover_sysfs(sysfs, memory_reserved=GIB, memory_override=99 * GIB)
    assert [c.memory for c in cards] == [31 * GIB, 0]
    assert "card1: reserved memory 1Gi exceeds its local memory 512Mi" in caplog.text


def test_integrated_gpu_gets_the_override(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0, lmem_per_tile=None, bus=0, numa=-1)])
    (bare,) = discover_sysfs(sysfs)
    assert (bare.pci_address, bare.numa_node, bare.memory) == ("0000:00:00.0", None, 0)
    (card,) = discover_sysfs(sysfs, memory_reserved=GIB, memory_override=4 * GIB)
    assert card.memory == 4 * GIB  # the override is the usable amount: nothing is reserved


def test_unreadable_memory_is_an_error_not_a_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    (sysfs / "class/drm/card0/lmem_total_bytes").write_text("lots\n")
    with caplog.at_level(logging.ERROR):
        (card,) = discover_sysfs(sysfs, memory_override=2 * GIB)
    assert card.memory == 2 * GIB
    assert "card0: lmem_total_bytes 'lots' is not a number of bytes" in caplog.text


def test_hex_memory_as_the_kernel_may_print_it(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    (sysfs / "class/drm/card0/lmem_total_bytes").write_text("0x400000000\n")
    assert discover_sysfs(sysfs)[0].memory == 16 * GIB


def test_a_card_without_driver(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0, driver="")])
    with caplog.at_level(logging.WARNING):
        (card,) = discover_sysfs(sysfs)
    assert card.driver == ""
    assert "card0: driver '(none)' is neither i915 nor xe" in caplog.text


def test_sriov_physical_function_with_vfs_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sysfs = write_sysfs(
        tmp_path / "sys",
        [FakeCard(0, sriov_numvfs=4), FakeCard(1, sriov_numvfs=0), FakeCard(2)],
    )
    with caplog.at_level(logging.INFO):
        assert names(discover_sysfs(sysfs)) == ["card1", "card2"]
    assert "card0: SR-IOV physical function with 4 virtual functions enabled" in caplog.text
    # label-node's view leaves it out too: gas must not be told of a card nobody hands out.
    assert names(pci_cards_sysfs(sysfs)) == ["card1", "card2"]


def test_other_vendors_are_ignored(tmp_path: Path) -> None:
    sysfs = write_sysfs(
        tmp_path / "sys",
        [FakeCard(0, vendor="0x10de"), FakeCard(1), FakeCard(2, vendor="0x1002")],
    )
    assert names(discover_sysfs(sysfs)) == ["card1"]
    assert [(c.name, c.vendor) for c in pci_cards_sysfs(sysfs)] == [
        ("card0", "0x10de"),
        ("card1", "0x8086"),
        ("card2", "0x1002"),
    ]
    # The label-node view reads no details: those are Intel drivers' attributes.
    assert pci_cards_sysfs(sysfs)[1] == Card("card1", 1, "0x8086", 0, "0000:04:00.0")


def test_an_unreadable_drm_class_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "drm").write_text("not a folder")
    with pytest.raises(NodeError, match="cannot read"):
        discover_sysfs(tmp_path)


# ---------------------------------------------------------------- options


def test_memory_options_from_flags_then_environment() -> None:
    env = {"GPU_MEMORY_RESERVED": "1Gi", "GPU_MEMORY_OVERRIDE": "4294967296"}
    assert memory_options(None, None, {}) == (0, None)
    assert memory_options(None, None, env) == (GIB, 4 * GIB)
    assert memory_options("512Mi", "8Gi", env) == (GIB // 2, 8 * GIB)
    assert memory_options("0", None, {"GPU_MEMORY_OVERRIDE": ""}) == (0, None)
    with pytest.raises(ValueError, match="memory reserved: quantity '-1' is negative"):
        memory_options("-1", None, {})
    with pytest.raises(ValueError, match="memory override: quantity 'lots'"):
        memory_options(None, None, {"GPU_MEMORY_OVERRIDE": "lots"})


def test_flags_build_the_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_MEMORY_RESERVED", raising=False)
    monkeypatch.setenv("GPU_MEMORY_OVERRIDE", "2Gi")
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0, lmem_per_tile=None), FakeCard(1)])
    parser = argparse.ArgumentParser()
    discovery.add_arguments(parser)
    args = parser.parse_args(["--sysfs-root", str(sysfs), "--memory-reserved", "1Gi"])
    assert [c.memory for c in discovery.discoverer(args)()] == [2 * GIB, 15 * GIB]
    with pytest.raises(ValueError, match="memory reserved"):
        discovery.discoverer(parser.parse_args(["--memory-reserved", "1.5"]))


# ---------------------------------------------------------------- the udev backend


@dataclass
class SysfsDevice:
    """A device as pyudev shows it, read from a (fake) sysfs folder the way libudev reads
    one: the parent is the nearest folder above that is a device (has a `uevent`)."""

    path: Path
    sysfs: Path

    @property
    def sys_name(self) -> str:
        return self.path.name

    @property
    def sys_path(self) -> str:
        return str(self.path)

    @property
    def subsystem(self) -> str | None:
        try:
            return os.path.basename(os.readlink(self.path / "subsystem"))
        except OSError:
            return None

    @property
    def parent(self) -> SysfsDevice | None:
        for folder in self.path.parents:
            if folder == self.sysfs:
                return None
            if (folder / "uevent").exists():
                return SysfsDevice(folder, self.sysfs)
        return None

    @property
    def attributes(self) -> SysfsDevice:
        return self

    def get(self, attribute: str) -> bytes | None:
        try:
            return (self.path / attribute).read_bytes()
        except OSError:
            return None


def udev_devices(sysfs: Path) -> list[SysfsDevice]:
    drm = sysfs / "class" / "drm"
    return [SysfsDevice((drm / name).resolve(), sysfs) for name in sorted(os.listdir(drm))]


def test_udev_backend_gives_the_same_records(tmp_path: Path) -> None:
    cards = [
        FakeCard(0, "i915", tiles=2, numa=1),
        FakeCard(1, "xe", tiles=2, lmem_per_tile=None, render_minor=140),
        FakeCard(2, sriov_numvfs=2),
        FakeCard(3, vendor="0x10de"),
    ]
    sysfs = write_sysfs(tmp_path / "sys", cards)
    options = {"memory_reserved": GIB, "memory_override": 3 * GIB}
    found = discover_udev(devices=udev_devices(sysfs), **options)
    assert found == discover_sysfs(sysfs, **options)
    assert [(c.name, c.tiles, c.memory, c.render_node) for c in found] == [
        ("card0", 2, 31 * GIB, "renderD128"),
        ("card1", 2, 3 * GIB, "renderD140"),
    ]
    assert discovery.cards_from_udev(udev_devices(sysfs)) == pci_cards_sysfs(sysfs)


def test_udev_backend_on_this_machine_agrees_with_sysfs() -> None:
    pytest.importorskip("pyudev")
    try:
        found = discover_udev()
    except NodeError as exc:  # no libudev here
        pytest.skip(str(exc))
    assert found == discover_sysfs("/sys")


# ---------------------------------------------------------------- following changes


class Timeline:
    """A fake clock and kernel: at each given time, change the tree, then send the event."""

    def __init__(self, steps: list[tuple[float, str, object]], end: float) -> None:
        self.now = 0.0
        self.steps = steps
        self.end = end
        self.waits: list[float | None] = []

    def clock(self) -> float:
        return self.now

    def next_event(self, timeout: float | None) -> str | None:
        self.waits.append(timeout)
        wake = self.end if timeout is None else min(self.end, self.now + timeout)
        if self.steps and self.steps[0][0] <= wake:
            self.now, event, change = self.steps.pop(0)
            if callable(change):
                change()
            return event
        self.now = max(self.now, wake)
        return None

    def stop(self) -> bool:
        return self.now >= self.end


def test_a_card_removed_and_added_back(tmp_path: Path) -> None:
    cards = [FakeCard(0), FakeCard(1, "xe", tiles=2)]
    sysfs = write_sysfs(tmp_path / "sys", cards)
    seen: list[tuple[float, list[str]]] = []
    timeline = Timeline(
        [
            (10.0, "remove card1", lambda: remove_card(sysfs, cards[1])),
            (10.1, "", None),  # a render node or connector event: nothing to report
            (20.0, "add card1", lambda: add_card(sysfs, cards[1])),
        ],
        end=60,
    )

    def on_change(found: list[Card]) -> bool:
        seen.append((timeline.now, names(found)))
        return True

    watcher = CardWatcher(
        lambda: discover_sysfs(sysfs),
        on_change,
        lambda timeout: timeline.next_event(timeout) or None,
        debounce=0.5,
        resync=30,
        clock=timeline.clock,
    )
    watcher.run(timeline.stop)
    # Reported at start, after each burst settles, and not at the resync (no change).
    assert seen == [(0.0, ["card0", "card1"]), (10.5, ["card0"]), (20.5, ["card0", "card1"])]
    assert watcher.cards is not None and watcher.cards[1].tiles == 2
    # It never waited longer than a second at a time, so a stop is seen within a second.
    assert all(wait is not None and wait <= 1.0 for wait in timeline.waits)


def test_a_failed_change_is_offered_again_with_backoff(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    timeline = Timeline([], end=20)
    calls: list[float] = []

    def on_change(found: list[Card]) -> bool:
        calls.append(timeline.now)
        if len(calls) == 2:
            raise RuntimeError("API server away")
        return len(calls) >= 4

    watcher = CardWatcher(
        lambda: discover_sysfs(sysfs),
        on_change,
        timeline.next_event,
        resync=5,
        clock=timeline.clock,
    )
    watcher.run(timeline.stop)
    # Fails at 0, raises at 1, fails at 3, accepted at 7; then the resyncs find no change.
    assert calls == [0.0, 1.0, 3.0, 7.0]
    assert watcher.cards == discover_sysfs(sysfs)


def test_a_discovery_failure_is_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[float] = []
    timeline = Timeline([], end=4)

    def broken() -> list[Card]:
        attempts.append(timeline.now)
        raise NodeError("cannot read /sys/class/drm: permission denied")

    watcher = CardWatcher(broken, lambda cards: True, timeline.next_event, clock=timeline.clock)
    with caplog.at_level(logging.ERROR):
        watcher.run(timeline.stop)
    assert attempts == [0.0, 1.0, 3.0]
    assert "cannot discover the GPU cards: cannot read /sys/class/drm" in caplog.text
    assert watcher.cards is None


def test_a_half_applied_change_is_undone_when_the_card_comes_back(tmp_path: Path) -> None:
    """The callback took the unplug only in part (devices updated, the API write failed);
    the card is back before the retry: the callback must hear of it, though the cards are
    those it last accepted."""
    cards = [FakeCard(0), FakeCard(1)]
    sysfs = write_sysfs(tmp_path / "sys", cards)
    timeline = Timeline(
        [
            (10.0, "remove card1", lambda: remove_card(sysfs, cards[1])),
            (10.8, "add card1", lambda: add_card(sysfs, cards[1])),
        ],
        end=30,
    )
    applied: list[tuple[float, list[str]]] = []

    def on_change(found: list[Card]) -> bool:
        applied.append((timeline.now, names(found)))
        return len(applied) != 2  # the unplug's API write fails

    watcher = CardWatcher(
        lambda: discover_sysfs(sysfs),
        on_change,
        timeline.next_event,
        debounce=0.5,
        resync=0,
        clock=timeline.clock,
    )
    watcher.run(timeline.stop)
    assert applied == [(0.0, ["card0", "card1"]), (10.5, ["card0"]), (11.3, ["card0", "card1"])]
    assert watcher.cards == discover_sysfs(sysfs)
