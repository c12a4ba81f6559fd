"""A whole request in, its answer out: through the app's direct POSTs
(`gas.httpserver.direct.DirectPost`) where it takes them, else through its WSGI side with an
environ built here. The same for HTTP/1.1 and HTTP/2; runs on the loop's thread or on a
pool thread, never does I/O of its own.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from gas.httpserver import direct, hooks

__all__ = ["HOP_BY_HOP", "Answer", "App", "Request", "WSGIApp", "answer"]

log = logging.getLogger(__name__)

Answer = tuple[str, list[tuple[str, str]], bytes]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
)


@dataclass(frozen=True)
class App:
    """What requests are answered with: the WSGI app, its direct POSTs (None: none) and
    its body limit (None: none)."""

    wsgi: WSGIApp
    direct_post: direct.DirectPost | None
    body_limit: int | None
    scheme: str
    server: tuple[str, int]
    opened: Callable[[str], None] | None = None
    """Told the protocol of each connection whose handshake completed."""

    @classmethod
    def of(cls, wsgi: Any, scheme: str, server: tuple[str, int]) -> App:
        """The app `wsgi` as served on `server`, with the hooks it offers
        (`hooks.DIRECT_POST`, `hooks.CONNECTION_OPENED`)."""
        limit = getattr(wsgi, "config", {}).get("MAX_CONTENT_LENGTH")
        return cls(
            wsgi,
            getattr(wsgi, hooks.DIRECT_POST, None),
            limit,
            scheme,
            server,
            getattr(wsgi, hooks.CONNECTION_OPENED, None),
        )


@dataclass(slots=True)
class Request:
    method: str
    target: str
    """The request target as sent (path and query)."""
    headers: list[tuple[bytes, bytes]]
    """Field names in lower case; HTTP/2's pseudo-fields left out but :authority, given
    as host."""
    body: bytes
    protocol: str
    """"HTTP/1.1", "HTTP/1.0" or "HTTP/2"."""
    client: tuple[str, int] | None
    declared: int | None = None
    """The Content-Length sent, when one was."""


def answer(app: App, request: Request) -> Answer:
    """The app's answer to `request`: status line ("200 OK"), headers, body. An app that
    raises gets a bare 500, logged."""
    try:
        if app.direct_post is not None and request.method == "POST":
            limit = app.body_limit
            if limit is None or (len(request.body) <= limit and (request.declared or 0) <= limit):
                direct_answer = app.direct_post(request.target, request.body)
                if direct_answer is not None:
                    return direct_answer
        return _wsgi(app, request)
    except Exception:
        log.exception("%s %s failed", request.method, request.target)
        return "500 Internal Server Error", [("Content-Length", "0")], b""


def strip_hop_by_hop(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """An answer's fields as HTTP/2 carries them: lower case, without connection fields."""
    fields = []
    for name, value in headers:
        key = name.lower()
        if key not in HOP_BY_HOP:
            fields.append((key.encode("latin-1"), value.strip().encode("latin-1")))
    return fields


def _wsgi(app: App, request: Request) -> Answer:
    raw_path, _, query = request.target.partition("?")
    client = request.client
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(raw_path).decode("latin-1"),
        "QUERY_STRING": query,
        "RAW_URI": request.target,
        "SERVER_NAME": app.server[0],
        "SERVER_PORT": str(app.server[1]),
        "SERVER_PROTOCOL": request.protocol,
        "REMOTE_ADDR": str(client[0]) if client else "",
        "REMOTE_PORT": str(client[1]) if client else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": app.scheme,
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.input_terminated": True,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    declared = request.declared
    environ["CONTENT_LENGTH"] = str(declared if declared is not None else len(request.body))
    for name, value in request.headers:
        text = value.decode("latin-1")
        if name == b"content-type":
            environ["CONTENT_TYPE"] = text
        elif name != b"content-length":
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            joiner = "; " if name == b"cookie" else ","
            environ[key] = f"{environ[key]}{joiner}{text}" if key in environ else text
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, headers]
        return lambda data: None

    chunks = app.wsgi(environ, start_response)
    try:
        data = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    status, headers = started
    if request.method == "HEAD":
        data = b""
    return status, list(headers), data
