"""A few plain answers beside a WSGI app, on the same port: an agent's metrics port also
answers its liveness probe and its usage report."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gas.httpserver.answering import WSGIApp

Answer = Callable[[], tuple[int, str, bytes]]
"""`answer()`: (status, content type, body)."""

_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


def with_answers(app: WSGIApp, answers: Mapping[str, Answer]) -> WSGIApp:
    """`app`, but for the paths of `answers`, each answered by its function."""

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        answer = answers.get(str(environ.get("PATH_INFO") or ""))
        if answer is None:
            return app(environ, start_response)
        status, content_type, body = answer()
        start_response(
            f"{status} {_REASONS.get(status, '')}".rstrip(),
            [("Content-Type", content_type), ("Content-Length", str(len(body)))],
        )
        return [body]

    return routed
