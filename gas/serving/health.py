"""The health port (`gas serve --healthPort`): plain HTTP, `GET /healthz` and `GET /readyz`
only, for kubelet's probes.

With `--cacert` the main port demands a client certificate in the TLS handshake, and
kubelet's HTTPS probes present none, so a probe of the main port can never succeed. The
health port answers the two probe routes through the same app as the main port (the same
status and body); every other path is 404, so nothing but health leaves gas unencrypted
and unauthenticated. The socket is bound by `gas serve` before gunicorn forks, so a port
in use fails at start; the worker's serving loop serves it beside the main port, with the
same limits (`gas.httpserver.front`), so a probe is answered whatever other peers do.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gas.httpserver import background
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
    return background.listen(host, port, backlog=64)


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
