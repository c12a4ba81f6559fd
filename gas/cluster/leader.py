"""Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.

`Elector` runs the election over a `LeaseStore` (`KubeLeaseStore` on the API server), timed
by this replica's monotonic clock alone; `LeaderGatedCluster` makes a follower answer the
scheduler with 503 (and, in this mode, unready). `gas.cluster.follow` offers the same
`Leadership` without an election of gas's own. The rules for taking, renewing, stepping
down and releasing the Lease, and why: docs/high-availability.md.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)

LEASE_NAME = "gas-extender"
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease that the election reads and writes."""

    holder: str = ""
    duration_seconds: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0
    resource_version: str = ""


class LeaseConflict(Exception):
    """The Lease changed (or was created) since it was read: 409 from the API server."""


class LeaseStore(Protocol):
    def get(self) -> LeaseRecord | None:
        """The Lease as stored now, or None if it does not exist."""

    def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease; LeaseConflict if it exists."""

    def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the Lease if its resourceVersion is still record.resource_version;
        LeaseConflict otherwise."""


@dataclass(frozen=True)
class ElectionConfig:
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("the leader-election identity must not be empty")
        if not 0 < self.retry_period * 1.2 < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs leaseDuration > renewDeadline > 1.2 * retryPeriod > 0 "
                f"(got {self.lease_duration}, {self.renew_deadline}, {self.retry_period})"
            )


def _wall_now() -> str:
    return datetime.now(UTC).strftime(_MICRO_TIME)


class Elector:
    """The election state machine. `step()` is one read-decide-write round; `start()` runs
    rounds on a thread. Time comes from `clock` (monotonic seconds) so tests can drive it."""

    def __init__(
        self,
        store: LeaseStore,
        config: ElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = _wall_now,
        eligible: Callable[[], bool] = lambda: True,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._store = store
        self.config = config
        self._clock = clock
        self._wall = wall
        self._eligible = eligible
        self._on_change = on_change
        self._lock = threading.Lock()
        self._leader_until: float | None = None
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._reported = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ questions

    def is_leader(self) -> bool:
        """True while the last successful renewal is younger than renewDeadline."""
        with self._lock:
            until = self._leader_until
        return until is not None and self._clock() < until

    def may_answer(self) -> bool:
        """`is_leader()`: the election's thread keeps it current."""
        return self.is_leader()

    def why_not(self) -> str:
        """Why this replica does not lead now ("" when it does), from the last reading."""
        if self.is_leader():
            return ""
        if self._stop.is_set():
            return "gas is stopping"
        observed = self._observed
        if observed is not None and observed.holder not in ("", self.identity):
            return f"replica {observed.holder} holds the Lease"
        return "this replica has not acquired the Lease yet"

    @property
    def identity(self) -> str:
        return self.config.identity

    # ------------------------------------------------------------ one round

    def step(self) -> bool:
        """Try to acquire or renew once. True if this replica holds the Lease afterwards.
        API errors propagate (the caller backs off); leadership then lapses on its own at
        its deadline."""
        try:
            return self._step()
        finally:
            self._report()

    def _step(self) -> bool:
        started = self._clock()
        record = self._store.get()
        now = self._clock()
        if record is None:
            if not self._eligible():
                return False
            wall = self._wall()
            new = LeaseRecord(
                holder=self.identity,
                duration_seconds=_whole_seconds(self.config.lease_duration),
                acquire_time=wall,
                renew_time=wall,
            )
            return self._write(self._store.create, new, started)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        held_by_other = record.holder not in ("", self.identity)
        if held_by_other:
            # Whatever we believed, someone else holds it now.
            self._set_leader(None)
            if self._observed_at + record.duration_seconds > now:
                return False
        if record.holder != self.identity and not self._eligible():
            return False
        wall = self._wall()
        ours = record.holder == self.identity
        new = LeaseRecord(
            holder=self.identity,
            duration_seconds=_whole_seconds(self.config.lease_duration),
            acquire_time=record.acquire_time if ours else wall,
            renew_time=wall,
            transitions=record.transitions if ours else record.transitions + 1,
            resource_version=record.resource_version,
        )
        return self._write(self._store.update, new, started)

    def _write(
        self, call: Callable[[LeaseRecord], LeaseRecord], new: LeaseRecord, started: float
    ) -> bool:
        try:
            written = call(new)
        except LeaseConflict:
            # Someone wrote first; the next read shows who. Not an error: no backoff.
            return self.is_leader()
        with self._lock:
            if not self._stop.is_set():
                self._leader_until = started + self.config.renew_deadline
        self._observed, self._observed_at = written, self._clock()
        return self.is_leader()

    def _set_leader(self, until: float | None) -> None:
        with self._lock:
            self._leader_until = until

    def _report(self) -> None:
        leading = self.is_leader()
        if leading != self._reported:
            self._reported = leading
            if leading:
                log.info("leader election: %s is now the leader", self.identity)
            else:
                log.warning("leader election: %s is no longer the leader", self.identity)
            if self._on_change is not None:
                self._on_change(leading)

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = self.config.retry_period
        while not self._stop.is_set():
            try:
                self.step()
                delay = self.config.retry_period
            except Exception as exc:
                self._report()
                log.warning("leader election: lease request failed: %s", exc)
                delay = min(delay * 2, self.config.lease_duration)
            wait = delay
            until = self._leader_until
            if until is not None:
                # A leader retries at its pace whatever the errors: it has until its
                # deadline to renew.
                wait = min(wait, self.config.retry_period)
            self._stop.wait(wait * random.uniform(1.0, 1.2))
            self._report()

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; the leader steps down first, then gives the Lease up."""
        with self._lock:
            was_leader = self._leader_until is not None and self._clock() < self._leader_until
            self._leader_until = None
        self._stop.set()
        self._report()
        if release and was_leader:
            try:
                self._release()
            except Exception as exc:
                log.warning("leader election: could not release the lease: %s", exc)

    def _release(self) -> None:
        record = self._store.get()
        if record is None or record.holder != self.identity:
            return
        self._store.update(replace(record, holder="", duration_seconds=1, renew_time=self._wall()))
        log.info("leader election: %s released the lease", self.identity)


def _whole_seconds(seconds: float) -> int:
    # leaseDurationSeconds is an integer; never round a lease down.
    return max(1, int(-(-seconds // 1)))


# ---------------------------------------------------------------------- the real store


class KubeLeaseStore:
    """The Lease through the official client, read and written as plain JSON."""

    def __init__(self, api_client: Any, namespace: str, name: str, timeout: float) -> None:
        from kubernetes.client.exceptions import ApiException

        from gas.kubeapi.core import RawCoordinationV1Api

        self._api = RawCoordinationV1Api(api_client)
        self._exception = ApiException
        self.namespace = namespace
        self.name = name
        self._timeout = (timeout, timeout)

    def get(self) -> LeaseRecord | None:
        try:
            response = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
        except self._exception as exc:
            if exc.status == 404:
                return None
            raise
        return _record(json.loads(response.data))

    def create(self, record: LeaseRecord) -> LeaseRecord:
        try:
            response = self._api.create_namespaced_lease(
                self.namespace, self._body(record), _request_timeout=self._timeout
            )
        except self._exception as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc.reason)) from exc
            raise
        return _record(json.loads(response.data))

    def update(self, record: LeaseRecord) -> LeaseRecord:
        try:
            response = self._api.replace_namespaced_lease(
                self.name, self.namespace, self._body(record), _request_timeout=self._timeout
            )
        except self._exception as exc:
            if exc.status in (404, 409):
                raise LeaseConflict(str(exc.reason)) from exc
            raise
        return _record(json.loads(response.data))

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        # A plain dict: the client serialises it as it is (no model round trip).
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record.resource_version:
            metadata["resourceVersion"] = record.resource_version
        spec: dict[str, Any] = {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.duration_seconds,
            "leaseTransitions": record.transitions,
        }
        if record.acquire_time:
            spec["acquireTime"] = record.acquire_time
        if record.renew_time:
            spec["renewTime"] = record.renew_time
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }


def _record(lease: Mapping[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    metadata = lease.get("metadata") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=str(spec.get("acquireTime") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str(metadata.get("resourceVersion") or ""),
    )


def pod_name() -> str:
    """The pod's name: POD_NAME (from the downward API), else the hostname, which in a pod
    is the pod's name unless the pod sets `spec.hostname`."""
    return os.environ.get("POD_NAME", "").strip() or socket.gethostname()


def default_identity() -> str:
    """The pod's name plus a random suffix: a restarted container must not inherit its
    predecessor's leadership."""
    return f"{pod_name() or 'gas'}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """POD_NAMESPACE, else the service account's namespace file, else `default`."""
    namespace = os.environ.get("POD_NAMESPACE", "").strip()
    if namespace:
        return namespace
    try:
        with open(NAMESPACE_FILE) as file:
            namespace = file.read().strip()
    except OSError:
        namespace = ""
    return namespace or "default"


# ---------------------------------------------------------------------- the gate


class Leadership(Protocol):
    """Whether this replica may answer the scheduler: `Elector` (an election of gas's own)
    or `gas.cluster.follow.SchedulerLeaseFollower` (kube-scheduler's own Lease)."""

    @property
    def identity(self) -> str:
        """Who this replica is, for logs."""

    def is_leader(self) -> bool:
        """Whether it leads now, from what it already knows (no I/O)."""

    def may_answer(self) -> bool:
        """Whether a verb that has just arrived may be answered; may ask the API server
        first when `is_leader()` says no."""

    def why_not(self) -> str:
        """Why it may not answer now ("" when it may), for the operator (no I/O)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class LeaderGatedCluster:
    """A Cluster whose `synced()` is also false when this replica does not lead, so
    filter, prioritize, preempt and bind answer 503 on followers. `ready()` answers
    /readyz: with `ready_when_following` it is the wrapped cluster's `synced()` (every
    replica ready once synced), otherwise it is `synced()` (only the leader ready).
    Everything else is the wrapped cluster's: followers keep their ledger warm from the
    watch."""

    def __init__(
        self, cluster: Any, elector: Leadership, *, ready_when_following: bool = False
    ) -> None:
        self._cluster = cluster
        self.elector = elector
        self._ready_when_following = ready_when_following

    def start(self) -> None:
        self._cluster.start()
        self.elector.start()

    def stop(self) -> None:
        self.elector.stop()
        self._cluster.stop()

    def synced(self) -> bool:
        # The cluster first: leadership may cost a Lease read, which an unsynced replica
        # has no use for.
        return bool(self._cluster.synced() and self.elector.may_answer())

    def inactive(self) -> str:
        """Why this replica, synced, does not answer the verbs now: "" when it answers them
        or is not synced (the caller says that itself). No I/O: called after `synced()`
        has just asked."""
        if not self._cluster.synced() or self.elector.is_leader():
            return ""
        return (
            "gas is synced but this replica does not answer the scheduler now: "
            f"{self.elector.why_not()}"
        )

    def ready(self) -> bool:
        if self._ready_when_following:
            return bool(self._cluster.synced())
        return self.synced()

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod: dict[str, Any] | None = self._cluster.get_pod(namespace, name)
        return pod

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
        self._cluster.bind(pod, node, annotations)

    def record_event(
        self, pod: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        self._cluster.record_event(pod, event_type, reason, message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


def leader_gauge(metrics: Any) -> Callable[[bool], None]:
    """`gas_leader` (1 on the replica that leads) in the app's registry, and the callback
    that keeps it up to date."""
    from prometheus_client import Gauge

    gauge = Gauge(
        "gas_leader",
        "1 when this replica answers the scheduler's verbs: it holds the gas-extender Lease "
        "(--leaderElect), or its pod's kube-scheduler holds the Lease it follows "
        "(--schedulerLease); else 0.",
        registry=metrics.registry,
    )
    gauge.set(0)
    return lambda leading: gauge.set(1 if leading else 0)
