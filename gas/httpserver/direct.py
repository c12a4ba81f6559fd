"""kube-scheduler's POSTs answered without a WSGI environ or Flask: the app offers the
routes it answers this way as `hooks.DIRECT_POST` (`DirectPost`), and the serving loop
(`gas.httpserver.answering`) calls it with the path and the whole body. Building an environ
and going through Flask cost a bind more CPU than deciding it. Also how an HTTP/1.1 answer
is framed (`frame`).
"""

from __future__ import annotations

import time
from typing import Protocol

from gunicorn import SERVER  # type: ignore[import-untyped]
from gunicorn.util import http_date  # type: ignore[import-untyped]

__all__ = ["DirectPost", "frame"]


class DirectPost(Protocol):
    """The app's side: the answer to a whole POST of `body` to `path` as its WSGI side
    would give it (status line as "200 OK", headers, body), or None when `path` is not
    one it answers this way."""

    def __call__(
        self, path: str, body: bytes
    ) -> tuple[str, list[tuple[str, str]], bytes] | None: ...


_date = (0, "")


def _http_date() -> str:
    # Made once a second: formatting it costs as much as parsing a request here.
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, http_date(now))
    return _date[1]


def frame(status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    """An HTTP/1.1 answer: status line, Server, Date, Connection, the app's headers, the
    body; in one piece, for one write."""
    connection = "keep-alive" if keep_alive else "close"
    head = [f"HTTP/1.1 {status}\r\nServer: {SERVER}\r\nDate: {_http_date()}\r\n"]
    head.append(f"Connection: {connection}\r\n")
    head.extend(f"{name}: {value}\r\n" for name, value in headers)
    head.append("\r\n")
    return "".join(head).encode("latin-1") + body
