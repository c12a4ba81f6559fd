"""The scheduler's POSTs are answered in front of Flask (`_SchedulerRoutes`), and the plain
ones by the server through the app's `hooks.DIRECT_POST`: every answer, metric and log
line must be what the verbs' Flask routes give for the same request.

Apps over copies of the built-in demo cluster get the same requests, one straight through
Flask, the other through the app as gunicorn calls it or, for the POSTs the server reads
itself, through `DIRECT_POST`; their statuses, headers, bodies, request counts and
decision-log lines are compared.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from werkzeug.test import EnvironBuilder

from gas.cluster.demo import DemoCluster, load_demo_file
from gas.core.ledger import Ledger
from gas.httpserver import hooks
from gas.serving.extender import create_app
from gas.serving.metrics import Metrics
from gas.serving.service import Options

NODES = ["demo-1card", "demo-2cards", "demo-4cards", "demo-cpu-only"]
LIMIT = 4096


def pod(name: str, memory: str = "1Gi") -> dict[str, Any]:
    limits = {"gpu.intel.com/i915": "1", "gpu.intel.com/memory.max": memory}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": limits}}]},
    }


class BrokenCluster(DemoCluster):
    def synced(self) -> bool:
        raise RuntimeError("the cluster view broke")


class Side:
    """One app, called through `call`; its metrics."""

    def __init__(
        self, through_flask: bool, cluster: type[DemoCluster], start: bool, direct: bool = False
    ) -> None:
        ledger = Ledger()
        demo = cluster(ledger, load_demo_file(None))
        if start:
            demo.start()
        self.metrics = Metrics()
        self.app: Flask = create_app(ledger, demo, Options(max_request_bytes=LIMIT), self.metrics)
        self.call: Callable[..., Any] = (
            self.app.wsgi_app.flask if through_flask else self.app.wsgi_app  # type: ignore[attr-defined]
        )
        self.direct = direct
        self.directly = 0  # requests answered through DIRECT_POST

    def request(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
        body = _plain_post(environ)
        if self.direct and body is not None:
            direct = getattr(self.app, hooks.DIRECT_POST)(environ["PATH_INFO"], body)
            if direct is not None:
                self.directly += 1
                return direct[0], sorted(direct[1]), direct[2]
        answer: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
            answer.extend((status, sorted(headers)))

        reply = self.call(environ, start_response)
        body = b"".join(reply)
        getattr(reply, "close", lambda: None)()
        return answer[0], answer[1], body

    def counts(self) -> list[str]:
        """The request and rejection counters, and how many latencies were observed."""
        text = self.metrics.exposition().decode()
        wanted = re.compile(r"^(gas_requests_total|gas_node_rejections_total|\w+_count)\{")
        return sorted(line for line in text.splitlines() if wanted.match(line))


def _plain_post(environ: dict[str, Any]) -> bytes | None:
    """The body of a POST the server would read itself (gas/httpserver/direct.py): declared,
    whole, within the limit."""
    stream = environ.get("wsgi.input")
    length = environ.get("CONTENT_LENGTH")
    if environ["REQUEST_METHOD"] != "POST" or not length or not isinstance(stream, io.BytesIO):
        return None
    body = stream.getvalue()
    return body if len(body) == int(length) <= LIMIT else None


def environ(path: str, body: bytes | None = None, method: str = "POST") -> dict[str, Any]:
    built: dict[str, Any] = EnvironBuilder(
        path=path, method=method, data=body, content_type="application/json"
    ).get_environ()
    return built


def chunked(path: str, body: bytes) -> dict[str, Any]:
    """As gunicorn hands over a chunked request: no length, a terminated stream."""
    built = environ(path, b"")
    built.pop("CONTENT_LENGTH", None)
    built["HTTP_TRANSFER_ENCODING"] = "chunked"
    built["wsgi.input"] = io.BytesIO(body)
    built["wsgi.input_terminated"] = True
    return built


class Stalled(io.RawIOBase):
    def readinto(self, buffer: Any) -> int:
        raise TimeoutError("the client took too long to send its request")


def stalled(path: str, declared: bool) -> dict[str, Any]:
    """A body that does not arrive: gunicorn's stream times out."""
    built = environ(path, b"{}") if declared else chunked(path, b"")
    built["wsgi.input"] = Stalled()
    built["wsgi.input_terminated"] = True
    return built


def filter_body(p: dict[str, Any], names: list[str] = NODES) -> bytes:
    return json.dumps({"Pod": p, "NodeNames": names}).encode()


def requests() -> Iterator[tuple[str, dict[str, Any]]]:
    yield "fit", environ("/scheduler/filter", filter_body(pod("a")))
    yield "no fit", environ("/scheduler/filter", filter_body(pod("b", "20Gi")))
    nodes = {"Pod": pod("c"), "Nodes": {"items": [{"metadata": {"name": "demo-4cards"}}]}}
    yield "Nodes mode", environ("/scheduler/filter", json.dumps(nodes).encode())
    yield "prioritize", environ("/scheduler/prioritize", filter_body(pod("a")))
    preempt = {"Pod": pod("d", "8Gi"), "NodeNameToMetaVictims": {"demo-2cards": None}}
    yield "preempt", environ("/scheduler/preempt", json.dumps(preempt).encode())
    bind = {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "demo-4cards"}
    yield "bind", environ("/scheduler/bind", json.dumps(bind).encode())
    yield "bind again", environ("/scheduler/bind", json.dumps(bind).encode())
    yield "not JSON", environ("/scheduler/filter", b"{")
    yield "NaN", environ("/scheduler/filter", b'{"Pod": {}, "NodeNames": [NaN]}')
    yield "lone surrogate", environ("/scheduler/filter", b'{"Pod": {}, "NodeNames": ["\\ud800"]}')
    yield "names not strings", environ("/scheduler/filter", b'{"Pod": {}, "NodeNames": [1]}')
    yield "bad bind", environ("/scheduler/bind", b'{"PodName": 1}')
    yield "declared too large", environ("/scheduler/filter", b"x" * (LIMIT + 1))
    yield "chunked", chunked("/scheduler/filter", filter_body(pod("e")))
    yield "chunked too large", chunked("/scheduler/filter", b" " * (LIMIT + 1))
    yield "stalled body", stalled("/scheduler/filter", declared=True)
    yield "stalled chunks", stalled("/scheduler/filter", declared=False)
    yield "GET on a verb", environ("/scheduler/filter", method="GET")
    yield "trailing slash", environ("/scheduler/filter/", filter_body(pod("a")))
    yield "healthz", environ("/healthz", method="GET")


@pytest.mark.parametrize("direct", [False, True], ids=["WSGI", "direct"])
@pytest.mark.parametrize(
    ("cluster", "start"),
    [(DemoCluster, True), (DemoCluster, False), (BrokenCluster, True)],
    ids=["synced", "not synced", "broken"],
)
def test_scheduler_routes_answer_as_flask_does(
    cluster: type[DemoCluster], start: bool, direct: bool, caplog: pytest.LogCaptureFixture
) -> None:
    front, flask = Side(False, cluster, start, direct), Side(True, cluster, start)
    caplog.set_level(logging.INFO, logger="gas")
    for name, env in requests():
        caplog.clear()
        answer = front.request(dict(env, **{"wsgi.input": _copy(env["wsgi.input"])}))
        front_logs = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        caplog.clear()
        assert answer == flask.request(env), name
        flask_logs = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        assert front_logs == flask_logs, name
    assert front.counts() == flask.counts()
    assert any(line.startswith("gas_requests_total") for line in front.counts())
    # Every plain POST to a verb (12 of the requests) went through DIRECT_POST.
    assert front.directly == (12 if direct else 0)


def _copy(stream: Any) -> Any:
    if isinstance(stream, io.BytesIO):
        return io.BytesIO(stream.getvalue())
    return stream


def test_the_statuses_are_the_ones_promised() -> None:
    side = Side(False, DemoCluster, True)
    statuses = {
        name: side.request(dict(env, **{"wsgi.input": _copy(env["wsgi.input"])}))[0]
        for name, env in requests()
    }
    assert statuses["fit"] == statuses["no fit"] == statuses["chunked"] == "200 OK"
    assert statuses["not JSON"] == statuses["lone surrogate"] == "400 BAD REQUEST"
    assert statuses["declared too large"] == "413 REQUEST ENTITY TOO LARGE"
    assert statuses["chunked too large"] == "413 REQUEST ENTITY TOO LARGE"
    # A body that stops arriving, declared or chunked, is timed out by the server's read
    # deadline: 408.
    assert statuses["stalled body"] == "408 REQUEST TIMEOUT"
    assert statuses["stalled chunks"] == "408 REQUEST TIMEOUT"
    assert statuses["GET on a verb"] == "405 METHOD NOT ALLOWED"
    assert statuses["trailing slash"] == "404 NOT FOUND"
    assert Side(False, DemoCluster, False).request(environ("/scheduler/filter", b"{}"))[0] == (
        "400 BAD REQUEST"
    )
