"""Doubles for leader election: a clock that moves only when told, and one Lease in memory
with resourceVersions, whose requests can be delayed, lost, or fail (the leader-election
double of tests/integration/test_leader.py and tests/unit/test_follow.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gas.cluster.leader import LeaseConflict, LeaseRecord


class Clock:
    """Monotonic seconds that only move when told; `watchers` run after every move."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.watchers: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for watch in self.watchers:
            watch()


class Unavailable(Exception):
    pass


class FakeStore:
    """One Lease with resourceVersions. `before`/`after` hooks run around the moment the
    server applies a request (to model latency, lost requests and lost answers)."""

    def __init__(self) -> None:
        self.lease: LeaseRecord | None = None
        self.version = 0
        self.fail = False
        self.before: Callable[[], None] = lambda: None
        self.after: Callable[[], None] = lambda: None
        self.writes = 0

    def _request(self, apply: Callable[[], Any]) -> Any:
        self.before()
        if self.fail:
            raise Unavailable("API server unavailable")
        result = apply()
        self.after()
        return result

    def get(self) -> LeaseRecord | None:
        return self._request(lambda: self.lease)  # type: ignore[no-any-return]

    def create(self, record: LeaseRecord) -> LeaseRecord:
        def apply() -> LeaseRecord:
            if self.lease is not None:
                raise LeaseConflict("exists")
            return self._store(record)

        return self._request(apply)  # type: ignore[no-any-return]

    def update(self, record: LeaseRecord) -> LeaseRecord:
        def apply() -> LeaseRecord:
            if self.lease is None or self.lease.resource_version != record.resource_version:
                raise LeaseConflict("modified")
            return self._store(record)

        return self._request(apply)  # type: ignore[no-any-return]

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.writes += 1
        self.lease = LeaseRecord(
            holder=record.holder,
            duration_seconds=record.duration_seconds,
            acquire_time=record.acquire_time,
            renew_time=record.renew_time,
            transitions=record.transitions,
            resource_version=str(self.version),
        )
        return self.lease
