"""The kernel's events of DRM cards as `gas dra` hears them (`udev_card_events` with
`on_card`): a card added or removed, and a card's wedged event (`WEDGED=<method>`), each
told to `on_card` and counted as a card event; `WEDGED=none` (the driver recovered by
itself), a change without WEDGED (display hotplug), render nodes, connectors and other
subsystems ignored."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gas.host.watch import udev_card_events


@dataclass
class FakeDevice:
    """What `udev_card_events` reads of a `pyudev.Device`: uevent properties come as str."""

    sys_name: str
    action: str | None
    properties: dict[str, str | bytes] = field(default_factory=dict)
    subsystem: str | None = "drm"


class Monitor:
    """A started monitor that hands out these devices, then None (a poll that timed
    out)."""

    def __init__(self, devices: list[FakeDevice | None]) -> None:
        self.devices = devices
        self.timeouts: list[float | None] = []

    def poll(self, timeout: float | None = None) -> FakeDevice | None:
        self.timeouts.append(timeout)
        return self.devices.pop(0) if self.devices else None


Heard = list[tuple[str, str, str]]


def listen(*devices: FakeDevice | None) -> tuple[list[str | None], Heard]:
    """What each poll returns, and what `on_card` heard."""
    heard: Heard = []

    def on_card(action: str, card: str, wedged: str) -> None:
        heard.append((action, card, wedged))

    next_event = udev_card_events(Monitor(list(devices)), on_card)
    return [next_event(0.1) for _ in devices], heard


@pytest.mark.parametrize("method", ["rebind", "bus-reset", "rebind,bus-reset", "unknown"])
def test_a_wedged_event_is_told_and_counted(method: str) -> None:
    seen, heard = listen(FakeDevice("card0", "change", {"WEDGED": method}))
    assert heard == [("change", "card0", method)]
    assert seen == [f"wedged card0 (WEDGED={method})"]


def test_a_wedged_value_sent_as_bytes_is_read() -> None:
    seen, heard = listen(FakeDevice("card3", "change", {"WEDGED": b"rebind"}))
    assert heard == [("change", "card3", "rebind")]
    assert seen == ["wedged card3 (WEDGED=rebind)"]


def test_wedged_none_means_the_driver_recovered_and_is_ignored() -> None:
    seen, heard = listen(FakeDevice("card0", "change", {"WEDGED": "none"}))
    assert heard == []
    assert seen == [None]


def test_a_change_without_wedged_is_display_hotplug_and_ignored() -> None:
    seen, heard = listen(
        FakeDevice("card0", "change", {"HOTPLUG": "1"}),
        FakeDevice("card0", "change", {"WEDGED": ""}),
    )
    assert heard == []
    assert seen == [None, None]


def test_cards_added_and_removed_are_told_without_a_wedged_value() -> None:
    seen, heard = listen(FakeDevice("card1", "add"), FakeDevice("card1", "remove"))
    assert heard == [("add", "card1", ""), ("remove", "card1", "")]
    assert seen == ["add card1", "remove card1"]


def test_render_nodes_connectors_and_other_subsystems_are_ignored() -> None:
    seen, heard = listen(
        FakeDevice("renderD128", "add"),
        FakeDevice("renderD128", "change", {"WEDGED": "rebind"}),
        FakeDevice("card0-DP-1", "add"),
        FakeDevice("card0-DP-1", "change", {"WEDGED": "rebind"}),
        FakeDevice("card0", "add", subsystem="graphics"),
        FakeDevice("card0", "change", {"WEDGED": "rebind"}, subsystem="graphics"),
        FakeDevice("card0", "bind"),
        FakeDevice("card0", "unbind"),
        FakeDevice("card0", "move"),
        FakeDevice("card0", None),
        None,
    )
    assert heard == []
    assert seen == [None] * 11


def test_events_in_a_row_are_each_heard_in_order() -> None:
    seen, heard = listen(
        FakeDevice("card0", "change", {"WEDGED": "rebind"}),
        FakeDevice("renderD128", "remove"),
        FakeDevice("card0", "remove"),
        FakeDevice("card0", "add"),
    )
    assert heard == [("change", "card0", "rebind"), ("remove", "card0", ""), ("add", "card0", "")]
    assert seen == ["wedged card0 (WEDGED=rebind)", None, "remove card0", "add card0"]


def test_the_poll_waits_as_long_as_asked() -> None:
    monitor = Monitor([])
    next_event = udev_card_events(monitor, lambda action, card, wedged: None)
    assert next_event(2.5) is None
    assert next_event(None) is None
    assert monitor.timeouts == [2.5, None]


def test_without_a_listener_cards_coming_and_going_still_count() -> None:
    monitor = Monitor(
        [FakeDevice("card0", "add"), FakeDevice("card0", "change", {"WEDGED": "rebind"})]
    )
    next_event = udev_card_events(monitor)
    assert next_event(0.1) == "add card0"
    # Nothing would hear of the wedged card: its event changes no discovery, so it does
    # not count.
    assert next_event(0.1) is None
