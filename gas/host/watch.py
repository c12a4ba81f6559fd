"""Following this node's cards as they come and go: `watch_loop` and `CardWatcher` wait for
the kernel's add/remove events of DRM cards (`card_monitor`, `udev_card_events`), or for
nothing where the cards are read from a sysfs tree (`--sysfs-root`, which has no events),
and rediscover after each burst and every so often without one. `card_watcher` builds the
one both agents run from their flags. Tests drive them with a fake event source and a fake
clock.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gas.core.model import is_card_name
from gas.host.cards import Card
from gas.host.discovery import describe, load_pyudev, udev_context
from gas.host.errors import NodeError

log = logging.getLogger(__name__)

RETRY_BASE = 1.0
RETRY_MAX = 60.0


EventSource = Callable[[float | None], str | None]
"""`next_event(timeout)`: wait at most `timeout` seconds (None: forever) and return a
description of a card coming or going, or None."""


def watch_loop(
    refresh: Callable[[], bool],
    next_event: EventSource,
    *,
    debounce: float,
    resync: float,
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Refresh now, then after card events and every `resync` seconds; retry failures with
    backoff.

    Events come in bursts (a driver binding several cards, a module reload), so a refresh
    waits until `debounce` seconds pass without one, but never more than five debounce
    periods after the first.
    """
    failures = 0
    scheduled: float | None = clock()
    settle: float | None = None
    first_event: float | None = None
    while not stop():
        now = clock()
        due = min((d for d in (scheduled, settle) if d is not None), default=None)
        if due is not None and now >= due:
            settle = first_event = None
            if refresh():
                failures = 0
                scheduled = now + resync if resync > 0 else None
            else:
                failures += 1
                delay = min(RETRY_MAX, RETRY_BASE * 2 ** min(failures - 1, 16))
                log.info("retrying in %.0f s", delay)
                scheduled = now + delay
            continue
        event = next_event(None if due is None else due - now)
        if event is None:
            continue
        now = clock()
        log.info("udev: %s", event)
        if first_event is None:
            first_event = now
        settle = min(now + debounce, first_event + 5 * debounce)


class CardWatcher:
    """Keeps `on_change` in step with this node's cards.

    `check()` discovers the cards and, when they differ from those `on_change` last
    accepted (always, the first time), calls `on_change(cards)`; a False answer or an
    exception means "not done", and the next check offers the cards it finds then, even
    if they are back to those accepted before (the failed change may be half applied).
    `run(stop)` checks at once, after each burst of card events from `next_event`, every
    `resync` seconds, and again with backoff after a failure; it returns within `wake`
    seconds of `stop()` turning true, even while no event comes.
    """

    def __init__(
        self,
        discover: Callable[[], list[Card]],
        on_change: Callable[[list[Card]], bool],
        next_event: EventSource,
        *,
        debounce: float = 1.0,
        resync: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        wake: float = 1.0,
    ) -> None:
        self._discover = discover
        self._on_change = on_change
        self._next_event = next_event
        self._debounce = debounce
        self._resync = resync
        self._clock = clock
        self._wake = wake
        self.cards: list[Card] | None = None
        """The cards `on_change` last accepted; None before the first success and after a
        failure."""

    def check(self) -> bool:
        try:
            cards = self._discover()
        except (NodeError, OSError) as exc:
            log.error("cannot discover the GPU cards: %s", exc)
            return False
        if cards == self.cards:
            log.debug("cards unchanged: %s", describe(cards))
            return True
        log.info("cards: %s", describe(cards))
        try:
            accepted = self._on_change(list(cards))
        except Exception:  # the callback's failure must not end the watch
            log.exception("applying the card change failed")
            accepted = False
        # A failed change may be half applied: whatever the cards are at the next check,
        # even those of before, they are offered again.
        self.cards = cards if accepted else None
        return accepted

    def _event(self, timeout: float | None) -> str | None:
        return self._next_event(self._wake if timeout is None else min(timeout, self._wake))

    def run(self, stop: Callable[[], bool]) -> None:
        watch_loop(
            self.check,
            self._event,
            debounce=self._debounce,
            resync=self._resync,
            clock=self._clock,
            stop=stop,
        )


CardEvent = Callable[[str, str, str], None]
"""`on_card(action, card, wedged)`: a card's uevent (`add`, `remove`, or `change` with the
`WEDGED` value the kernel sent when it declared the device wedged)."""


def udev_card_events(monitor: Any, on_card: CardEvent | None = None) -> EventSource:
    """Adapt a started `pyudev.Monitor` to `watch_loop`: cards coming and going count (not
    render nodes, connectors, or the `change` events of display hotplug), and so does a
    card's wedged event (`WEDGED=<recovery method>`, drm-uapi's "Device wedging"; `none`
    means the driver recovered on its own). `on_card` hears of each."""

    def next_event(timeout: float | None) -> str | None:
        device = monitor.poll(timeout=timeout)
        if device is None or device.subsystem != "drm" or not is_card_name(device.sys_name):
            return None
        if device.action == "change":
            wedged = _text(device.properties.get("WEDGED")) if on_card is not None else ""
            if not wedged or wedged == "none":
                return None
            if on_card is not None:
                on_card("change", device.sys_name, wedged)
            return f"wedged {device.sys_name} (WEDGED={wedged})"
        if device.action not in ("add", "remove"):
            return None
        if on_card is not None:
            on_card(device.action, device.sys_name, "")
        return f"{device.action} {device.sys_name}"

    return next_event


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value if isinstance(value, str) else ""


def card_monitor() -> Any:
    """A started monitor of the drm subsystem.

    It listens to the kernel's uevents, not udev's re-broadcast: udev sends those only to
    the host's network namespace, which a pod without hostNetwork does not see. Discovery
    reads sysfs only, so it does not need udev's processing of the event.
    """
    pyudev = load_pyudev()
    monitor = pyudev.Monitor.from_netlink(udev_context(), source="kernel")
    monitor.filter_by("drm")
    monitor.start()
    return monitor


def card_watcher(
    args: argparse.Namespace,
    discover: Callable[[], list[Card]],
    on_change: Callable[[list[Card]], bool],
    stop: threading.Event,
    on_card: CardEvent | None = None,
) -> CardWatcher:
    """The watcher the agents' flags ask for: udev's events, or with `--sysfs-root` none,
    and a rediscovery every `--rescan` seconds (600 with udev, 5 without)."""
    if args.sysfs_root is not None:

        def no_events(timeout: float | None) -> str | None:
            stop.wait(1.0 if timeout is None else timeout)
            return None

        return CardWatcher(discover, on_change, no_events, resync=args.rescan or 5.0, debounce=0.2)
    monitor = card_monitor()
    events = udev_card_events(monitor, on_card)
    return CardWatcher(discover, on_change, events, resync=args.rescan or 600.0)
