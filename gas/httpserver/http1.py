"""HTTP/1.1 on a serving-loop connection, parsed by llhttp (`httptools`).

One request at a time: while one is answered the connection is not read, so a client
that pipelines gets its answers in order and holds at most one read of requests. Its
deadlines (`gas.httpserver.limits.Limits`): the head within `header_timeout` (of the
handshake for the first request, of its first byte for the next), the body within
`body_timeout` of the head, the next request's first byte within `idle_timeout` of the
last answer.

A body over the app's limit is answered by the app (413) as soon as its length is known;
the rest of it is then read and dropped, so a client still writing it sees the answer,
for up to UNREAD_BODY_SECONDS and twice the limit (at least UNREAD_BODY_MIN_BYTES); past
either bound the connection is closed.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

import httptools

from gas.httpserver import answering, direct
from gas.httpserver.stats import CloseReason

if TYPE_CHECKING:
    from gas.httpserver.connection import Connection

__all__ = ["MAX_FIELDS", "UNREAD_BODY_MIN_BYTES", "UNREAD_BODY_SECONDS", "Http1Session"]

log = logging.getLogger(__name__)

UNREAD_BODY_SECONDS = 10.0
UNREAD_BODY_MIN_BYTES = 1024 * 1024
MAX_FIELDS = 100
"""Header fields in one request (gunicorn's default)."""
MAX_LINE = 8190
"""The request line's and each field line's bytes (gunicorn's default), unless the
listener is given its own."""
_HEAD_BYTES = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_FRAMED_HERE = answering.HOP_BY_HOP | {"content-length"}
"""The app's fields this side writes itself."""


class _Refused(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Http1Session:
    def __init__(self, conn: Connection, max_line: int = MAX_LINE) -> None:
        self.conn = conn
        self._max_line = max_line
        self._parser = httptools.HttpRequestParser(self)
        self._ready: deque[tuple[answering.Request, bool]] = deque()
        self._answering = False
        self._closing = False
        # The request being read.
        self._reading = False
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._declared: int | None = None
        self._dispatched = False
        self._drain_left = 0
        self._head_done = False
        self._begun_here = False

    @property
    def busy(self) -> bool:
        """A request is being answered (reading one is not: a connection that trickles a
        request is as idle as a quiet one)."""
        return self._answering or bool(self._ready)

    pending_bytes = 0

    def start(self) -> None:
        self.conn.expect(self.conn.front.limits.header_timeout, CloseReason.HEADER_TIMEOUT)

    # Reading.

    def received(self, data: bytes) -> None:
        if self._closing:
            return
        self._begun_here = False
        try:
            self._parser.feed_data(data)
        except _Refused as exc:
            self._refuse(exc.status, str(exc))
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refused):
                self._refuse(cause.status, str(cause))
            else:
                log.exception("HTTP/1.1 request from %s could not be read", self.conn.peer)
                self._refuse("400 Bad Request", "the request could not be read")
            return
        except httptools.HttpParserUpgrade:
            self._refuse("400 Bad Request", "protocol upgrades are not served")
            return
        except httptools.HttpParserError as exc:
            self._refuse("400 Bad Request", f"malformed request: {exc}")
            return
        if self._reading and not self._head_done and not self._begun_here:
            # A head over several reads: llhttp keeps its partial field, so its size is
            # bounded by counting the reads (one read, in which it began, is bounded by
            # the read size).
            self._head_bytes += len(data)
        if not self._head_done and self._reading and self._head_bytes > _HEAD_BYTES:
            self._refuse("431 Request Header Fields Too Large", "the request head is too large")
            return
        self._next()

    # llhttp's calls.

    def on_message_begin(self) -> None:
        self._begun_here = True
        self._reading = True
        self._url = b""
        self._fields = []
        self._body = []
        self._body_size = 0
        self._declared = None
        self._dispatched = False
        self._head_done = False
        self._head_bytes = 0
        if self.conn.deadline_reason == CloseReason.IDLE_TIMEOUT:
            # The next request: its head is timed from its first byte. The first
            # request's is timed from the connection's start.
            self.conn.expect(self.conn.front.limits.header_timeout, CloseReason.HEADER_TIMEOUT)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._max_line:
            raise _Refused("414 URI Too Long", "the request line is too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 4 > self._max_line:
            raise _Refused("431 Request Header Fields Too Large", "a header field is too long")
        self._fields.append((name.lower(), value))
        if len(self._fields) > MAX_FIELDS:
            raise _Refused("431 Request Header Fields Too Large", "too many header fields")

    def on_headers_complete(self) -> None:
        self._head_done = True
        self.conn.front.progressed(self.conn)
        limits = self.conn.front.limits
        limit = self.conn.listener.app.body_limit
        for name, value in self._fields:
            if name == b"content-length":
                self._declared = int(value)  # llhttp checked it
        expects_continue = any(
            name == b"expect" and value.lower() == b"100-continue" for name, value in self._fields
        )
        if limit is not None and self._declared is not None and self._declared > limit:
            # Answered unread: the app refuses it. A client that waits for 100 Continue
            # sends no body: the connection ends with the answer, or its next request would
            # be read as this one's body.
            self._dispatch(keep_alive=True)
            self._drain_left = max(2 * limit, UNREAD_BODY_MIN_BYTES)
            if self._declared > self._drain_left or expects_continue:
                self._closing_after_answer = True
            self.conn.expect(UNREAD_BODY_SECONDS, CloseReason.BODY_TIMEOUT)
            return
        if expects_continue:
            if self.busy:
                self._continue_pending = True  # after the answers before it, in order
            else:
                self.conn.send(_CONTINUE)
        self.conn.expect(limits.body_timeout, CloseReason.BODY_TIMEOUT)

    def on_body(self, body: bytes) -> None:
        if self._dispatched:
            self._drain_left -= len(body)
            if self._drain_left < 0:
                if self._answering or self._ready:
                    self._closing_after_answer = True
                    return
                raise _Refused("", "an unread body past what is drained")
            return
        self._body.append(body)
        self._body_size += len(body)
        self.conn.front.hold(self.conn, len(body))
        limit = self.conn.listener.app.body_limit
        if limit is not None and self._body_size > limit:
            self._dispatch(keep_alive=True)
            self._drain_left = max(2 * limit, UNREAD_BODY_MIN_BYTES)

    def on_message_complete(self) -> None:
        self._reading = False
        if not self._dispatched:
            self._dispatch(keep_alive=True)
        elif not self.busy:
            # The rest of a body answered unread: the connection goes on.
            self.conn.expect(self.conn.front.limits.idle_timeout, CloseReason.IDLE_TIMEOUT)

    _closing_after_answer = False
    _continue_pending = False

    def _dispatch(self, keep_alive: bool) -> None:
        self._dispatched = True
        version = self._parser.get_http_version()
        request = answering.Request(
            method=self._parser.get_method().decode("latin-1"),
            target=self._url.decode("latin-1"),
            headers=self._fields,
            body=b"".join(self._body),
            protocol=f"HTTP/{version}",
            client=self.conn.peer if isinstance(self.conn.peer, tuple) else None,
            declared=self._declared,
        )
        self._body = []
        keep = keep_alive and self._parser.should_keep_alive()
        self._ready.append((request, keep))
        # Its head is held too until it is answered: pipelined heads waiting their turn
        # are bounded with the bodies (Front.hold), not by their count.
        self.conn.front.hold(self.conn, _head_size(request))

    # Answering.

    def _next(self) -> None:
        """Answers the requests read, in order, while none is being answered: those
        answered on the loop one after another (a loop, not a recursion: a read may hold
        hundreds of pipelined requests), until one goes to the pool."""
        while not self._answering and self._ready and not self.conn.closed:
            request, keep = self._ready.popleft()
            self._answering = True
            self.conn.pause("answer")
            self.conn.expect(None)
            front = self.conn.front
            app = self.conn.listener.app
            if request.method == "POST" and request.target in front.inline:
                self._answered(request, keep, answering.answer(app, request), inline=True)
                continue
            self._submit(request, keep)
            return

    def _submit(self, request: answering.Request, keep: bool) -> None:
        """Answers `request` on the pool; the answer comes back on the loop."""
        front = self.conn.front
        future = front.pool.submit(answering.answer, self.conn.listener.app, request)
        loop = front.loop

        def done(_: object) -> None:
            # A loop closed by then (the worker stopped): nobody to answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._answered_future, request, keep, future)

        future.add_done_callback(done)

    def _answered_future(self, request: answering.Request, keep: bool, future: object) -> None:
        result = future.result()  # type: ignore[attr-defined]
        self._answered(request, keep, result)

    def _answered(
        self,
        request: answering.Request,
        keep: bool,
        result: answering.Answer,
        inline: bool = False,
    ) -> None:
        """Writes the answer; then the next request's turn (`inline`: `_next`, which
        called this, goes on itself)."""
        conn = self.conn
        self._answering = False
        conn.front.unhold(conn, len(request.body) + _head_size(request))
        if conn.closed:
            return
        status, headers, body = result
        keep = keep and not self._closing_after_answer and not conn.front.stopping
        keep = keep and not any(
            name.lower() == "connection" and value.lower() == "close" for name, value in headers
        )
        fields = [(name, value) for name, value in headers if name.lower() not in _FRAMED_HERE]
        if request.method != "HEAD" or body:
            fields.append(("Content-Length", str(len(body))))
        conn.send(direct.frame(status, fields, body, keep_alive=keep))
        if not keep:
            self._closing = True
            conn.close(CloseReason.DONE)
            return
        conn.resume("answer")
        if self._ready:
            if not inline:
                self._next()
            return
        if self._continue_pending and self._reading:
            self._continue_pending = False
            conn.send(_CONTINUE)
        if self._reading:
            # The body of a refused request still arriving, or the next request begun.
            if self._dispatched:
                conn.expect(UNREAD_BODY_SECONDS, CloseReason.BODY_TIMEOUT)
            else:
                conn.expect(conn.front.limits.header_timeout, CloseReason.HEADER_TIMEOUT)
            return
        conn.expect(conn.front.limits.idle_timeout, CloseReason.IDLE_TIMEOUT)

    def _refuse(self, status: str, reason: str) -> None:
        """Answers a request that cannot be read (status "" : none) and closes."""
        self._closing = True
        if status and not self._answering:
            body = f'{{"Error":"{reason}"}}'.encode()
            fields = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            self.conn.send(direct.frame(status, fields, body, keep_alive=False))
        log.debug("HTTP/1.1 request from %s refused: %s", self.conn.peer, reason)
        self.conn.close(CloseReason.MALFORMED if status else CloseReason.BODY_LIMIT, reason)

    def check(self, now: float) -> None:
        return

    def shutdown(self) -> None:
        if not self.busy:
            self._closing = True
            self.conn.close(CloseReason.SHUTDOWN)


def _head_size(request: answering.Request) -> int:
    return len(request.target) + sum(len(name) + len(value) for name, value in request.headers)
