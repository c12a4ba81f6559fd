"""What a peer may cost gas's listeners, and the rate limits that hold it to that.

Pure: no I/O, no clock of its own (callers pass `now`), so each bound is tested at its
edge without sleeping. `docs/serving.md` says what a peer that reaches each one sees.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "Limits", "TokenBucket"]

MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The bounds of one listening process.

    Times are seconds; each runs from the start of its phase and is never extended by
    bytes trickling in, so a peer sending one byte at a time gains nothing.
    """

    max_connections: int = 1024
    """Connections open at once. At the bound the connection that has waited longest
    without a request in progress is closed for the new one (a handshake, a request's
    head or an idle keep-alive), so silent peers cannot lock others out."""
    handshake_timeout: float = 10.0
    """From accept to a finished TLS handshake."""
    header_timeout: float = 10.0
    """To a request's complete head: from the handshake for the first request, from its
    first byte for the next ones on an HTTP/1.1 connection, from its HEADERS frame on an
    HTTP/2 stream."""
    body_timeout: float = 30.0
    """To a request's complete body, from its complete head."""
    idle_timeout: float = 120.0
    """A connection with no request in progress. Over HTTP/2 only a new request counts:
    PING, SETTINGS and WINDOW_UPDATE frames do not keep a connection open. Longer than Go's
    90 s idle timeout, so kube-scheduler and the API server, not gas, close idle
    connections: a request racing a server-side close would fail without a retry."""
    write_timeout: float = 30.0
    """An answer the peer does not read: the connection is closed when its queued output
    has not drained for this long."""
    max_buffered_bytes: int = 64 * MIB
    """Request bytes held in the process (bodies not yet handed to the app, output not
    yet taken by peers). Past it the connection holding the most is closed."""
    write_high_water: int = 256 * 1024
    """Queued output at which a connection is no longer read until its peer reads."""
    h2_max_streams: int = 64
    """Streams an HTTP/2 peer may have open at once."""
    h2_stream_window: int = 1 * MIB
    """The flow-control window of each HTTP/2 stream."""
    h2_reset_burst: int = 200
    h2_reset_rate: float = 20.0
    """Streams an HTTP/2 peer may reset: a burst, then this many a second. Past it: GOAWAY
    ENHANCE_YOUR_CALM (CVE-2023-44487, rapid reset)."""
    h2_control_burst: int = 1000
    h2_control_rate: float = 100.0
    """Frames that cost work and carry no request (SETTINGS, PING, PRIORITY, WINDOW_UPDATE,
    an empty DATA or CONTINUATION): a burst, this many a second, and h2_control_per_stream
    more for each request the peer opens. Past it: GOAWAY ENHANCE_YOUR_CALM."""
    h2_control_per_stream: int = 20

    def check(self) -> None:
        """Raises ValueError naming the first bound that makes no sense."""
        positive = {
            "max_connections": self.max_connections,
            "handshake_timeout": self.handshake_timeout,
            "header_timeout": self.header_timeout,
            "body_timeout": self.body_timeout,
            "idle_timeout": self.idle_timeout,
            "write_timeout": self.write_timeout,
            "max_buffered_bytes": self.max_buffered_bytes,
            "write_high_water": self.write_high_water,
            "h2_max_streams": self.h2_max_streams,
            "h2_reset_burst": self.h2_reset_burst,
            "h2_control_burst": self.h2_control_burst,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be more than 0, got {value!r}")
        for name, rate in (
            ("h2_reset_rate", self.h2_reset_rate),
            ("h2_control_rate", self.h2_control_rate),
            ("h2_control_per_stream", self.h2_control_per_stream),
        ):
            if rate < 0:
                raise ValueError(f"{name} must not be negative, got {rate!r}")
        if not 65535 <= self.h2_stream_window <= 2**31 - 1:
            raise ValueError(
                f"h2_stream_window must be between 65535 and 2^31-1, got {self.h2_stream_window}"
            )


DEFAULT_LIMITS = Limits()


class TokenBucket:
    """`capacity` tokens, refilled at `rate` a second up to `capacity`; `take` spends one.

    The bucket starts full: a peer gets its burst at once, then the rate.
    """

    __slots__ = ("_at", "_capacity", "_rate", "_tokens")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self._capacity = float(capacity)
        self._rate = rate
        self._tokens = float(capacity)
        self._at = now

    def take(self, now: float) -> bool:
        """Spends a token: False when none is left (the caller refuses)."""
        if now > self._at:
            self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
            self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def give(self, tokens: float) -> None:
        """Adds tokens earned by useful work, up to the capacity."""
        self._tokens = min(self._capacity, self._tokens + tokens)

    @property
    def tokens(self) -> float:
        return self._tokens
