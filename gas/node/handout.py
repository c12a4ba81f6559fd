"""The `gas-node-cards` pod annotation: what the node agent handed out, per container.

Same format as `gas-container-cards` (one `|`-separated segment per `spec.containers`
entry, cards comma-separated, empty for a container given no GPU), so `gas inspect` can
put what gas decided next to what the node gave and flag drift. Written after `Allocate`,
off the gRPC path: a merge patch of the annotation guarded by the pod's UID, retried with
backoff, the newest value per pod winning.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gas.core.model import ANNOTATION_NODE_CARDS, is_card_name, sort_cards
from gas.node.devices import DeviceIdError, card_of
from gas.node.identify import PodRecord
from gas.node.metrics import NodeMetrics
from gas.node.podapi import NodeApi, PodGone, Rejected

log = logging.getLogger(__name__)

Segments = tuple[tuple[str, ...], ...]


def parse_segments(value: str | None, containers: int) -> list[tuple[str, ...]]:
    """A previous `gas-node-cards` value, leniently: empty segments when unreadable."""
    empty: list[tuple[str, ...]] = [() for _ in range(containers)]
    if value is None:
        return empty
    parts = value.split("|")
    if len(parts) != containers:
        return empty
    result = []
    for part in parts:
        cards = tuple(c for c in part.split(",") if c)
        if not all(is_card_name(c) for c in cards):
            return empty
        result.append(cards)
    return result


def cards_of_ids(ids: Collection[str]) -> tuple[str, ...]:
    cards = set()
    for value in ids:
        try:
            cards.add(card_of(value))
        except DeviceIdError:
            continue
    return sort_cards(cards)


def handed_out(
    pod: PodRecord,
    previous: Sequence[tuple[str, ...]] | None,
    held: Mapping[str, Collection[str]],
    container: int,
    cards: Sequence[str],
) -> Segments:
    """The annotation's segments after giving `cards` to container number `container`:
    what was recorded before (this agent's memory, else the pod's annotation), what the
    kubelet says each container holds (`held`: container name -> device IDs of the
    plugin's resources), then this grant."""
    count = len(pod.containers)
    segments = (
        list(previous)
        if previous is not None and len(previous) == count
        else parse_segments(pod.node_cards, count)
    )
    for index, record in enumerate(pod.containers):
        ids = held.get(record.name)
        if ids:
            segments[index] = tuple(sort_cards(set(segments[index]) | set(cards_of_ids(ids))))
    segments[container] = sort_cards(cards)
    return tuple(segments)


def held_segments(pod: PodRecord, held: Mapping[str, Collection[str]]) -> Segments:
    """The annotation's segments from what the kubelet says each container holds."""
    return tuple(cards_of_ids(held.get(record.name, ())) for record in pod.containers)


def format_segments(segments: Segments) -> str:
    return "|".join(",".join(cards) for cards in segments)


class HandoutWriter(threading.Thread):
    """Patches `gas-node-cards` on its own thread; the newest value per pod wins."""

    BASE_DELAY = 0.5
    MAX_DELAY = 30.0
    MAX_ATTEMPTS = 12

    def __init__(self, api: NodeApi, metrics: NodeMetrics, stop: threading.Event) -> None:
        super().__init__(name="handout-writer", daemon=True)
        self._api = api
        self._metrics = metrics
        self._stop_event = stop
        self._cond = threading.Condition(threading.RLock())
        self._segments: dict[str, Segments] = {}
        self._wanted: dict[str, tuple[str, str, str]] = {}  # uid -> namespace, name, value
        self._due: list[tuple[float, str]] = []
        self._attempts: dict[str, int] = {}

    def segments(self, uid: str) -> Segments | None:
        with self._cond:
            return self._segments.get(uid)

    def record(self, pod: PodRecord, segments: Segments) -> None:
        with self._cond:
            self._segments[pod.uid] = segments
            self._wanted[pod.uid] = (pod.namespace, pod.name, format_segments(segments))
            self._attempts[pod.uid] = 0
            heapq.heappush(self._due, (time.monotonic(), pod.uid))
            self._cond.notify()

    def forget(self, uid: str) -> None:
        with self._cond:
            self._segments.pop(uid, None)
            self._wanted.pop(uid, None)
            self._attempts.pop(uid, None)

    def pending(self) -> int:
        with self._cond:
            return len(self._wanted)

    def reconcile(self, pods: Sequence[PodRecord], held: Mapping[tuple[str, str], Any]) -> int:
        """Record afresh every running or pending pod whose annotation differs from what
        the kubelet says its containers hold (`held`: (namespace, name) -> container ->
        device IDs); a write lost to a restart is made good here. Returns how many."""
        count = 0
        for pod in pods:
            containers = held.get(pod.key)
            if pod.phase not in ("Pending", "Running") or not containers:
                continue
            segments = held_segments(pod, containers)
            if not any(segments) or format_segments(segments) == pod.node_cards:
                continue
            with self._cond:
                busy = pod.uid in self._wanted
            if not busy:
                self.record(pod, segments)
                count += 1
        return count

    def flush(self, timeout: float) -> bool:
        """Write what is queued (at shutdown); True when nothing is left."""
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            job = self._next_due()
            if job is None:
                time.sleep(0.05)
                continue
            self._write(*job)
        return not self.pending()

    def _next_due(self) -> tuple[str, str, str, str] | None:
        with self._cond:
            while self._due and self._due[0][1] not in self._wanted:
                heapq.heappop(self._due)
            if self._due and self._due[0][0] <= time.monotonic():
                _, uid = heapq.heappop(self._due)
                namespace, name, value = self._wanted[uid]
                return uid, namespace, name, value
        return None

    def run(self) -> None:
        while not self._stop_event.is_set():
            job = self._next()
            if job is not None:
                self._write(*job)

    def _next(self) -> tuple[str, str, str, str] | None:
        with self._cond:
            while not self._stop_event.is_set():
                job = self._next_due()
                if job is not None:
                    return job
                wait = self._due[0][0] - time.monotonic() if self._due else 0.5
                self._cond.wait(min(max(wait, 0.01), 0.5))
        return None

    def _write(self, uid: str, namespace: str, name: str, value: str) -> None:
        try:
            self._api.patch_pod_annotation(namespace, name, uid, ANNOTATION_NODE_CARDS, value)
        except (PodGone, Rejected) as exc:
            log.warning("%s of %s/%s not recorded: %s", ANNOTATION_NODE_CARDS, namespace, name, exc)
            self._metrics.annotations.labels(
                "gone" if isinstance(exc, PodGone) else "rejected"
            ).inc()
            self._done(uid, value)
            return
        except Exception as exc:
            with self._cond:
                attempts = self._attempts.get(uid, 0) + 1
                self._attempts[uid] = attempts
                if self._wanted.get(uid, ("", "", ""))[2] != value:
                    return  # a newer value is queued already
                if attempts >= self.MAX_ATTEMPTS:
                    log.error(
                        "%s of %s/%s not recorded after %d attempts: %s",
                        ANNOTATION_NODE_CARDS,
                        namespace,
                        name,
                        attempts,
                        exc,
                    )
                    self._metrics.annotations.labels("failed").inc()
                    self._wanted.pop(uid, None)
                    return
                delay = min(self.BASE_DELAY * 2 ** (attempts - 1), self.MAX_DELAY)
                heapq.heappush(self._due, (time.monotonic() + delay, uid))
            log.info(
                "patching %s of %s/%s failed (%s); retrying",
                ANNOTATION_NODE_CARDS,
                namespace,
                name,
                exc,
            )
            return
        self._metrics.annotations.labels("ok").inc()
        self._done(uid, value)

    def _done(self, uid: str, value: str) -> None:
        with self._cond:
            if self._wanted.get(uid, ("", "", ""))[2] == value:
                self._wanted.pop(uid, None)
