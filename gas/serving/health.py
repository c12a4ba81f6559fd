"""The health port (`gas serve --healthPort`): plain HTTP, `GET /healthz` and `GET /readyz`
only, for kubelet's probes.

With `--cacert` the main port demands a client certificate in the TLS handshake, and
kubelet's HTTPS probes present none, so a probe of the main port can never succeed. The
health port answers the two probe routes through the same app as the main port (the same
status and body); every other path is 404, so nothing but health leaves gas unencrypted
and unauthenticated. The socket is bound by `gas serve` before gunicorn forks, so a port
in use fails at start; the worker serves it on a thread.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from gas.serving import routes, wire

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

PATHS = frozenset({routes.HEALTHZ, routes.READYZ})
_NOT_FOUND = wire.encode(
    wire.error_result("404 Not Found: the health port serves GET /healthz and /readyz only")
)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host` ("0.0.0.0", "::", "[::]", an address or a name) and
    `port`. Raises OSError (port in use, no such address) and ValueError (bad port)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"the health port must be between 1 and 65535, got {port}")
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def only_health(app: WSGIApplication) -> WSGIApplication:
    """`app` for the two probe paths (whatever the method: the main port's answer, 405
    included); 404 for every other path."""

    def health(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") in PATHS:
            return app(environ, start_response)
        start_response(
            "404 Not Found",
            [("Content-Type", "application/json"), ("Content-Length", str(len(_NOT_FOUND)))],
        )
        return [_NOT_FOUND]

    return health


class _Server(ThreadingMixIn, WSGIServer):
    # One thread per probe: a client that stalls holds only its own thread.
    daemon_threads = True


class _Handler(WSGIRequestHandler):
    # Probes arrive every few seconds: at debug level, not one stderr line each.
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health port: %s", format % args)

    def get_stderr(self) -> Any:
        return _LogStream()


class _LogStream:
    """wsgiref writes an app's tracebacks to the handler's stderr: into the log instead."""

    def write(self, text: str) -> None:
        if text.strip():
            log.error("health port: %s", text.rstrip())

    def flush(self) -> None:
        return None


class HealthServer:
    """Serves `only_health(app)` on an already listening socket, on a daemon thread."""

    def __init__(self, sock: socket.socket, app: WSGIApplication) -> None:
        self._server = _Server(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        # The socket made before the fork replaces the one the constructor made.
        self._server.socket.close()
        self._server.socket = sock
        self._server.server_address = sock.getsockname()
        host, port = sock.getsockname()[:2]
        # The address as it is (no name lookup: a pod's DNS may be slow or absent).
        self._server.server_name = str(host)
        self._server.server_port = port
        self._server.setup_environ()
        self._server.set_app(only_health(app))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health-port", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving; closes this process's copy of the socket."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
