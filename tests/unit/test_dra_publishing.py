"""When the node's slice is checked: the publishing thread, with a real inventory over a
fake sysfs tree and a publisher that records what it is asked (the seam where the API
server would be written). A burst of triggers makes one check; a failed check is tried
again with a growing backoff, reading the API server directly, while triggers wait; the
safety-net resync reads directly too; and each check hands over the cards' states, their
sharing and their PCI facts, kept for a card that went away."""

from __future__ import annotations

import itertools
import linecache
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
from kubernetes.client.exceptions import ApiException

from gas.dra import publishing
from gas.dra.inventory import Inventory
from gas.dra.metrics import DraMetrics
from gas.dra.publish import SlicePublisher
from gas.dra.publishing import Publishing
from gas.dra.slices import CardState, PciFacts
from gas.host.cards import Card
from gas.host.discovery import discover_sysfs
from gas.host.health import Health, card_health
from tests.support.fakesysfs import FakeCard, unbind_card, write_sysfs
from tests.support.polling import wait_for


@dataclass(frozen=True)
class Call:
    at: float
    """time.monotonic() when publish was called."""
    direct: bool
    states: tuple[CardState, ...]
    facts: Mapping[str, PciFacts]


class RecordingPublisher:
    """What Publishing writes through (SlicePublisher's `publish`, `node`, `generation`):
    records each call, fails the first `failures` as an API server answering 503 would,
    and with `hold_first` keeps the first call waiting until that event is set."""

    node = "n1"

    def __init__(self, failures: int = 0, hold_first: threading.Event | None = None) -> None:
        self.generation = 0
        self.failures = failures
        self.hold_first = hold_first
        self._lock = threading.Lock()
        self._calls: list[Call] = []

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def publish(
        self, states: Sequence[CardState], facts: Mapping[str, PciFacts], direct: bool = False
    ) -> bool:
        with self._lock:
            self._calls.append(Call(time.monotonic(), direct, tuple(states), dict(facts)))
            number = len(self._calls)
        if number == 1 and self.hold_first is not None:
            self.hold_first.wait(timeout=20)
        if number <= self.failures:
            raise ApiException(status=503, reason="Service Unavailable")
        self.generation += 1
        return True


class OffsetClock:
    """time.monotonic(), moved on at will: the thread's due times follow it, its waits stay
    real."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class TriggerWhileChoosing:
    """time.monotonic(), except that the first time the thread asks it whether the resync is
    due (to choose whether its check reads the API server directly), a direct trigger
    arrives at that moment, as the kubelet's registration may."""

    def __init__(self) -> None:
        self.thread: Publishing | None = None
        self.fired = False

    def __call__(self) -> float:
        caller = sys._getframe(1)
        line = linecache.getline(caller.f_code.co_filename, caller.f_lineno)
        if self.thread is not None and not self.fired and "safety =" in line and "due" in line:
            self.fired = True
            self.thread.trigger(direct=True)
        return time.monotonic()


@dataclass
class Rig:
    sysfs: Path
    inventory: Inventory
    metrics: DraMetrics
    stop: threading.Event
    shared: set[str]


Make = Callable[..., tuple[Publishing, RecordingPublisher]]


def judge_of(sysfs: Path) -> Callable[[Card, bool, str], Health]:
    def judge(card: Card, present: bool, wedged: str) -> Health:
        return card_health(sysfs, card, present, wedged)

    return judge


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1, driver="xe")])
    inventory = Inventory(str(tmp_path / "state"), judge_of(sysfs))
    inventory.update(discover_sysfs(sysfs), ())
    return Rig(sysfs, inventory, DraMetrics(), threading.Event(), set())


@pytest.fixture
def make(rig: Rig) -> Iterator[Make]:
    """Publishing threads over the rig (not started); stopped and joined at the end."""
    made: list[Publishing] = []

    def build(
        publisher: RecordingPublisher | None = None,
        resync: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> tuple[Publishing, RecordingPublisher]:
        stub = publisher or RecordingPublisher()

        def shared() -> Collection[str]:
            return set(rig.shared)

        thread = Publishing(
            cast(SlicePublisher, stub),
            rig.inventory,
            shared,
            str(rig.sysfs),
            rig.metrics,
            rig.stop,
            resync=resync,
            clock=clock,
        )
        made.append(thread)
        return thread, stub

    yield build
    rig.stop.set()
    for thread in made:
        thread.trigger()  # wakes a thread waiting for triggers: it sees the stop at once
        if thread.is_alive():
            thread.join(timeout=10)
        assert not thread.is_alive()


def calls_reach(stub: RecordingPublisher, count: int) -> list[Call]:
    wait_for(lambda: len(stub.calls) >= count, timeout=20, what=f"{count} publish call(s)")
    return stub.calls


def publishes(metrics: DraMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value("gas_dra_slice_publishes_total", {"result": result})
    return value or 0.0


# ------------------------------------------------------------------ one check


def test_a_check_hands_over_the_cards_states_sharing_and_facts(rig: Rig, make: Make) -> None:
    thread, stub = make()
    rig.shared.add("card1")
    assert thread.check() is True
    (call,) = stub.calls
    assert call.direct is False
    assert [(s.card.name, s.healthy, s.reason, s.shared) for s in call.states] == [
        ("card0", True, "", False),
        ("card1", True, "", True),
    ]
    assert call.facts == {
        "card0": PciFacts("0x56a0", "pci0000:00"),
        "card1": PciFacts("0x56a0", "pci0000:00"),
    }
    assert thread.checks == 1 and thread.published.is_set()
    assert publishes(rig.metrics, "ok") == 1
    assert rig.metrics.registry.get_sample_value("gas_dra_cards") == 2
    assert rig.metrics.registry.get_sample_value("gas_dra_pool_generation") == 1


def test_a_card_that_went_away_keeps_the_facts_read_while_it_was_there(
    rig: Rig, make: Make
) -> None:
    thread, stub = make()
    thread.check()
    unbind_card(rig.sysfs, FakeCard(1, driver="xe"))
    # The PCI function stays, but its device id is no longer what it was read as.
    pci = (rig.sysfs / "bus" / "pci" / "devices" / "0000:04:00.0").resolve()
    (pci / "device").write_text("0xffff\n")
    rig.inventory.update(discover_sysfs(rig.sysfs), ())
    thread.check(direct=True)
    last = stub.calls[-1]
    assert last.direct is True
    assert [(s.card.name, s.healthy, s.reason) for s in last.states] == [
        ("card0", True, ""),
        ("card1", False, "Unbound"),
    ]
    assert last.facts["card1"] == PciFacts("0x56a0", "pci0000:00")


def test_cards_of_unknown_health_are_not_tainted(rig: Rig, make: Make) -> None:
    """A moment when sysfs cannot be read makes every card Unknown: the kubelet hears
    Unknown, but no taint (whose NoExecute would evict the node's GPU pods) is published."""
    thread, stub = make()
    rig.inventory.update(None, ())
    assert {d.health.status for d in rig.inventory.devices().values()} == {"Unknown"}
    thread.check()
    (call,) = stub.calls
    assert [(s.card.name, s.healthy) for s in call.states] == [("card0", True), ("card1", True)]


def test_a_failed_check_is_counted_and_does_not_say_published(rig: Rig, make: Make) -> None:
    thread, stub = make(RecordingPublisher(failures=1))
    assert thread.check() is False
    assert not thread.published.is_set()
    assert publishes(rig.metrics, "error") == 1 and publishes(rig.metrics, "ok") == 0
    assert thread.check() is True
    assert thread.published.is_set()
    assert len(stub.calls) == 2


# ------------------------------------------------------------------ the thread


def test_a_burst_of_triggers_makes_one_check(
    rig: Rig, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "SPACING", 0.05)
    hold = threading.Event()
    thread, stub = make(RecordingPublisher(hold_first=hold))
    thread.trigger()
    thread.start()
    calls_reach(stub, 1)
    # While the first check is under way, a burst of triggers comes.
    for _ in range(20):
        thread.trigger()
    hold.set()
    calls_reach(stub, 2)
    rig.stop.set()
    thread.join(timeout=10)
    assert len(stub.calls) == 2
    assert thread.checks == 2
    assert [c.direct for c in stub.calls] == [False, False]


def test_a_failed_check_is_retried_directly_with_a_growing_backoff(
    rig: Rig, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "SPACING", 0.01)
    monkeypatch.setattr(publishing, "RETRY_BASE", 0.05)
    thread, stub = make(RecordingPublisher(failures=3))
    thread.trigger()
    thread.start()
    calls = calls_reach(stub, 4)
    wait_for(thread.published.is_set, timeout=10, what="published")
    # After a failure the API server is read directly, not the watches.
    assert [c.direct for c in calls] == [False, True, True, True]
    gaps = [b.at - a.at for a, b in itertools.pairwise(calls)]
    # Each retry waits at least the backoff, which doubles: 0.05, 0.1, 0.2.
    for failure, gap in enumerate(gaps):
        assert gap >= publishing.RETRY_BASE * 2**failure, gaps
    assert publishes(rig.metrics, "error") == 3 and publishes(rig.metrics, "ok") == 1


def test_triggers_wait_for_the_backoff_after_a_failure(
    rig: Rig, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "SPACING", 0.01)
    monkeypatch.setattr(publishing, "RETRY_BASE", 1.0)
    thread, stub = make(RecordingPublisher(failures=1))
    thread.trigger()
    thread.start()
    calls_reach(stub, 1)
    for _ in range(20):
        thread.trigger()
    first, second = calls_reach(stub, 2)[:2]
    # Triggers would have checked after SPACING; the retry came at the backoff's end.
    assert second.at - first.at >= publishing.RETRY_BASE
    assert second.direct is True
    rig.stop.set()
    thread.join(timeout=10)
    # The triggers made during the backoff are answered by the retry, not after it.
    assert len(stub.calls) == 2


def test_the_safety_net_resync_reads_directly_and_triggers_read_the_watches(
    rig: Rig, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "SPACING", 0.01)
    clock = OffsetClock()
    thread, stub = make(resync=600.0, clock=clock)
    thread.trigger()
    thread.start()
    assert calls_reach(stub, 1)[0].direct is False
    thread.trigger()
    assert calls_reach(stub, 2)[1].direct is False
    thread.trigger(direct=True)
    assert calls_reach(stub, 3)[2].direct is True
    # The resync comes due with no trigger at all.
    clock.advance(600.0)
    assert calls_reach(stub, 4)[3].direct is True
    # It is due again only a resync later: a trigger reads the watches.
    thread.trigger()
    assert calls_reach(stub, 5)[4].direct is False
    rig.stop.set()
    thread.join(timeout=10)
    assert len(stub.calls) == 5


def test_a_direct_trigger_in_a_burst_makes_the_one_check_direct(
    rig: Rig, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "SPACING", 0.05)
    hold = threading.Event()
    thread, stub = make(RecordingPublisher(hold_first=hold))
    thread.trigger()
    thread.start()
    calls_reach(stub, 1)
    thread.trigger()
    thread.trigger(direct=True)
    thread.trigger()
    hold.set()
    calls_reach(stub, 2)
    rig.stop.set()
    thread.join(timeout=10)
    assert [c.direct for c in stub.calls] == [False, True]


def test_stop_ends_the_thread_during_a_long_backoff(
    rig: Rig, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "RETRY_BASE", 3600.0)
    thread, stub = make(RecordingPublisher(failures=1))
    thread.trigger()
    thread.start()
    calls_reach(stub, 1)
    rig.stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(stub.calls) == 1


def test_a_direct_trigger_during_the_choice_is_not_lost(
    rig: Rig, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "SPACING", 0.01)
    clock = TriggerWhileChoosing()
    thread, stub = make(clock=clock)
    clock.thread = thread
    thread.trigger()
    thread.start()
    calls_reach(stub, 1)
    assert clock.fired
    wait_for(lambda: any(c.direct for c in stub.calls), timeout=3, what="a check reading directly")
