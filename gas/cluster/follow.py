"""Following kube-scheduler's own Lease instead of electing (`gas serve --schedulerLease`).

In the scheduler-profile install every pod runs a kube-scheduler and a gas, and each
kube-scheduler calls the gas of its own pod over loopback. kube-scheduler elects its leader
on a Lease; gas holds no election of its own but answers only while that Lease names the
kube-scheduler of its own pod and has not run out. The gas that binds is then always the
one the leading scheduler calls, and there is no second election to disagree with the
first. `SchedulerLeaseFollower` offers `gas.cluster.leader.Leadership`, so the gate, the
`gas_leader` gauge and the logs treat it as they treat an elector. Why the expiry may be
read from renewTime, and how a failover proceeds: docs/high-availability.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gas.cluster.leader import LeaseRecord

log = logging.getLogger(__name__)

# How often a verb that finds gas inactive may read the Lease itself, at most.
RECHECK_INTERVAL = 0.5
# How often the same reason for refusing verbs is logged again, at most.
REFUSAL_LOG_INTERVAL = 30.0


class LeaseReader(Protocol):
    def get(self) -> LeaseRecord | None:
        """The Lease as stored now, or None if it does not exist; raises when the API
        server cannot be asked."""


@dataclass(frozen=True)
class Verdict:
    """What one reading of the Lease allows: answer until `until` (monotonic seconds), or
    not at all (`until` None) for the reason `why`."""

    until: float | None
    why: str


def micro_time(text: str) -> float | None:
    """An RFC 3339 time as the API server writes renewTime (`2006-01-02T15:04:05.000000Z`),
    in seconds since the epoch; None when it is not one, or has no time zone."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def judge(record: LeaseRecord | None, pod: str, wall: float, mono: float) -> Verdict:
    """Whether `record`, read when the wall clock said `wall` and the monotonic clock `mono`,
    lets the gas of pod `pod` answer, and until when.

    The Lease is this pod's while its holder is `<pod>_<anything>` (kube-scheduler's
    identity is `<hostname>_<uuid>`, and a pod's hostname is its name). It runs out at
    renewTime + leaseDurationSeconds: renewTime is the writer's wall clock, and the writer
    is the kube-scheduler of this same pod, on this node's clock. The time left is turned
    into a monotonic deadline at once, so a clock step after the read changes nothing; and
    it is never more than leaseDurationSeconds, so a renewTime ahead of this clock (which
    the same clock cannot have written unless it was stepped back) counts as written at
    the read.
    """
    if record is None:
        return Verdict(None, "the Lease does not exist")
    if not record.holder:
        return Verdict(None, "the Lease is held by nobody (released)")
    if not pod or not record.holder.startswith(pod + "_"):
        return Verdict(None, f"the Lease is held by {record.holder}, not by this pod ({pod})")
    if record.duration_seconds <= 0:
        return Verdict(None, f"the Lease's leaseDurationSeconds is {record.duration_seconds}")
    renewed = micro_time(record.renew_time)
    if renewed is None:
        return Verdict(None, f"the Lease's renewTime {record.renew_time!r} is not a time")
    duration = float(record.duration_seconds)
    left = min(renewed + duration - wall, duration)
    if left <= 0:
        return Verdict(None, f"the Lease ran out {-left:.1f}s ago (renewTime {record.renew_time})")
    return Verdict(mono + left, "")


class SchedulerLeaseFollower:
    """Follows one Lease written by kube-scheduler: `is_leader()` while it names this pod's
    kube-scheduler and has not run out. A thread reads it every `retry_period`;
    `may_answer()` reads it once more itself (at most every `recheck_interval`) before
    refusing, so a verb that arrives just after this pod's kube-scheduler took the Lease
    is answered rather than sent back to retry. When the Lease cannot be read, the last
    reading stands and runs out on its own."""

    def __init__(
        self,
        store: LeaseReader,
        pod: str,
        *,
        lease: str = "",
        retry_period: float = 2.0,
        recheck_interval: float = RECHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not pod:
            raise ValueError("following the scheduler's Lease needs this pod's name")
        if retry_period <= 0:
            raise ValueError(f"retryPeriod must be positive (got {retry_period})")
        self._store = store
        self._pod = pod
        self._lease = lease or "the scheduler's Lease"
        self.retry_period = retry_period
        self._recheck_interval = recheck_interval
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._lock = threading.Lock()
        self._verdict = Verdict(None, "the Lease has not been read yet")
        # Readings begun, and the one `_verdict` comes from, in the order they began.
        self._readings = 0
        self._judged = 0
        self._recheck_lock = threading.Lock()
        self._rechecked_at: float | None = None
        self._report_lock = threading.Lock()
        self._reported = False
        self._refusal_logged: tuple[str, float] | None = None
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ questions

    @property
    def identity(self) -> str:
        return self._pod

    def is_leader(self) -> bool:
        """True while the last reading named this pod's kube-scheduler and has not run out."""
        with self._lock:
            until = self._verdict.until
        return until is not None and self._clock() < until and not self._stop.is_set()

    def why_not(self) -> str:
        """Why the last reading does not let gas answer ("" when it does)."""
        with self._lock:
            verdict = self._verdict
        if self._stop.is_set():
            return "gas is stopping"
        if verdict.until is not None and self._clock() >= verdict.until:
            return "the Lease ran out since it was last read"
        return verdict.why

    def may_answer(self) -> bool:
        """`is_leader()`, after one more reading of the Lease when it says no (unless one
        was made within `recheck_interval`; verbs arriving together share one reading)."""
        if self.is_leader():
            return True
        if self._stop.is_set():
            return False
        with self._recheck_lock:
            now = self._clock()
            last = self._rechecked_at
            if last is None or now - last >= self._recheck_interval:
                self._rechecked_at = now
                try:
                    self.refresh()
                except Exception as exc:
                    log.warning("reading Lease %s failed: %s", self._lease, exc)
        self._report()
        leading = self.is_leader()
        if not leading:
            self._log_refusal()
        return leading

    # ------------------------------------------------------------ one reading

    def refresh(self) -> bool:
        """Read the Lease once and judge it; True if gas may answer afterwards. API errors
        propagate, and the previous reading stands."""
        with self._lock:
            self._readings += 1
            reading = self._readings
        mono, wall = self._clock(), self._wall()
        record = self._store.get()
        verdict = judge(record, self._pod, wall, mono)
        with self._lock:
            # The thread's reading and a verb's may overlap, and the older answer may come
            # back last: a reading begun earlier never replaces one begun after it, or a
            # verb that found the Lease just taken would be refused a moment later.
            if reading > self._judged:
                self._verdict, self._judged = verdict, reading
        self._report()
        return self.is_leader()

    def _report(self) -> None:
        with self._report_lock:
            leading = self.is_leader()
            if leading == self._reported:
                return
            self._reported = leading
            if leading:
                log.info(
                    "Lease %s names this pod's kube-scheduler (%s): answering the scheduler",
                    self._lease,
                    self._pod,
                )
            else:
                log.warning(
                    "no longer answering the scheduler (503): %s (Lease %s)",
                    self.why_not(),
                    self._lease,
                )
            if self._on_change is not None:
                self._on_change(leading)

    def _log_refusal(self) -> None:
        why, now = self.why_not(), self._clock()
        with self._report_lock:
            last = self._refusal_logged
            if last is not None and last[0] == why and now - last[1] < REFUSAL_LOG_INTERVAL:
                return
            self._refusal_logged = (why, now)
        log.warning("a scheduler verb answered 503: %s (Lease %s)", why, self._lease)

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scheduler-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
                if self._failing:
                    self._failing = False
                    log.info("reading Lease %s works again", self._lease)
            except Exception as exc:
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "reading Lease %s failed: %s; the last reading stands until it runs out",
                        self._lease,
                        exc,
                    )
                else:
                    log.debug("reading Lease %s failed again: %s", self._lease, exc)
            wait = self.retry_period
            with self._lock:
                until = self._verdict.until
            left = None if until is None else until - self._clock()
            if left is not None and left > 0:
                # Wake at the deadline too, so stepping down is logged and counted then.
                wait = min(wait, left + 0.001)
            self._stop.wait(wait)
            self._report()

    def stop(self) -> None:
        """Stop answering and reading. The Lease is kube-scheduler's: it is left alone."""
        self._stop.set()
        self._report()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.retry_period + 1)
