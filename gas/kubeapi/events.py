"""core/v1 Events: their body, and the thread that posts them.

An Event is never worth delaying or failing a decision (a bind, a device-plugin answer), so
they are queued, posted on their own thread, and dropped when the API server cannot keep
up.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

QUEUE_SIZE = 1000
"""Events waiting to be posted; past this, new ones are dropped (and counted)."""


def event_body(
    involved: Mapping[str, Any],
    event_type: str,
    reason: str,
    message: str,
    *,
    component: str,
    instance: str,
    host: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about `involved` (kind, name, namespace, uid), from `component`
    (`instance` of it; on node `host`, when it runs on one)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = str(involved.get("namespace") or "default")
    source = {"component": component}
    if host is not None:
        source["host"] = host
    return {
        "metadata": {"generateName": f"{involved.get('name')}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", **involved},
        "type": event_type,
        "reason": reason,
        "message": message[:1000],
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class EventSender(threading.Thread):
    """Posts Events from a bounded queue on its own thread, through `post(namespace,
    event)`, until `stop` is set. A failed post is logged at `failure_level` and the Event
    dropped."""

    def __init__(
        self,
        post: Callable[[str, dict[str, Any]], None],
        stop: threading.Event,
        failure_level: int = logging.WARNING,
    ) -> None:
        super().__init__(name="event-sender", daemon=True)
        self._post = post
        self._stop_event = stop
        self._failure_level = failure_level
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(maxsize=QUEUE_SIZE)
        self.dropped = 0

    def send(self, event: dict[str, Any]) -> None:
        """Queue `event` (its namespace in its metadata), or drop it if the queue is full."""
        try:
            self._queue.put_nowait((str(event["metadata"]["namespace"]), event))
        except queue.Full:
            self.dropped += 1

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                namespace, event = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._post(namespace, event)
            except Exception as exc:
                log.log(
                    self._failure_level,
                    "event %s about %s not posted: %s",
                    event.get("reason"),
                    event.get("involvedObject"),
                    exc,
                )
