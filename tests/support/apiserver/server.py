"""The HTTP layer: the server thread's socket server and the request handler, watches included."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import socketserver
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.apiserver.errors import (
    ApiError,
    JSONDict,
    bad_request,
    method_not_allowed,
    route_not_found,
)
from tests.support.apiserver.faults import HOLD_SECONDS, fault_error
from tests.support.apiserver.routes import Response, Route, dispatch, match_route
from tests.support.apiserver.selectors import Selector
from tests.support.apiserver.store import Watcher

if TYPE_CHECKING:
    from tests.support.apiserver.double import ApiServerDouble

_POLL_SECONDS: Final = 0.25


def _parse_bool(value: str | None) -> bool:
    """Go's strconv.ParseBool truthy spellings (anything else is false)."""
    return value in {"1", "t", "T", "true", "TRUE", "True"}


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.double: ApiServerDouble | None = None
        self._conn_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn(), which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name = "127.0.0.1"
        self.server_port = int(self.server_address[1])

    def track(self, conn: socket.socket) -> None:
        with self._conn_lock:
            self._connections.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._conn_lock:
            self._connections.discard(conn)

    def close_all_connections(self) -> None:
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Dropped/reset connections are expected in tests; keep stderr quiet.
        return


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "apiserver-double/1.0"
    sys_version = ""

    @property
    def _srv(self) -> HttpServer:
        return cast(HttpServer, self.server)

    @property
    def _double(self) -> ApiServerDouble:
        double = self._srv.double
        assert double is not None
        return double

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        # As the real API server's (Go sets it on every TCP connection): without it, a
        # reply's body waits behind its headers for the client's delayed ACK, 40 ms on
        # every request of a kept-alive connection.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._srv.track(self.connection)

    def finish(self) -> None:
        self._srv.untrack(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_OPTIONS(self) -> None:
        self._handle()

    # -- request handling --------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _handle(self) -> None:
        double = self._double
        method = self.command
        split = urlsplit(self.path)
        path = split.path
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        double.record_request(method, path, self.path)
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            self._send(bad_request("malformed request body"))
            return
        # Routed on the decoded path, as the API server routes (a client escapes the `:` of
        # a proxy's `pod:port`).
        route = match_route(unquote(path))
        is_watch = (
            route is not None
            and route.target == "collection"
            and method == "GET"
            and _parse_bool(query.get("watch"))
        )
        denial = double.authorize(route, method, query, is_watch) if route is not None else None
        if denial is not None:
            self._send(denial)
            return
        rule = double.faults.take(method, path, is_watch, split.query)
        action = rule.action if rule is not None else ""
        if rule is not None and action == "close":
            self._abort()
            return
        if rule is not None and action == "status":
            self._send(fault_error(int(rule.arg or 500)))
            return
        if rule is not None and action == "delay":
            time.sleep(float(rule.arg or 0))
        if rule is not None and action == "hold":
            rule.released.wait(HOLD_SECONDS if rule.arg is None else float(rule.arg))
        response: Response | ApiError
        try:
            if route is None:
                raise route_not_found()
            if method not in route.methods:
                raise method_not_allowed()
            if is_watch:
                self._serve_watch(route, query, drop_after_first=action == "drop_watch")
                return
            response = dispatch(
                double.store,
                double.lease_cut_off,
                route,
                method,
                query,
                body,
                self.headers.get("Content-Type") or "",
            )
        except ApiError as exc:
            response = exc
        except Exception as exc:  # a bug in the double: surface it to the client
            response = ApiError(500, "InternalError", f"Internal error occurred: {exc!r}", {})
        if rule is not None and action == "after_write_status":
            response = fault_error(int(rule.arg or 500))
        if rule is not None and action == "after_write_delay":
            time.sleep(float(rule.arg or 0))
        self._send(response)

    def _send(self, response: Response | ApiError) -> None:
        if isinstance(response, ApiError):
            code, body, headers = response.code, response.status(), response.headers
        else:
            code, body, headers = response.code, response.body, response.headers
        payload = (json.dumps(body, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-cache, private")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True

    def _abort(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # -- watch streaming ---------------------------------------------------------------

    def _write_chunk(self, data: bytes) -> bool:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n")
            return True
        except OSError:
            return False

    def _emit(self, event: JSONDict) -> bool:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        return self._write_chunk(line.encode("utf-8"))

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):
            return True

    def _serve_watch(
        self, route: Route, query: Mapping[str, str], *, drop_after_first: bool
    ) -> None:
        double = self._double
        kind = route.kind
        assert kind is not None
        selector = Selector.parse(kind, route.namespace, query)
        raw_timeout = query.get("timeoutSeconds", "")
        try:
            timeout = float(int(raw_timeout)) if raw_timeout else None
        except ValueError:
            raise bad_request(f"invalid timeoutSeconds: {raw_timeout!r}") from None
        resource_version = query.get("resourceVersion", "")
        if resource_version and not resource_version.isdigit():
            raise bad_request(f"invalid resource version: {resource_version}")
        bookmarks = _parse_bool(query.get("allowWatchBookmarks"))
        send_initial = _parse_bool(query.get("sendInitialEvents"))
        watcher, first, error = double.store.open_watch(
            kind, selector, resource_version, send_initial
        )
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-cache, private")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(
                double, watcher, first, error, timeout, bookmarks, send_initial, drop_after_first
            )
        except Exception:
            # Headers are out: the only honest way to report a failure is to cut the stream.
            self._abort()
        finally:
            double.store.close_watch(watcher)

    def _stream(
        self,
        double: ApiServerDouble,
        watcher: Watcher | None,
        first: list[JSONDict],
        error: JSONDict | None,
        timeout: float | None,
        bookmarks: bool,
        send_initial: bool,
        drop_after_first: bool,
    ) -> None:
        if error is not None or watcher is None:
            if error is not None:
                self._emit(error)
            self._write_chunk(b"")
            return
        deadline = time.monotonic() + timeout if timeout is not None else None

        def send_all(events: Iterable[JSONDict]) -> bool:
            for event in events:
                if not self._emit(event):
                    return False
                if drop_after_first:
                    self._abort()
                    return False
            return True

        if not send_all(first):
            self.close_connection = True
            return
        if send_initial and bookmarks:
            end = watcher.bookmark({"k8s.io/initial-events-end": "true"})
            if not self._emit(end):
                self.close_connection = True
                return
        last_write = time.monotonic()
        while True:
            now = time.monotonic()
            wait = _POLL_SECONDS
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            if bookmarks:
                wait = min(wait, max(0.0, last_write + double.bookmark_interval - now))
            stored, stopping = double.store.next_events(watcher, wait)
            if stopping:
                self.close_connection = True
                return
            converted = [e for e in (watcher.convert(s) for s in stored) if e is not None]
            if converted:
                if not send_all(converted):
                    self.close_connection = True
                    return
                last_write = time.monotonic()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if bookmarks and not self._emit(watcher.bookmark()):
                    self.close_connection = True
                    return
                # Deregister before the final chunk: once a client sees the end of the
                # stream, the watcher is gone (open_watch_count is then exact).
                double.store.close_watch(watcher)
                self._write_chunk(b"")
                return
            if bookmarks and now - last_write >= double.bookmark_interval:
                if not self._emit(watcher.bookmark()):
                    self.close_connection = True
                    return
                last_write = now
            if not converted and self._client_gone():
                self.close_connection = True
                return
