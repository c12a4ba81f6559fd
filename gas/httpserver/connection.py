"""One connection on the serving loop: TLS through memory buffers (the handshake never
blocks a thread), the protocol its peer chose, its deadline, and backpressure both ways.

A connection is asyncio's `Protocol`: the loop calls it as bytes arrive and as its output
drains. It holds no thread; a request's answer runs on the pool (or inline, for the verbs
that wait on nothing) and comes back through the loop. The HTTP/1.1 and HTTP/2 sides are
`Session`s (`gas.httpserver.http1`, `gas.httpserver.http2`) that see plaintext only.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from gas.httpserver.answering import App
from gas.httpserver.stats import CloseReason

if TYPE_CHECKING:
    from gas.httpserver.front import Front

__all__ = ["Connection", "Listener", "Session"]

log = logging.getLogger(__name__)

_READ = 64 * 1024
_LINGER = 1.0
"""How long a closed connection's last bytes (an error answer, a GOAWAY) may take to
leave before the socket is dropped."""


@dataclass(frozen=True)
class Listener:
    """What a listening socket serves: its app, its TLS context (None: plain HTTP; a
    callable, so a renewed certificate is used by the next handshake) and whether it
    offers HTTP/2."""

    app: App
    tls: Callable[[], ssl.SSLContext] | None
    http2: bool = False
    max_line: int = 8190
    """The request line's and each header field's bytes; an HTTP/2 header list's."""


class Session(Protocol):
    """A protocol's side of a connection, on plaintext."""

    @property
    def busy(self) -> bool:
        """Whether a request is being answered or its answer is going out."""

    def start(self) -> None: ...

    def received(self, data: bytes) -> None: ...

    @property
    def pending_bytes(self) -> int:
        """Answer bytes waiting for the peer's flow-control window."""

    def check(self, now: float) -> None:
        """Enforces the session's own deadlines (HTTP/2's per stream)."""

    def shutdown(self) -> None:
        """Takes no new request; the connection closes once those taken are answered."""


class Connection(asyncio.Protocol):
    def __init__(self, front: Front, listener: Listener) -> None:
        self.front = front
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.session: Session | None = None
        self.closed = False
        self.held = 0
        """Bytes this connection holds (`Front.hold`): request bodies not yet answered,
        and output its peer has not taken."""
        self._output_held = 0
        self.deadline: float | None = None
        self.deadline_reason = ""
        self._write_blocked_at: float | None = None
        self._paused: set[str] = set()
        self._tls: ssl.SSLObject | None = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()

    # Deadlines and state, for the sessions.

    def expect(self, seconds: float | None, reason: str = "") -> None:
        """The connection must make progress within `seconds` from now, or be closed for
        `reason`; None: no deadline."""
        self.deadline = None if seconds is None else self.front.now() + seconds
        self.deadline_reason = reason

    def pause(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._paused.add(why)

    def resume(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if not self._paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    @property
    def idle(self) -> bool:
        """No request in progress: a handshake, a request not yet begun, a quiet
        keep-alive."""
        return self.session is None or not self.session.busy

    # asyncio's calls.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's socket transport (uvloop's is no asyncio.Transport
        # subclass, but has its methods).
        self.transport = socket_transport = cast(asyncio.Transport, transport)
        self.peer = socket_transport.get_extra_info("peername")
        socket_transport.set_write_buffer_limits(high=self.front.limits.write_high_water)
        if not self.front.add(self):
            return
        if self.listener.tls is None:
            self.start_protocol("http/1.1")
            return
        self.expect(self.front.limits.handshake_timeout, CloseReason.HANDSHAKE_TIMEOUT)
        try:
            self._tls = self.listener.tls().wrap_bio(
                self._incoming, self._outgoing, server_side=True
            )
        except (ssl.SSLError, OSError) as exc:
            log.error("no TLS context for a new connection: %s", exc)
            self.close(CloseReason.HANDSHAKE_FAILED, str(exc))

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._tls is None:
            assert self.session is not None
            self.session.received(data)
            return
        self._incoming.write(data)
        if self.session is None and not self._handshake():
            return
        self._read_tls()

    def eof_received(self) -> bool:
        self.close(CloseReason.PEER)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self.front.remove(self, CloseReason.PEER, "")

    def pause_writing(self) -> None:
        self._write_blocked_at = self.front.now()
        self.pause("write")

    def resume_writing(self) -> None:
        self._write_blocked_at = None
        self.resume("write")

    # Output.

    def send(self, data: bytes) -> None:
        if self.closed or self.transport is None or not data:
            return
        if self._tls is None:
            self.transport.write(data)
            self.count_output()
            return
        view = memoryview(data)
        try:
            while view:
                written = self._tls.write(view)
                view = view[written:]
        except ssl.SSLError as exc:
            self.close(CloseReason.MALFORMED, f"TLS: {exc}")
            return
        self._flush_tls()
        self.count_output()

    def count_output(self) -> None:
        """Counts what waits to go out (`Front.hold`): queued in the transport, or for
        the peer's window."""
        if self.closed or self.transport is None:
            return
        waiting = self.transport.get_write_buffer_size()
        if self.session is not None:
            waiting += self.session.pending_bytes
        change, self._output_held = waiting - self._output_held, waiting
        if change > 0:
            self.front.hold(self, change)
        elif change < 0:
            self.front.unhold(self, -change)

    def close(self, reason: str, detail: str = "") -> None:
        """Closes the connection for `reason` (`CloseReason`), counted and, for abuse,
        logged; what was sent is flushed for a short while."""
        if self.closed:
            return
        self.closed = True
        self.front.remove(self, reason, detail)
        transport = self.transport
        if transport is None:
            return
        if self._write_blocked_at is not None or reason == CloseReason.WRITE_TIMEOUT:
            transport.abort()  # its peer reads nothing: what is queued would never leave
            return
        transport.close()
        if transport.get_write_buffer_size():
            self.front.loop.call_later(_LINGER, transport.abort)

    def check(self, now: float) -> None:
        """The sweep's call: closes the connection past its deadline or when its peer has
        read nothing for the write timeout."""
        if self.closed:
            return
        if self.deadline is not None and now >= self.deadline:
            self.close(self.deadline_reason)
            return
        blocked = self._write_blocked_at
        if blocked is not None and now - blocked >= self.front.limits.write_timeout:
            self.close(CloseReason.WRITE_TIMEOUT)
            return
        if self.session is not None:
            self.session.check(now)
        self.count_output()

    def shutdown(self) -> None:
        if self.session is None:
            self.close(CloseReason.SHUTDOWN)
        else:
            self.session.shutdown()

    # TLS.

    def _handshake(self) -> bool:
        assert self._tls is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush_tls()
            return False
        except (ssl.SSLError, OSError) as exc:
            self._flush_tls()  # the alert
            self.close(CloseReason.HANDSHAKE_FAILED, str(exc))
            return False
        self._flush_tls()
        self.start_protocol(self._tls.selected_alpn_protocol() or "http/1.1")
        return not self.closed

    def _read_tls(self) -> None:
        tls = self._tls
        assert tls is not None and self.session is not None
        chunks = []
        while True:
            try:
                data = tls.read(_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.close(CloseReason.PEER)  # close_notify
                return
            except ssl.SSLError as exc:
                self.close(CloseReason.MALFORMED, f"TLS: {exc}")
                return
            if not data:
                break
            chunks.append(data)
            # Drained: no need for the read that would end in SSLWantReadError.
            if not self._incoming.pending and not tls.pending():
                break
        if chunks:
            self.session.received(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if self._outgoing.pending:
            self._flush_tls()

    def _flush_tls(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        out = self._outgoing.read()
        if out:
            self.transport.write(out)

    def start_protocol(self, protocol: str) -> None:
        from gas.httpserver import http1, http2

        self.expect(None)  # the handshake's; the session sets its own
        opened = self.listener.app.opened
        if opened is not None:
            opened(protocol)
        if protocol == "h2" and self.listener.http2:
            self.session = http2.Http2Session(self)
        else:
            self.session = http1.Http1Session(self, self.listener.max_line)
        self.session.start()
