"""The serving loop on a daemon thread of its own, for a process that is not gunicorn's
worker: `gas node`'s metrics port. Plain HTTP/1.1, the same limits as every listener of
gas (`gas.httpserver.limits`): no thread per connection, timeouts that a trickle cannot
reset."""

from __future__ import annotations

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from gas.httpserver.answering import App, WSGIApp
from gas.httpserver.connection import Listener
from gas.httpserver.front import Front, new_loop
from gas.httpserver.limits import DEFAULT_LIMITS, Limits
from gas.httpserver.stats import ServingStats

__all__ = ["BackgroundServer", "listen"]

log = logging.getLogger(__name__)


def listen(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on `host` ("0.0.0.0", "::", "[::]", an address or a name)
    and `port`. Raises OSError (port in use, no such address)."""
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class BackgroundServer:
    """Serves `wsgi` on the listening `sock` until `stop`; `threads` answer requests."""

    def __init__(
        self,
        sock: socket.socket,
        wsgi: WSGIApp,
        *,
        limits: Limits = DEFAULT_LIMITS,
        threads: int = 1,
        name: str = "http",
    ) -> None:
        self.stats = ServingStats()
        self._sock = sock
        self._wsgi = wsgi
        self._limits = limits
        self._threads = threads
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._listening.wait(10)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)

    def _run(self) -> None:
        loop = new_loop()
        pool = ThreadPoolExecutor(self._threads, f"{self._thread.name}-request")
        try:
            front = Front(loop, self._limits, pool, self.stats)
            host, port = self._sock.getsockname()[:2]
            app = App.of(self._wsgi, "http", (str(host), int(port)))
            loop.run_until_complete(front.listen(self._sock, Listener(app, None)))
            self._listening.set()
            loop.run_until_complete(
                front.run(lambda: not self._stopping.is_set(), lambda: None, 1.0)
            )
        except Exception:
            log.exception("the %s server stopped", self._thread.name)
        finally:
            self._listening.set()
            pool.shutdown(wait=False)
            loop.close()
            self._sock.close()
