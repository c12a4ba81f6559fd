"""HTTP/2 on a TLS connection that chose it through ALPN: every call of kube-scheduler's
extender client on one connection.

Go's HTTP client keeps two idle HTTP/1.1 connections per host; with binds in flight next
to filters, kube-scheduler opens further ones and drops them, a new mutual-TLS handshake
for about every third pod. Over HTTP/2 it multiplexes every call on a single connection.

One thread (the worker's, which took the connection) reads the connection for its life
and runs the protocol (`gas.serving.h2protocol`), so each open HTTP/2 connection holds one of the
worker's threads (kube-scheduler opens one; an idle one is closed after the keep-alive
time). A POST the app takes as `routes.DIRECT_POST` is answered there, as over HTTP/1.1:
in the reader's thread for the paths that wait on nothing (`Settings.inline`), else on a
pool, so a bind waiting on the API server does not hold up a filter; every other request
goes through the app's WSGI side, with an environ built here, on the pool. Every use of
the TLS socket and of the protocol's state is under one lock per connection (OpenSSL's
connection object is not for two threads at once); a reply larger than the peer's
flow-control window is sent on as the peer opens it.

Limits: MAX_STREAMS concurrent streams (a client going past it loses the connection, as
the protocol lets the server decide); a body over the app's limit is answered 413 (by the
app, as over HTTP/1.1) as soon as it is known, and the rest of it dropped; header lists
over the worker's header limit end the connection. An idle connection is closed after the
keep-alive time, and on shutdown GOAWAY tells the client which streams were taken; those
are answered before the connection closes.
"""

from __future__ import annotations

import io
import logging
import select
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_to_bytes

from gunicorn import http as gunicorn_http  # type: ignore[import-untyped]
from gunicorn import sock as gunicorn_sock

from gas.serving import direct, h2protocol

__all__ = [
    "MAX_STREAMS",
    "Settings",
    "init_connection",
    "serve_connection",
    "serve_worker_connection",
]

log = logging.getLogger(__name__)

MAX_STREAMS = 64
"""Streams a client may have open at once: kube-scheduler has one call per pod in its
cycle and a bind per pod in flight, far fewer."""
_WINDOW = 1 << 20
"""The flow-control window granted to the client: a request body is not held up waiting
for window updates."""
_POLL = 0.5
"""How often a quiet connection checks whether the worker stops or the connection idled."""
_WRITE_TIMEOUT = 30.0
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
)

Answer = tuple[str, list[tuple[str, str]], bytes]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True)
class Settings:
    """What a connection is served with: the app (`wsgi`), its direct POSTs (None: none),
    the app's body limit (None: none), the header list limit, the pool streams are
    answered on, the keep-alive time, and whether the worker still serves."""

    wsgi: WSGIApp
    direct_post: direct.DirectPost | None
    body_limit: int | None
    header_limit: int
    pool: Executor
    keepalive: float
    alive: Callable[[], bool]
    server: tuple[str, int]
    inline: frozenset[str] = frozenset()
    """The direct POSTs' paths answered in the reader's thread: those that wait on nothing
    (no I/O), for which a hand-off to the pool costs more than the answer."""


@dataclass
class _Stream:
    stream_id: int
    headers: list[tuple[bytes, bytes]]
    method: str = ""
    path: str = ""
    body: io.BytesIO = field(default_factory=io.BytesIO)
    declared: int | None = None
    dispatched: bool = False
    ended: bool = False
    """The client sent the whole request."""
    reset: bool = False
    pending: bytes = b""
    """Reply bytes waiting for the peer's flow-control window."""


class _Connection:
    def __init__(self, sock: ssl.SSLSocket, client: Any, settings: Settings) -> None:
        self.sock = sock
        self.client = client
        self.settings = settings
        self.lock = threading.Lock()
        self.h2 = h2protocol.ServerConnection(
            self,
            max_streams=MAX_STREAMS,
            window=_WINDOW,
            max_header_list=settings.header_limit,
        )
        self.streams: dict[int, _Stream] = {}
        self.in_flight = 0
        self.closing = False
        self.inline: list[_Stream] = []

    # All under self.lock.

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.settimeout(_WRITE_TIMEOUT)
            try:
                self.sock.sendall(data)
            finally:
                self.sock.setblocking(False)

    def _push(self, stream: _Stream) -> None:
        """Sends what the window allows of the stream's waiting reply, the end with it."""
        while stream.pending:
            window = min(self.h2.window(stream.stream_id), self.h2.max_outbound_frame_size)
            if window <= 0:
                return
            chunk, stream.pending = stream.pending[:window], stream.pending[window:]
            self.h2.send_data(stream.stream_id, chunk, end_stream=not stream.pending)
        self.streams.pop(stream.stream_id, None)

    # The protocol's calls (h2protocol.Listener), made while it reads, under the lock.

    def request(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        stream = _Stream(stream_id, headers, ended=end_stream)
        for name, value in headers:
            if name == b":method":
                stream.method = value.decode("latin-1")
            elif name == b":path":
                stream.path = value.decode("latin-1")
            elif name == b"content-length":
                stream.declared = int(value)  # digits: the protocol checked it
        self.streams[stream_id] = stream
        limit = self.settings.body_limit
        if end_stream or (
            limit is not None and stream.declared is not None and stream.declared > limit
        ):
            self._dispatch(stream)  # over the limit: the app refuses it unread, as over HTTP/1.1

    def data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if end_stream:
            stream.ended = True
        if stream.dispatched:
            return
        stream.body.write(data)
        limit = self.settings.body_limit
        if end_stream or (limit is not None and stream.body.tell() > limit):
            self._dispatch(stream)

    def reset(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            stream.reset = True

    def window_opened(self, stream_id: int) -> None:
        if stream_id == 0:
            targets = list(self.streams.values())
        else:
            one = self.streams.get(stream_id)
            targets = [] if one is None else [one]
        for stream in targets:
            if stream.pending:
                self._push(stream)

    # The reader.

    def serve(self) -> None:
        with self.lock:
            self.h2.initiate()
            self._flush()
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        quiet_since = time.monotonic()
        while True:
            if not self.sock.pending() and not poller.poll(_POLL * 1000):
                if self._should_close(quiet_since):
                    return
                continue
            with self.lock:
                try:
                    data = self.sock.recv(65536)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    continue
                if not data:
                    return
                quiet_since = time.monotonic()
                try:
                    self.h2.receive(data)
                except h2protocol.ConnectionFailed as exc:
                    log.info("HTTP/2 protocol error from %s: %s", self.client, exc)
                    self._flush()  # the GOAWAY
                    return
                self._flush()
                inline, self.inline = self.inline, []
            for stream in inline:
                self._answer(stream)
            if self.h2.ended:
                return

    def _should_close(self, quiet_since: float) -> bool:
        """Whether to end the quiet connection: the worker stops, or it idled out."""
        stopping = not self.settings.alive()
        idle = time.monotonic() - quiet_since > self.settings.keepalive
        with self.lock:
            if not (stopping or (idle and self.in_flight == 0)):
                return False
            if not self.closing:
                self.closing = True
                # The streams taken are still answered; new ones are refused.
                self.h2.goaway()
                self._flush()
            return self.in_flight == 0

    def _dispatch(self, stream: _Stream) -> None:
        stream.dispatched = True
        self.in_flight += 1
        if (
            stream.ended
            and self.settings.direct_post is not None
            and stream.method == "POST"
            and stream.path in self.settings.inline
        ):
            self.inline.append(stream)
        else:
            self.settings.pool.submit(self._answer, stream)

    # The pool's threads.

    def _answer(self, stream: _Stream) -> None:
        try:
            try:
                status, headers, body = self._reply(stream)
            except Exception:
                log.exception("HTTP/2 request on stream %d failed", stream.stream_id)
                status, headers, body = "500 INTERNAL SERVER ERROR", [], b""
            self._send(stream, status, headers, body)
        except OSError as exc:
            # The peer reset the stream or the connection is gone: nothing to answer.
            log.debug("HTTP/2 stream %d not answered: %s", stream.stream_id, exc)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _send(
        self, stream: _Stream, status: str, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        head = [(b":status", status[:3].encode("ascii"))]
        for name, value in headers:
            key = name.lower()
            if key not in _HOP_BY_HOP:
                head.append((key.encode("latin-1"), value.strip().encode("latin-1")))
        with self.lock:
            if stream.reset:
                return
            if not body:
                self.h2.send_headers(stream.stream_id, head, end_stream=True)
                self.streams.pop(stream.stream_id, None)
            else:
                self.h2.send_headers(stream.stream_id, head, end_stream=False)
                stream.pending = body
                self._push(stream)
            self._flush()

    def _reply(self, stream: _Stream) -> Answer:
        method, path = stream.method, stream.path
        body = stream.body.getvalue()
        limit = self.settings.body_limit
        whole = limit is None or (len(body) <= limit and (stream.declared or 0) <= limit)
        post = self.settings.direct_post
        if post is not None and method == "POST" and whole:
            answer = post(path, body)
            if answer is not None:
                return answer
        return self._wsgi(stream, method, path, body)

    def _wsgi(self, stream: _Stream, method: str, path: str, body: bytes) -> Answer:
        raw_path, _, query = path.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote_to_bytes(raw_path).decode("latin-1"),
            "QUERY_STRING": query,
            "RAW_URI": path,
            "SERVER_NAME": self.settings.server[0],
            "SERVER_PORT": str(self.settings.server[1]),
            "SERVER_PROTOCOL": "HTTP/2",
            "REMOTE_ADDR": str(self.client[0]) if isinstance(self.client, tuple) else "",
            "REMOTE_PORT": str(self.client[1]) if isinstance(self.client, tuple) else "",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https",
            "wsgi.input": io.BytesIO(body),
            "wsgi.input_terminated": True,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        length = stream.declared if stream.declared is not None else len(body)
        environ["CONTENT_LENGTH"] = str(length)
        for name, value in stream.headers:
            if name.startswith(b":"):
                if name == b":authority":
                    environ["HTTP_HOST"] = value.decode("latin-1")
                continue
            text = value.decode("latin-1")
            if name == b"content-type":
                environ["CONTENT_TYPE"] = text
            elif name != b"content-length":
                key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
                joiner = "; " if name == b"cookie" else ","
                environ[key] = f"{environ[key]}{joiner}{text}" if key in environ else text
        started: list[Any] = []

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            started[:] = [status, headers]
            return lambda data: None

        chunks = self.settings.wsgi(environ, start_response)
        try:
            data = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        status, headers = started
        if method == "HEAD":
            data = b""
        return status, list(headers), data


def serve_connection(sock: ssl.SSLSocket, client: Any, settings: Settings) -> None:
    """Serves the HTTP/2 connection `sock` (its TLS handshake done, h2 chosen) until it
    ends, the client is quiet past the keep-alive time, or the worker stops; returns
    with every taken stream answered, the socket left for the caller to close."""
    sock.setblocking(False)
    connection = _Connection(sock, client, settings)
    try:
        connection.serve()
    except (OSError, ssl.SSLError) as exc:
        log.debug("HTTP/2 connection from %s ended: %s", client, exc)
    except Exception:
        # Never handed back to gunicorn, which would answer it in HTTP/1.1.
        log.exception("HTTP/2 connection from %s failed; closing it", client)
    finally:
        # Streams still being answered write to a closed socket and stop there.
        deadline = time.monotonic() + _WRITE_TIMEOUT
        while connection.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)


def init_connection(conn: Any, cfg: Any) -> None:
    """gthread's `conn.init()` (gunicorn's connection `conn`, its configuration `cfg`),
    except that a TLS connection that chose h2 is marked `is_http2` without a parser, for
    `serve_worker_connection`, rather than given to gunicorn's HTTP/2, which answers a
    connection's streams one after another."""
    if not cfg.is_ssl:
        conn.init()
        return
    conn.initialized = True
    # The TLS handshake, bounded by the context's handshake timeout.
    conn.sock = gunicorn_sock.ssl_wrap_socket(conn.sock, cfg)
    if conn.sock.selected_alpn_protocol() == "h2":
        conn.is_http2 = True
        return
    conn.parser = gunicorn_http.get_parser(cfg, conn.sock, conn.client)


def serve_worker_connection(
    worker: Any, conn: Any, pool: Executor, inline: frozenset[str] = frozenset()
) -> None:
    """`serve_connection` for gas's gunicorn worker `worker` (`gas.serving.server`) and its
    connection `conn`, with the worker's app, direct POSTs and limits; `inline` as in
    `Settings`."""
    config = getattr(worker.wsgi, "config", {})
    address = conn.server if isinstance(conn.server, tuple) else ("", 0)
    settings = Settings(
        wsgi=worker.wsgi,
        direct_post=worker._direct,
        body_limit=config.get("MAX_CONTENT_LENGTH"),
        header_limit=worker.cfg.limit_request_field_size or 8190,
        pool=pool,
        keepalive=worker.cfg.keepalive or 75,
        alive=lambda: bool(worker.alive),
        server=(str(address[0]), int(address[1])),
        inline=inline,
    )
    serve_connection(conn.sock, conn.client, settings)
