"""kube-scheduler's POSTs answered by the server itself: read, framed and written back
without gunicorn's request parser, a WSGI environ or gunicorn's response object.

Those three cost a bind more CPU than deciding it (gunicorn parses and checks every header
of every request for the WSGI environ; the verbs need the path and the body). The app
offers the routes it answers this way as `routes.DIRECT_POST` (`DirectPost`). A request
is taken here only in the plainest HTTP/1.1 form, as kube-scheduler's Go client writes it:
a POST with an origin-form path, well-formed header fields within gunicorn's limits, one
Content-Length within the app's body limit and the whole body read, and no header that
changes how the message is framed or the connection is handled (Transfer-Encoding,
Expect, Connection, Upgrade, TE, Trailer), no second Host or Content-Type (gunicorn
refuses those), none of the fields gunicorn reads the scheme or the script name from, and
no name with an underscore (which gunicorn drops or refuses). Everything else (another
method or route, a chunked body, HTTP/1.0, a malformed or oversized request) goes through
gunicorn and the app's WSGI side as before, which answer or refuse it. The answer is
written as gunicorn writes one: status line, Server, Date, Connection, the app's headers,
the body; in one write.
"""

from __future__ import annotations

import re
import time
from typing import NamedTuple, Protocol

from gunicorn import SERVER  # type: ignore[import-untyped]
from gunicorn.util import http_date  # type: ignore[import-untyped]

__all__ = ["DirectPost", "Limits", "Request", "frame", "read_request"]

_LINE = re.compile(rb"POST (/[!-~]*) HTTP/1\.1\r\n")
# A field name is a token (RFC 9110), without the underscore; a value, visible ASCII,
# spaces and tabs, the optional whitespace around it left out.
_FIELD = re.compile(rb"([!#$%&'*+.^`|~0-9A-Za-z-]+):[ \t]*([\t\x20-\x7e]*?)[ \t]*\r\n")
_HANDLED_BY_GUNICORN = frozenset(
    {b"transfer-encoding", b"expect", b"connection", b"upgrade", b"te", b"trailer"}
)
_SINGLE = frozenset({b"content-length", b"host", b"content-type"})


class DirectPost(Protocol):
    """The app's side: the answer to a whole POST of `body` to `path` as its WSGI side
    would give it (status line as "200 OK", headers, body), or None when `path` is not
    one it answers this way."""

    def __call__(
        self, path: str, body: bytes
    ) -> tuple[str, list[tuple[str, str]], bytes] | None: ...


class Limits(NamedTuple):
    """gunicorn's limits (`limit_request_line`, `limit_request_field_size`,
    `limit_request_fields`), the app's body limit (None: none), and the fields, lower case,
    that gunicorn reads something from (`secure_scheme_headers`, `forwarder_headers`)."""

    line: int
    field: int
    fields: int
    body: int | None
    gunicorn_fields: frozenset[bytes] = frozenset()


class Request(NamedTuple):
    path: str
    body: bytes
    end: int
    """Where the request ends in what was read: what follows is the next one's start."""


def read_request(data: bytes, limits: Limits) -> Request | None:
    """The request at the start of `data` when it is a whole POST in the plain form this
    module takes (see above); None for anything else."""
    line = _LINE.match(data)
    if line is None or line.end() - 2 > limits.line:
        return None
    position = line.end()
    length: int | None = None
    seen: set[bytes] = set()
    fields = 0
    while not data.startswith(b"\r\n", position):
        field = _FIELD.match(data, position)
        # gunicorn counts a field's line with its end.
        if field is None or field.end() - position > limits.field:
            return None
        fields += 1
        name = field.group(1).lower()
        if fields > limits.fields or name in _HANDLED_BY_GUNICORN or name in limits.gunicorn_fields:
            return None
        if name in _SINGLE:
            if name in seen:
                return None  # given twice: gunicorn refuses it
            seen.add(name)
        if name == b"content-length":
            value = field.group(2)
            if not value.isdigit():
                return None  # not a number: gunicorn refuses it
            length = int(value)
        position = field.end()
    if length is None or (limits.body is not None and length > limits.body):
        return None
    start = position + 2
    end = start + length
    if len(data) < end:
        return None
    return Request(line.group(1).decode("ascii"), data[start:end], end)


_date = (0, "")


def _http_date() -> str:
    # Made once a second: formatting it costs as much as parsing a request here.
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, http_date(now))
    return _date[1]


def frame(status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    """The answer as gunicorn writes it for an HTTP/1.1 request."""
    connection = "keep-alive" if keep_alive else "close"
    head = [f"HTTP/1.1 {status}\r\nServer: {SERVER}\r\nDate: {_http_date()}\r\n"]
    head.append(f"Connection: {connection}\r\n")
    head.extend(f"{name}: {value}\r\n" for name, value in headers)
    head.append("\r\n")
    return "".join(head).encode("latin-1") + body
