"""What the listeners count: open connections, connections closed by each limit or
timeout, requests dropped because their stream was reset. Exposed to Prometheus by the app
that is served (`hooks.SERVING_STATS`), and a rate-limited log line for each peer closed
for abuse or refused in its handshake."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["ABUSE", "CloseReason", "ServingStats"]

log = logging.getLogger("gas.peers")


class CloseReason:
    """Why a connection was closed: the `reason` label of gas_connections_closed_total."""

    PEER = "peer_closed"
    DONE = "done"
    SHUTDOWN = "shutdown"
    HANDSHAKE_FAILED = "handshake_failed"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    HEADER_TIMEOUT = "header_timeout"
    BODY_TIMEOUT = "body_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    WRITE_TIMEOUT = "write_timeout"
    CONNECTION_LIMIT = "connection_limit"
    BUFFER_LIMIT = "buffer_limit"
    BODY_LIMIT = "body_limit"
    MALFORMED = "malformed"
    RESET_FLOOD = "reset_flood"
    CONTROL_FLOOD = "control_flood"


ABUSE = frozenset(
    {
        CloseReason.HANDSHAKE_TIMEOUT,
        CloseReason.HEADER_TIMEOUT,
        CloseReason.BODY_TIMEOUT,
        CloseReason.WRITE_TIMEOUT,
        CloseReason.BUFFER_LIMIT,
        CloseReason.MALFORMED,
        CloseReason.RESET_FLOOD,
        CloseReason.CONTROL_FLOOD,
    }
)
"""Reasons that name the peer in a warning: it kept gas waiting or broke a limit."""
_LOGGED = {reason: logging.WARNING for reason in ABUSE} | {
    # A refused certificate or protocol version: the reason OpenSSL gave, at INFO (port
    # scanners fail handshakes all day).
    CloseReason.HANDSHAKE_FAILED: logging.INFO,
}
_LOG_INTERVAL = 1.0
_LOG_KEYS = 256
"""Distinct (reason, detail) pairs whose last line's time is kept; the details are the
protocol's and OpenSSL's own messages, a short list, but a bound all the same."""


class ServingStats:
    """Counters the serving loop keeps (one thread writes, a scrape reads), and a
    Prometheus collector over them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.open = 0
        self.closed: dict[str, int] = {}
        self.reset_skipped = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._logged_at: dict[tuple[str, str], float] = {}
        self._unlogged: dict[tuple[str, str], int] = {}

    def opened(self) -> None:
        self.open += 1

    def close(self, reason: str, peer: object, detail: str = "") -> None:
        """Counts a connection closed for `reason`. One closed for abuse, or a refused
        handshake, is logged with its peer, at most once a second for each reason and
        detail (the rest counted into the next line)."""
        self.open -= 1
        with self._lock:
            self.closed[reason] = self.closed.get(reason, 0) + 1
        level = _LOGGED.get(reason)
        if level is None:
            return
        key = (reason, detail)
        now = self._clock()
        if now - self._logged_at.get(key, -_LOG_INTERVAL) < _LOG_INTERVAL:
            self._unlogged[key] = self._unlogged.get(key, 0) + 1
            return
        if len(self._logged_at) >= _LOG_KEYS:
            self._logged_at.clear()
            self._unlogged.clear()
        self._logged_at[key] = now
        more = self._unlogged.pop(key, 0)
        log.log(
            level,
            "closed connection from %s: %s%s%s",
            _peer_text(peer),
            reason,
            f" ({detail})" if detail else "",
            f"; {more} more like it since the last line" if more else "",
        )

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "gas_open_connections", "Connections open on gas's listeners.", value=self.open
        )
        closed = CounterMetricFamily(
            "gas_connections_closed",
            "Connections closed, by reason: the peer closed, done, shutdown, or the limit "
            "or timeout that closed it (docs/serving.md).",
            labels=["reason"],
        )
        with self._lock:
            counts = dict(self.closed)
        for reason, count in sorted(counts.items()):
            closed.add_metric([reason], count)
        yield closed
        yield CounterMetricFamily(
            "gas_reset_requests_skipped",
            "Requests not run because the peer reset their HTTP/2 stream before the answer began.",
            value=self.reset_skipped,
        )


def _peer_text(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
