"""The answers the serving loop frames itself over HTTP/1.1 (gas/httpserver/direct.py), and
the POSTs the extender answers without a WSGI environ."""

from __future__ import annotations

import email.utils
from typing import Any

import pytest

from gas.httpserver import hooks
from gas.httpserver.direct import frame
from gas.serving import routes

pytestmark = pytest.mark.unit


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


def extender_app() -> Any:
    from gas.cluster.demo import DemoCluster, load_demo_file
    from gas.core.ledger import Ledger
    from gas.serving.extender import create_app
    from gas.serving.service import Options

    ledger = Ledger()
    cluster = DemoCluster(ledger, load_demo_file(None))
    cluster.start()
    return create_app(ledger, cluster, Options(max_request_bytes=4096))


def test_the_extender_answers_its_verbs_directly_and_nothing_else() -> None:
    post = getattr(extender_app(), hooks.DIRECT_POST)
    pod = b'{"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": {"containers": []}}'
    status, headers, body = post(routes.FILTER, b'{"Pod": %s, "NodeNames": ["demo-1card"]}' % pod)
    assert status == "200 OK"
    assert ("Content-Type", "application/json") in headers
    assert b'"demo-1card":"gpu: pod has no containers"' in body
    assert post("/metrics", b"") is None
    assert post(routes.HEALTHZ, b"") is None
