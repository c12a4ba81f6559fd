"""HTTP/2 on a serving-loop connection that chose it through ALPN: every call of
kube-scheduler's extender client on one connection.

Go's HTTP client keeps two idle HTTP/1.1 connections per host; with binds in flight next
to filters, kube-scheduler opens further ones and drops them, a new mutual-TLS handshake
for about every third pod. Over HTTP/2 it multiplexes every call on a single connection.

The protocol is `gas.httpserver.h2protocol`'s; this side keeps the streams. A stream's
request is answered once whole: on the loop for the paths that wait on nothing
(`Front.inline`), else on the pool, so a bind waiting on the API server does not hold up
a filter. A stream reset before its answer began is not answered, nor run if it had not
started. Its body stays counted (`Front.hold`, and the connection's flow-control window)
until its answer is sent, so what a peer's streams hold is bounded by the window however
many it opens; an answer larger than the peer's window waits for it to open.

Deadlines (`gas.httpserver.limits.Limits`): a header block within `header_timeout`; each
stream's whole request within `body_timeout` of its HEADERS, and its answer taken within
`write_timeout` (else the stream is reset, the connection goes on); the first request
within `header_timeout`; no open stream for `idle_timeout`: GOAWAY and close. Only
requests count as activity. On shutdown GOAWAY names the streams taken, which are answered
before the connection closes.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gas.httpserver import answering, h2protocol
from gas.httpserver.stats import CloseReason

if TYPE_CHECKING:
    from gas.httpserver.connection import Connection

__all__ = ["Http2Session"]

log = logging.getLogger(__name__)

_SPARE_WINDOW = 1024 * 1024
"""The connection's window beyond one body at the app's limit: room for the small calls
that go with a large one."""
_WINDOW_WITHOUT_LIMIT = 8 * 1024 * 1024


@dataclass(slots=True, eq=False)
class _Stream:
    stream_id: int
    headers: list[tuple[bytes, bytes]]
    opened: float
    method: str = ""
    path: str = ""
    declared: int | None = None
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    ended: bool = False
    dispatched: bool = False
    reset: bool = False
    pending: bytes = b""
    pending_since: float = 0.0


class Http2Session:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        front = conn.front
        limit = conn.listener.app.body_limit
        window = (_WINDOW_WITHOUT_LIMIT if limit is None else limit) + _SPARE_WINDOW
        self.h2 = h2protocol.ServerConnection(
            self,
            max_header_list=conn.listener.max_line,
            connection_window=min(window, 2**31 - 1),
            limits=front.limits,
            clock=front.now,
        )
        self.streams: dict[int, _Stream] = {}
        self.in_flight = 0
        self._inline: list[_Stream] = []
        self._closing = False
        self._deadline: float | None = None
        self._deadline_reason = ""

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or any(s.pending for s in self.streams.values())

    @property
    def pending_bytes(self) -> int:
        return sum(len(s.pending) for s in self.streams.values())

    def start(self) -> None:
        self.h2.initiate()
        self._flush()
        self._expect(self.conn.front.limits.header_timeout, CloseReason.HEADER_TIMEOUT)

    # Reading.

    def received(self, data: bytes) -> None:
        if self.conn.closed:
            return
        try:
            self.h2.receive(data)
        except h2protocol.ConnectionFailed as exc:
            self._flush()  # the GOAWAY
            if exc.code == h2protocol.ENHANCE_YOUR_CALM:
                reason = (
                    CloseReason.RESET_FLOOD if "reset" in str(exc) else CloseReason.CONTROL_FLOOD
                )
            else:
                reason = CloseReason.MALFORMED
            self.conn.close(reason, f"HTTP/2: {exc}")
            return
        self._flush()
        inline, self._inline = self._inline, []
        for stream in inline:
            self._answer_inline(stream)
        if self.h2.ended and not self._closing:
            self._closing = True  # the client sends no more: answer what it sent, then close
        self._maybe_idle()

    # The protocol's calls (h2protocol.Listener).

    def request(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        stream = _Stream(stream_id, headers, self.conn.front.now(), ended=end_stream)
        for name, value in headers:
            if name == b":method":
                stream.method = value.decode("latin-1")
            elif name == b":path":
                stream.path = value.decode("latin-1")
            elif name == b"content-length":
                stream.declared = int(value)  # digits: the protocol checked it
        self.streams[stream_id] = stream
        self._deadline = None
        self.conn.front.progressed(self.conn)
        limit = self.conn.listener.app.body_limit
        if end_stream or (
            limit is not None and stream.declared is not None and stream.declared > limit
        ):
            self._dispatch(stream)  # over the limit: the app refuses it unread

    def data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.dispatched:
            self.h2.release(len(data))
            if stream is not None and end_stream:
                stream.ended = True
            return
        if end_stream:
            stream.ended = True
        if data:
            stream.body.append(data)
            stream.size += len(data)
            self.conn.front.hold(self.conn, len(data))
            if self.conn.closed:
                return
        limit = self.conn.listener.app.body_limit
        if end_stream or (limit is not None and stream.size > limit):
            self._dispatch(stream)

    def reset(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        stream.reset = True
        stream.pending = b""
        if not stream.dispatched:
            self._release(stream)

    def window_opened(self, stream_id: int) -> None:
        if stream_id == 0:
            targets = [s for s in self.streams.values() if s.pending]
        else:
            one = self.streams.get(stream_id)
            targets = [] if one is None or not one.pending else [one]
        for stream in targets:
            self._push(stream)

    # Answering.

    def _dispatch(self, stream: _Stream) -> None:
        stream.dispatched = True
        self.in_flight += 1
        front = self.conn.front
        if stream.ended and stream.method == "POST" and stream.path in front.inline:
            self._inline.append(stream)
            return
        request = self._request(stream)
        app = self.conn.listener.app

        conn = self.conn

        def job() -> answering.Answer | None:
            if stream.reset or conn.closed:
                return None  # reset, or the connection gone, while it waited: not run
            return answering.answer(app, request)

        future = front.pool.submit(job)
        loop = front.loop

        def done(finished: Future[answering.Answer | None]) -> None:
            # A loop closed by then (the worker stopped): nobody to answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._answered_future, stream, finished)

        future.add_done_callback(done)

    def _request(self, stream: _Stream) -> answering.Request:
        headers = []
        for name, value in stream.headers:
            if name == b":authority":
                headers.append((b"host", value))
            elif not name.startswith(b":"):
                headers.append((name, value))
        peer = self.conn.peer
        return answering.Request(
            method=stream.method,
            target=stream.path,
            headers=headers,
            body=b"".join(stream.body),
            protocol="HTTP/2",
            client=peer if isinstance(peer, tuple) else None,
            declared=stream.declared,
        )

    def _answer_inline(self, stream: _Stream) -> None:
        if stream.reset or self.conn.closed:
            self._answered(stream, None)
            return
        self._answered(stream, answering.answer(self.conn.listener.app, self._request(stream)))

    def _answered_future(self, stream: _Stream, finished: Future[answering.Answer | None]) -> None:
        self._answered(stream, finished.result())

    def _answered(self, stream: _Stream, result: answering.Answer | None) -> None:
        self.in_flight -= 1
        self._release(stream)
        if result is None:
            self.conn.front.stats.reset_skipped += 1
        if self.conn.closed:
            return
        if result is not None and not stream.reset:
            self._send(stream, result)
        self._maybe_idle()

    def _send(self, stream: _Stream, result: answering.Answer) -> None:
        status, headers, body = result
        head = [(b":status", status[:3].encode("ascii")), *answering.strip_hop_by_hop(headers)]
        if not body:
            self.h2.send_headers(stream.stream_id, head, end_stream=True)
            self.streams.pop(stream.stream_id, None)
        else:
            self.h2.send_headers(stream.stream_id, head, end_stream=False)
            stream.pending = body
            stream.pending_since = self.conn.front.now()
            self._push(stream)
        self._flush()

    def _push(self, stream: _Stream) -> None:
        """Sends what the peer's window allows of the stream's answer, its end with it."""
        while stream.pending:
            window = min(self.h2.window(stream.stream_id), self.h2.max_outbound_frame_size)
            if window <= 0:
                return
            chunk, stream.pending = stream.pending[:window], stream.pending[window:]
            self.h2.send_data(stream.stream_id, chunk, end_stream=not stream.pending)
        self.streams.pop(stream.stream_id, None)
        self._flush()
        self._maybe_idle()

    def _release(self, stream: _Stream) -> None:
        if stream.size:
            self.h2.release(stream.size)
            self.conn.front.unhold(self.conn, stream.size)
            stream.size = 0
            stream.body = []
            self._flush()

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.conn.send(data)

    # Deadlines and the end.

    def _expect(self, seconds: float, reason: str) -> None:
        self._deadline = self.conn.front.now() + seconds
        self._deadline_reason = reason

    def _maybe_idle(self) -> None:
        if self.streams or self.in_flight or self.conn.closed:
            return
        if self._closing:
            self._flush()
            self.conn.close(CloseReason.SHUTDOWN if self.conn.front.stopping else CloseReason.DONE)
        elif self._deadline is None:
            self._expect(self.conn.front.limits.idle_timeout, CloseReason.IDLE_TIMEOUT)

    def check(self, now: float) -> None:
        limits = self.conn.front.limits
        started = self.h2.block_started
        if started is not None and now - started >= limits.header_timeout:
            self._goaway_and_close(CloseReason.HEADER_TIMEOUT)
            return
        if self._deadline is not None and now >= self._deadline:
            self._goaway_and_close(self._deadline_reason)
            return
        for stream in list(self.streams.values()):
            late_body = not stream.dispatched and now - stream.opened >= limits.body_timeout
            late_read = bool(stream.pending) and now - stream.pending_since >= limits.write_timeout
            if late_body or late_read:
                self.h2.reset_stream(stream.stream_id, h2protocol.CANCEL)
        self._flush()
        self._maybe_idle()

    def _goaway_and_close(self, reason: str) -> None:
        self.h2.goaway()
        self._flush()
        self.conn.close(reason)

    def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.h2.goaway()
        self._flush()
        self._maybe_idle()
