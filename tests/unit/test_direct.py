"""The requests the server answers itself (gas/serving/direct.py): exactly the plain, whole
POSTs kube-scheduler writes; anything else is left, untouched, for gunicorn."""

from __future__ import annotations

import email.utils
import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from gunicorn.config import Config  # type: ignore[import-untyped]
from gunicorn.http.unreader import Unreader  # type: ignore[import-untyped]

from gas.serving import routes
from gas.serving.direct import Limits, Request, frame, read_request
from gas.serving.server import QuickQuitThreadWorker, ServerSettings, build_options, direct_posts

pytestmark = pytest.mark.unit

LIMITS = Limits(line=4094, field=8190, fields=100, body=1024)
BODY = b'{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"n"}'


def go_request(body: bytes = BODY, path: str = "/scheduler/bind", *extra: str) -> bytes:
    """As kube-scheduler's Go client writes a POST."""
    fields = [
        "Host: gas.example:9001",
        "User-Agent: Go-http-client/1.1",
        f"Content-Length: {len(body)}",
        "Content-Type: application/json",
        *extra,
        "Accept-Encoding: gzip",
    ]
    return (
        f"POST {path} HTTP/1.1\r\n{''.join(f + chr(13) + chr(10) for f in fields)}\r\n".encode()
        + body
    )


def test_a_go_post_is_read_whole() -> None:
    data = go_request()
    assert read_request(data, LIMITS) == Request("/scheduler/bind", BODY, len(data))


def test_what_follows_the_body_is_left_for_the_next_request() -> None:
    data = go_request() + b"POST /scheduler/fil"
    request = read_request(data, LIMITS)
    assert request is not None and request.body == BODY
    assert data[request.end :] == b"POST /scheduler/fil"


def test_field_whitespace_and_case_are_as_http_allows() -> None:
    data = go_request(BODY, "/scheduler/bind", "X-Trace:\t a b \t").replace(
        b"Content-Length: ", b"content-LENGTH:   "
    )
    assert read_request(data, LIMITS) == Request("/scheduler/bind", BODY, len(data))


def test_an_empty_body_is_read() -> None:
    request = read_request(go_request(b""), LIMITS)
    assert request is not None and request.body == b""


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(go_request()[:-1], id="body not all in"),
        pytest.param(go_request().split(b"\r\n\r\n")[0] + b"\r\n", id="head not all in"),
        pytest.param(go_request().replace(b"POST", b"GET", 1), id="another method"),
        pytest.param(go_request().replace(b"HTTP/1.1", b"HTTP/1.0", 1), id="HTTP/1.0"),
        pytest.param(go_request(BODY, "http://gas/scheduler/bind"), id="absolute form"),
        pytest.param(go_request(BODY, "/scheduler/a b"), id="space in the path"),
        pytest.param(
            go_request().replace(b"Content-Length: 64", b"Transfer-Encoding: chunked"),
            id="chunked",
        ),
        pytest.param(go_request(BODY, "/x", "Expect: 100-continue"), id="expect"),
        pytest.param(go_request(BODY, "/x", "Connection: close"), id="connection"),
        pytest.param(go_request(BODY, "/x", "Upgrade: h2c"), id="upgrade"),
        pytest.param(go_request(BODY, "/x", "TE: trailers"), id="te"),
        pytest.param(go_request(BODY, "/x", "Trailer: X"), id="trailer"),
        pytest.param(go_request(BODY, "/x", "SCRIPT_NAME: /scheduler"), id="underscore name"),
        pytest.param(go_request(BODY, "/x", "Content-Length: 64"), id="two lengths"),
        pytest.param(
            go_request().replace(b"Content-Length: 64", b"Content-Length: +64"), id="signed"
        ),
        pytest.param(go_request().replace(b"Content-Length: 64\r\n", b""), id="no length"),
        pytest.param(go_request(BODY, "/x", "X-A: a\r\n b"), id="folded field"),
        pytest.param(go_request(BODY, "/x", "X-A: \x01"), id="control character"),
        pytest.param(go_request(BODY, "/x", "X-A: caf\u00e9"), id="non-ASCII value"),
        pytest.param(go_request(BODY, "/x", "X A: a"), id="bad name"),
        pytest.param(go_request().replace(b"\r\n", b"\n"), id="bare line feeds"),
        pytest.param(go_request(b"x" * 1025), id="body over the limit"),
        pytest.param(go_request(BODY, "/" + "a" * 4100), id="line over the limit"),
        pytest.param(go_request(BODY, "/x", "X-A: " + "a" * 8190), id="field over the limit"),
        pytest.param(
            go_request(BODY, "/x", *(f"X-{i}: 1" for i in range(97))), id="too many fields"
        ),
    ],
)
def test_anything_but_a_plain_whole_post_is_left_to_gunicorn(data: bytes) -> None:
    assert read_request(data, LIMITS) is None


def test_no_body_limit_when_the_app_sets_none() -> None:
    body = b"x" * 5000
    request = read_request(go_request(body), LIMITS._replace(body=None))
    assert request is not None and request.body == body


def test_an_answer_is_framed_as_gunicorn_writes_it() -> None:
    data = frame(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")], b"{}", True
    )
    head, body = data.split(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK"
    assert lines[1] == "Server: gunicorn"
    assert lines[2].startswith("Date: ")
    assert email.utils.parsedate_to_datetime(lines[2][6:]).tzname() == "UTC"
    assert lines[3:] == [
        "Connection: keep-alive",
        "Content-Type: application/json",
        "Content-Length: 2",
    ]
    assert body == b"{}"
    closing = frame("503 SERVICE UNAVAILABLE", [], b"", False)
    assert b"\r\nConnection: close\r\n" in closing
    assert closing.startswith(b"HTTP/1.1 503 SERVICE UNAVAILABLE\r\n")


@pytest.mark.parametrize(
    "field",
    [
        pytest.param("Host: other", id="second host"),
        pytest.param("Content-Type: text/plain", id="second content type"),
        pytest.param("X-Forwarded-Proto: https", id="scheme field"),
    ],
)
def test_what_gunicorn_refuses_or_reads_is_left_to_it(field: str) -> None:
    limits = LIMITS._replace(gunicorn_fields=frozenset({b"x-forwarded-proto"}))
    assert read_request(go_request(BODY, "/x"), limits) is not None
    assert read_request(go_request(BODY, "/x", field), limits) is None


def test_a_field_line_is_counted_with_its_end_as_gunicorn_counts_it() -> None:
    # gunicorn refuses a field whose line, its CRLF included, is longer than the limit.
    longest = "X-A: " + "a" * (LIMITS.field - 7)
    assert read_request(go_request(BODY, "/x", longest), LIMITS) is not None
    assert read_request(go_request(BODY, "/x", longest + "a"), LIMITS) is None


# ------------------------------------------------------------ the worker's side


class Sent:
    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


def worker_and_connection(
    data: bytes, answer: bool = True, **state: Any
) -> tuple[Any, Any, list[tuple[str, bytes]]]:
    """A stand-in for the worker's state `_answer_direct` reads, and a connection whose
    parser holds `data` as `_collect_request` leaves it."""
    calls: list[tuple[str, bytes]] = []

    def post(path: str, body: bytes) -> tuple[str, list[tuple[str, str]], bytes] | None:
        calls.append((path, body))
        return ("200 OK", [("Content-Length", "2")], b"{}") if answer else None

    worker = SimpleNamespace(
        _direct=post,
        _direct_limits=LIMITS,
        nr=0,
        max_requests=sys.maxsize,
        alive=True,
        log=logging.getLogger("test"),
        cfg=SimpleNamespace(keepalive=2),
        keepalived_conns=[],
        max_keepalived=10,
    )
    for key, value in state.items():
        setattr(worker, key, value)
    unreader = Unreader()
    unreader.unread(data)
    connection = SimpleNamespace(parser=SimpleNamespace(unreader=unreader), sock=Sent())
    return worker, connection, calls


def test_the_worker_answers_a_plain_post_and_keeps_what_follows() -> None:
    following = b"POST /scheduler/fil"
    worker, connection, calls = worker_and_connection(go_request() + following)
    assert QuickQuitThreadWorker._answer_direct(worker, connection) is True
    assert calls == [("/scheduler/bind", BODY)]
    assert connection.sock.data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert connection.sock.data.endswith(
        b"\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert connection.parser.unreader.buf.getvalue() == following
    assert worker.nr == 1


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        pytest.param(go_request(), False, id="a route the app does not answer so"),
        pytest.param(go_request(BODY, "/x", "Connection: close"), True, id="not plain"),
    ],
)
def test_the_worker_leaves_a_request_it_does_not_answer_as_it_came(
    data: bytes, answer: bool
) -> None:
    worker, connection, _ = worker_and_connection(data, answer)
    assert QuickQuitThreadWorker._answer_direct(worker, connection) is None
    assert connection.parser.unreader.buf.getvalue() == data
    assert connection.sock.data == b"" and worker.nr == 0


@pytest.mark.parametrize(
    "state",
    [
        pytest.param({"alive": False}, id="stopping"),
        pytest.param({"cfg": SimpleNamespace(keepalive=0)}, id="no keep-alive"),
        pytest.param({"keepalived_conns": [None] * 10}, id="kept connections full"),
        pytest.param({"max_requests": 1}, id="last request"),
    ],
)
def test_the_worker_closes_where_gunicorn_would(state: dict[str, Any]) -> None:
    worker, connection, _ = worker_and_connection(go_request(), **state)
    assert QuickQuitThreadWorker._answer_direct(worker, connection) is False
    assert b"\r\nConnection: close\r\n" in connection.sock.data
    if "max_requests" in state:
        assert worker.alive is False  # the worker restarts after this request


# ------------------------------------------------------------ whether the worker takes them


def gunicorn_config(**settings: Any) -> Any:
    """gunicorn's configuration as `gas serve` sets it (`build_options`)."""
    cfg = Config()
    options = build_options(ServerSettings(unsafe=True, **settings))
    for key, value in options.items():
        cfg.set(key, value)
    return cfg


def extender_app() -> Any:
    from gas.cluster.demo import DemoCluster, load_demo_file
    from gas.core.ledger import Ledger
    from gas.serving.extender import create_app
    from gas.serving.service import Options

    ledger = Ledger()
    return create_app(
        ledger, DemoCluster(ledger, load_demo_file(None)), Options(max_request_bytes=4096)
    )


def test_gas_serve_answers_the_verbs_itself_with_gunicorns_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SCRIPT_NAME", raising=False)
    app = extender_app()
    post, limits = direct_posts(app, gunicorn_config(max_request_header_bytes=4000))
    assert post is not None and post == getattr(app, routes.DIRECT_POST)
    assert (limits.line, limits.field, limits.fields, limits.body) == (4000, 4000, 100, 4096)
    assert {b"x-forwarded-proto", b"script_name"} <= limits.gunicorn_fields


@pytest.mark.parametrize("why", ["access log", "proxy protocol", "SCRIPT_NAME", "no such app"])
def test_the_worker_leaves_every_request_to_gunicorn_when(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCRIPT_NAME", raising=False)
    app: Any = extender_app()
    cfg = gunicorn_config(access_log=why == "access log")
    if why == "proxy protocol":
        cfg.set("proxy_protocol", "v1")
    if why == "SCRIPT_NAME":
        monkeypatch.setenv("SCRIPT_NAME", "/gas")
    if why == "no such app":
        app = object()
    assert direct_posts(app, cfg)[0] is None
