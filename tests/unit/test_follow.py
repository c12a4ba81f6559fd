"""Following kube-scheduler's Lease (gas/cluster/follow.py): the decision on a fake clock
and the leader-election double's Lease store, with the Lease written as kube-scheduler
writes it."""

from __future__ import annotations

import logging
import socket
import threading
from datetime import UTC, datetime

import pytest

from gas.cluster.follow import SchedulerLeaseFollower, judge, micro_time
from gas.cluster.leader import LeaderGatedCluster, LeaseRecord, default_identity, pod_name
from tests.support.leases import Clock, FakeStore, Unavailable

POD = "sched-a"
# The wall clock is the fake monotonic one plus this offset: one node's clock, as the
# kube-scheduler and the gas of one pod share.
EPOCH = 1_790_000_000.0


def wall_of(clock: Clock) -> float:
    return EPOCH + clock.now


def micro(seconds: float) -> str:
    """A wall-clock time as the API server stores renewTime (RFC 3339, microseconds, Z)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Scheduler:
    """kube-scheduler's side of the Lease: acquire or renew with `holder` at the time of
    `clock`, `leaseDurationSeconds` 15; release as on SIGTERM."""

    def __init__(self, store: FakeStore, clock: Clock) -> None:
        self.store, self.clock = store, clock

    def renew(self, holder: str, *, at: float | None = None, duration: int = 15) -> None:
        when = micro(wall_of(self.clock) if at is None else at)
        old = self.store.lease
        record = LeaseRecord(
            holder=holder,
            duration_seconds=duration,
            acquire_time=old.acquire_time if old and old.holder == holder else when,
            renew_time=when,
            transitions=0 if old is None else old.transitions + (old.holder != holder),
            resource_version=old.resource_version if old else "",
        )
        if old is None:
            self.store.create(record)
        else:
            self.store.update(record)

    def release(self) -> None:
        old = self.store.lease
        assert old is not None
        now = micro(wall_of(self.clock))
        self.store.update(
            LeaseRecord(
                holder="",
                duration_seconds=1,
                acquire_time=now,
                renew_time=now,
                transitions=old.transitions,
                resource_version=old.resource_version,
            )
        )


def follower(
    store: FakeStore, clock: Clock, pod: str = POD, **options: float
) -> SchedulerLeaseFollower:
    changes: list[bool] = []
    made = SchedulerLeaseFollower(
        store,
        pod,
        lease="gas-system/gas-scheduler",
        clock=clock,
        wall=lambda: wall_of(clock),
        on_change=changes.append,
        **options,
    )
    made.changes = changes  # type: ignore[attr-defined]
    return made


@pytest.fixture
def world() -> tuple[FakeStore, Clock, Scheduler]:
    store, clock = FakeStore(), Clock()
    return store, clock, Scheduler(store, clock)


# ------------------------------------------------------------------ one reading


def test_a_record_of_our_pod_lets_gas_answer_until_renew_time_plus_duration(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    store, clock, scheduler = world
    scheduler.renew("sched-a_0b5e2c1d-7f3a-4c55-9d3e-1f2a3b4c5d6e")
    f = follower(store, clock)
    assert not f.is_leader()  # nothing read yet
    assert f.refresh() and f.is_leader()
    clock.advance(14.9)
    assert f.is_leader()
    clock.advance(0.2)
    assert not f.is_leader()  # renewTime + 15 s has passed, on the clock alone
    assert "ran out" in f.why_not()


def test_renewals_keep_it_answering_and_each_counts_from_its_renew_time(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    store, clock, scheduler = world
    f = follower(store, clock)
    for _ in range(20):
        scheduler.renew("sched-a_u1")
        assert f.refresh()
        clock.advance(2)
        assert f.is_leader()
    clock.advance(12.9)  # 14.9 s after the last renewal
    assert f.is_leader()
    clock.advance(0.2)
    assert not f.is_leader()


def test_a_record_of_another_pod_does_not(world: tuple[FakeStore, Clock, Scheduler]) -> None:
    store, clock, scheduler = world
    scheduler.renew("sched-b_5d9c")
    f = follower(store, clock)
    assert not f.refresh() and not f.is_leader()
    assert "held by sched-b_5d9c" in f.why_not()


@pytest.mark.parametrize("holder", ["sched-ab_u1", "sched-a", "xsched-a_u1", "sched-a-2_u1"])
def test_only_the_pod_name_then_an_underscore_counts(
    world: tuple[FakeStore, Clock, Scheduler], holder: str
) -> None:
    store, clock, scheduler = world
    scheduler.renew(holder)
    assert not follower(store, clock).refresh()


def test_an_expired_record_of_our_pod_does_not(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    store, clock, scheduler = world
    scheduler.renew("sched-a_u1", at=wall_of(clock) - 15.5)
    f = follower(store, clock)
    assert not f.refresh()
    assert "ran out 0.5s ago" in f.why_not()


def test_a_missing_lease_does_not(world: tuple[FakeStore, Clock, Scheduler]) -> None:
    store, clock, _ = world
    f = follower(store, clock)
    assert not f.refresh()
    assert f.why_not() == "the Lease does not exist"


def test_a_released_lease_does_not(world: tuple[FakeStore, Clock, Scheduler]) -> None:
    store, clock, scheduler = world
    f = follower(store, clock)
    scheduler.renew("sched-a_u1")
    assert f.refresh()
    scheduler.release()
    assert not f.refresh()
    assert "nobody" in f.why_not()


@pytest.mark.parametrize(
    ("renew_time", "duration", "why"),
    [
        ("not a time", 15, "is not a time"),
        ("", 15, "is not a time"),
        ("2026-11-25T02:00:00.000000", 15, "is not a time"),  # no time zone
        (None, 0, "leaseDurationSeconds is 0"),
        (None, -3, "leaseDurationSeconds is -3"),
    ],
)
def test_an_unreadable_record_of_our_pod_does_not(
    world: tuple[FakeStore, Clock, Scheduler],
    renew_time: str | None,
    duration: int,
    why: str,
) -> None:
    store, clock, _ = world
    now = micro(wall_of(clock))
    store.create(
        LeaseRecord(
            holder="sched-a_u1",
            duration_seconds=duration,
            acquire_time=now,
            renew_time=now if renew_time is None else renew_time,
        )
    )
    f = follower(store, clock)
    assert not f.refresh()
    assert why in f.why_not()


def test_a_renew_time_in_the_future_counts_as_written_at_the_reading(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    """The same clock cannot have written it unless it was stepped back since: gas answers
    no longer than leaseDurationSeconds from its reading, whatever renewTime says."""
    store, clock, scheduler = world
    scheduler.renew("sched-a_u1", at=wall_of(clock) + 3600)
    f = follower(store, clock)
    assert f.refresh()
    clock.advance(14.9)
    assert f.is_leader()
    clock.advance(0.2)
    assert not f.is_leader()


def test_a_renewal_seen_late_runs_out_at_its_renew_time_not_at_the_reading(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    """The other pod's kube-scheduler counts leaseDuration from when it saw the renewal,
    which may be long before this gas reads it: gas's deadline is the writer's."""
    store, clock, scheduler = world
    scheduler.renew("sched-a_u1")
    clock.advance(9)  # read 9 s after it was written
    f = follower(store, clock)
    assert f.refresh()
    clock.advance(5.9)
    assert f.is_leader()
    clock.advance(0.2)  # 15.1 s after renewTime, 6.1 s after the reading
    assert not f.is_leader()


def test_a_clock_step_after_the_reading_changes_nothing() -> None:
    store, clock = FakeStore(), Clock()
    scheduler = Scheduler(store, clock)
    step = 0.0
    f = SchedulerLeaseFollower(store, POD, clock=clock, wall=lambda: wall_of(clock) + step)
    scheduler.renew("sched-a_u1")
    assert f.refresh()
    step = -3600.0  # the wall clock stepped back an hour: the deadline does not move
    clock.advance(15.1)
    assert not f.is_leader()


def test_when_the_api_server_cannot_be_read_the_last_reading_runs_out_on_its_own(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    store, clock, scheduler = world
    f = follower(store, clock)
    scheduler.renew("sched-a_u1")
    assert f.refresh()
    store.fail = True
    for _ in range(7):
        clock.advance(2)
        with pytest.raises(Unavailable):
            f.refresh()
        assert f.is_leader()  # 14 s
    clock.advance(1.1)
    assert not f.is_leader()
    assert not f.may_answer()  # a verb: its reading fails too, and it is refused
    assert f.changes == [True, False]  # type: ignore[attr-defined]


# ------------------------------------------------------------------ a hand-over


def test_a_crash_hand_over_never_has_two_answering(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    """sched-a renews every 2 s, then dies; sched-b, as client-go does, takes the Lease
    once it has seen no change for leaseDuration (counted from when it saw the last one).
    Both gas read every 0.5 s; on every tick at most one may answer, and b answers at
    the first verb after its scheduler took over."""
    store, clock, scheduler = world
    a, b = follower(store, clock, "sched-a"), follower(store, clock, "sched-b")
    both = [a, b]

    def check() -> None:
        assert sum(f.is_leader() for f in both) <= 1, clock.now

    clock.watchers.append(check)
    scheduler.renew("sched-a_u1")
    seen = (store.lease, clock.now)  # what sched-b's client-go last saw change, and when
    died = clock.now + 20
    taken = None
    while clock.now < died + 30:
        clock.advance(0.5)
        if clock.now % 2 == 0 and clock.now < died:
            scheduler.renew("sched-a_u1")
        elif clock.now % 2 == 0 and taken is not None:
            scheduler.renew("sched-b_u2")
        for f in both:
            f.refresh()
        if store.lease != seen[0]:
            seen = (store.lease, clock.now)
        if taken is None and clock.now >= seen[1] + 15:
            scheduler.renew("sched-b_u2")
            taken = clock.now
            assert b.may_answer()  # the first verb: answered, not sent back
            assert not a.is_leader()
    assert taken is not None and taken - died <= 15.5
    assert b.is_leader() and not a.is_leader()


def test_a_verb_while_inactive_reads_the_lease_once_before_refusing(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    store, clock, scheduler = world
    reads = 0

    class Counted:
        def get(self) -> LeaseRecord | None:
            nonlocal reads
            reads += 1
            return store.get()

    f = SchedulerLeaseFollower(Counted(), POD, clock=clock, wall=lambda: wall_of(clock))
    scheduler.renew("sched-b_u1")
    assert not f.refresh()
    scheduler.renew("sched-a_u2")  # this pod's kube-scheduler took the Lease just now
    reads = 0
    assert f.may_answer()  # read once, and answered
    assert reads == 1
    assert f.may_answer() and reads == 1  # leading: no read
    scheduler.renew("sched-b_u3")
    clock.advance(16)
    assert not f.may_answer() and reads == 2
    # Rate-limited: within the recheck interval no second read.
    clock.advance(0.1)
    assert not f.may_answer() and reads == 2
    clock.advance(0.5)
    assert not f.may_answer() and reads == 3
    # A failing read refuses too, and is not retried at once.
    store.fail = True
    clock.advance(1)
    assert not f.may_answer() and reads == 4
    assert not f.may_answer() and reads == 4


def test_verbs_arriving_together_share_one_reading(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    store, clock, scheduler = world
    f = follower(store, clock)
    scheduler.renew("sched-a_u1")
    entered, release = threading.Event(), threading.Event()
    reads = 0

    def slow() -> None:
        nonlocal reads
        reads += 1
        entered.set()
        release.wait(5)

    store.before = slow
    answers: list[bool] = []
    threads = [threading.Thread(target=lambda: answers.append(f.may_answer())) for _ in "abcd"]
    threads[0].start()
    assert entered.wait(5)
    for thread in threads[1:]:
        thread.start()
    release.set()
    for thread in threads:
        thread.join(5)
    assert answers == [True] * 4
    assert reads == 1


def test_a_reading_answered_late_never_overrides_one_begun_after_it(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    """The thread's reading, begun just before this pod's kube-scheduler took the Lease,
    comes back after the first verb's own reading found the Lease ours. The older answer
    must not undo the newer one: kube-scheduler 1.28 parks a pod whose extender call
    failed among its unschedulable pods, for up to 5 minutes when nothing else changes."""
    store, clock, scheduler = world
    f = follower(store, clock)
    scheduler.renew("sched-b_u1")
    answered, release = threading.Event(), threading.Event()
    late = True

    def hold_the_first_answer() -> None:
        nonlocal late
        if late:
            late = False
            answered.set()
            release.wait(5)

    store.after = hold_the_first_answer  # the server has answered; the answer is on its way
    thread = threading.Thread(target=f.refresh)
    thread.start()
    assert answered.wait(5)
    scheduler.renew("sched-a_u2")  # this pod's kube-scheduler takes the Lease
    assert f.may_answer()  # its first verb reads the Lease itself
    release.set()
    thread.join(5)
    assert f.is_leader() and f.may_answer()
    assert f.changes == [True]  # type: ignore[attr-defined]
    # The other way round: a stale "ours" arriving after a newer "not ours" is dropped too.
    answered.clear()
    release.clear()
    late = True
    thread = threading.Thread(target=f.refresh)
    thread.start()
    assert answered.wait(5)  # it read the Lease while it was still ours
    scheduler.renew("sched-b_u3")
    assert f.refresh() is False
    release.set()
    thread.join(5)
    assert not f.is_leader()
    assert f.changes == [True, False]  # type: ignore[attr-defined]


def test_refusals_are_logged_with_the_reason_once(
    world: tuple[FakeStore, Clock, Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    store, clock, scheduler = world
    f = follower(store, clock)
    scheduler.renew("other-pod_u1")
    with caplog.at_level(logging.WARNING, logger="gas.cluster.follow"):
        for _ in range(5):
            clock.advance(1)
            assert not f.may_answer()
    refusals = [r.getMessage() for r in caplog.records if "answered 503" in r.getMessage()]
    assert refusals == [
        "a scheduler verb answered 503: the Lease is held by other-pod_u1, not by this pod "
        "(sched-a) (Lease gas-system/gas-scheduler)"
    ]


def test_the_gate_answers_verbs_by_the_lease_and_readiness_by_the_sync(
    world: tuple[FakeStore, Clock, Scheduler],
) -> None:
    store, clock, scheduler = world
    f = follower(store, clock)

    class Cluster:
        sync = False

        def synced(self) -> bool:
            return self.sync

    inner = Cluster()
    gated = LeaderGatedCluster(inner, f, ready_when_following=True)
    scheduler.renew("sched-a_u1")
    assert not gated.synced() and not gated.ready()  # not synced: neither
    inner.sync = True
    assert gated.ready()
    assert gated.synced()  # the verb's own reading found the Lease
    scheduler.renew("sched-b_u2")
    clock.advance(15.1)
    assert gated.ready() and not gated.synced()
    # Synced but not answering: the verbs' 503 says why, not "not synced".
    assert gated.inactive() == (
        "gas is synced but this replica does not answer the scheduler now: "
        "the Lease is held by sched-b_u2, not by this pod (sched-a)"
    )
    inner.sync = False
    assert gated.inactive() == ""  # the caller says "not synced" itself


def test_stop_stops_answering(world: tuple[FakeStore, Clock, Scheduler]) -> None:
    store, clock, scheduler = world
    f = follower(store, clock)
    scheduler.renew("sched-a_u1")
    assert f.refresh()
    f.stop()
    assert not f.is_leader() and not f.may_answer()
    assert f.why_not() == "gas is stopping"
    assert f.changes == [True, False]  # type: ignore[attr-defined]
    assert store.lease is not None and store.lease.holder == "sched-a_u1"  # left alone


def test_the_thread_follows_the_lease() -> None:
    store, clock = FakeStore(), Clock()
    scheduler = Scheduler(store, clock)
    f = SchedulerLeaseFollower(
        store, POD, retry_period=0.05, clock=clock, wall=lambda: wall_of(clock)
    )
    reads = threading.Semaphore(0)
    store.after = reads.release
    scheduler.renew("sched-a_u1")
    f.start()
    try:
        for _ in range(2):  # two readings by the thread, whatever is under way
            assert reads.acquire(timeout=5)
        assert f.is_leader()
        scheduler.renew("sched-b_u2")
        for _ in range(2):
            assert reads.acquire(timeout=5)
        assert not f.is_leader()
    finally:
        f.stop()


def test_micro_time_reads_the_api_servers_forms() -> None:
    assert micro_time("1970-01-01T00:00:01.500000Z") == 1.5
    assert micro_time("1970-01-01T00:00:02Z") == 2.0
    assert micro_time("1970-01-01T01:00:02+01:00") == 2.0
    assert micro_time("1970-01-01T00:00:02") is None
    assert micro_time("yesterday") is None


def test_judge_with_no_pod_name_never_answers() -> None:
    record = LeaseRecord(holder="_u1", duration_seconds=15, renew_time=micro(EPOCH))
    assert judge(record, "", EPOCH, 0.0).until is None


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        SchedulerLeaseFollower(FakeStore(), "")
    with pytest.raises(ValueError):
        SchedulerLeaseFollower(FakeStore(), POD, retry_period=0)


def test_the_pod_name_is_pod_name_else_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "gas-scheduler-7d9f8-x2x4q")
    assert pod_name() == "gas-scheduler-7d9f8-x2x4q"
    assert default_identity().startswith("gas-scheduler-7d9f8-x2x4q_")
    monkeypatch.setenv("POD_NAME", " ")
    assert pod_name() == socket.gethostname()
    monkeypatch.delenv("POD_NAME")
    assert pod_name() == socket.gethostname()
