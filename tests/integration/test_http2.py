"""gas serve over HTTP/2 (chosen through ALPN on the mutual-TLS port), through a real TLS
socket and a real HTTP/2 client: the same answers and counts as over HTTP/1.1, every call
on one connection, streams answered concurrently, limits and protocol errors."""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.errors
import pytest
from hyperframe.frame import HeadersFrame

from gas.httpserver.limits import DEFAULT_LIMITS
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.h2client import MAX_CONCURRENT_STREAMS, H2Client
from tests.support.ledger_checks import gas_serving, ledger_of
from tests.support.objects import binding_args, gpu_node, gpu_pod
from tests.support.promtext import total

MAX_STREAMS = DEFAULT_LIMITS.h2_max_streams
MAX_BODY = 256 * 1024
NODES = ["two-cards", "four-cards"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as api:
        api.add_node(gpu_node("two-cards", "0.1", i915="2", memory_max="16Gi"))
        api.add_node(gpu_node("four-cards", "0.1.2.3", i915="4", memory_max="32Gi"))
        yield api


@pytest.fixture(scope="module")
def server(
    cluster: ApiServerDouble, tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GasProcess]:
    directory = tmp_path_factory.mktemp("gas-h2")
    args = ["--maxRequestBytes", str(MAX_BODY)]
    with gas_serving(cluster, directory, tls_files, args, NODES) as process:
        yield process


def pod_body(name: str) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def bind_body(pod: dict[str, Any], node: str) -> bytes:
    """A bind of `pod` to `node` as kube-scheduler writes it."""
    return json.dumps(binding_args(pod, node)).encode()


def http1(
    server: GasProcess, tls: TLSFiles, method: str, path: str, body: bytes
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The answer over HTTP/1.1, without the fields HTTP/2 has no place for (Connection)
    or that only the HTTP/1.1 framing writes (Server, Date)."""
    context = ssl.create_default_context(cafile=tls.ca)
    context.load_cert_chain(tls.client_cert, tls.client_key)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        conn.request(method, path, body or None, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    skip = {"date", "server", "connection"}
    headers = [(k.lower(), v) for k, v in response.getheaders() if k.lower() not in skip]
    return response.status, headers, data


def counted(server: GasProcess, verb: str) -> float:
    text = server.session.get(server.url + "/metrics", timeout=5).text
    return total(text, "gas_requests_total", verb=verb)


def test_a_client_offering_h2_gets_it_and_one_offering_only_http1_keeps_http1(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    with H2Client(server.port, tls_files) as client:
        assert client.protocol == "h2"
        assert client.settings()[MAX_CONCURRENT_STREAMS] == MAX_STREAMS
    with H2Client(server.port, tls_files, alpn=("http/1.1",)) as client:
        assert client.protocol == "http/1.1"


def test_each_connection_is_counted_by_the_protocol_it_chose(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    def connections(client: H2Client) -> dict[str, float]:
        text = client.request("GET", "/metrics", b"").body.decode()
        return {p: total(text, "gas_connections_total", protocol=p) for p in ("h2", "http/1.1")}

    # Read over a connection of its own, counted before the first reading.
    with H2Client(server.port, tls_files) as reader:
        before = connections(reader)
        with H2Client(server.port, tls_files) as client:
            for _ in range(3):
                assert client.request("GET", "/healthz", b"").status == 200
        for _ in range(2):
            assert http1(server, tls_files, "GET", "/healthz", b"")[0] == 200
        after = connections(reader)
    assert {p: after[p] - before[p] for p in after} == {"h2": 1, "http/1.1": 2}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/scheduler/filter", {"Pod": pod_body("p"), "NodeNames": ["two-cards", "x"]}),
        ("POST", "/scheduler/prioritize", {"Pod": pod_body("p"), "NodeNames": ["four-cards"]}),
        ("POST", "/scheduler/preempt", {"Pod": pod_body("p"), "NodeNameToMetaVictims": {}}),
        ("POST", "/scheduler/bind", {"PodName": "gone", "PodNamespace": "default", "PodUID": "u"}),
        ("POST", "/scheduler/filter", b"{not json"),
        ("POST", "/scheduler/filter", b"x" * (MAX_BODY + 1)),
        ("POST", "/scheduler/nothing", b"{}"),
        ("GET", "/scheduler/filter", b""),
        ("GET", "/healthz", b""),
        ("GET", "/readyz", b""),
    ],
)
def test_every_request_gets_the_answer_and_count_it_gets_over_http1(
    server: GasProcess, tls_files: TLSFiles, method: str, path: str, body: object
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    verb = path.rsplit("/", 1)[-1]
    before = counted(server, verb)
    status, headers, answer = http1(server, tls_files, method, path, data)
    with H2Client(server.port, tls_files) as client:
        response = client.request(method, path, data)
    assert (response.status, response.headers, response.body) == (status, headers, answer)
    if verb in ("filter", "prioritize", "preempt", "bind") and method == "POST":
        assert counted(server, verb) - before == 2


def test_every_call_goes_on_one_connection(server: GasProcess, tls_files: TLSFiles) -> None:
    body = json.dumps({"Pod": pod_body("p"), "NodeNames": NODES}).encode()
    before = counted(server, "filter")
    with H2Client(server.port, tls_files) as client:
        streams = [client.start("POST", "/scheduler/filter", body) for _ in range(40)]
        replies = [client.wait(stream) for stream in streams]
    assert {r.status for r in replies} == {200}
    assert {json.loads(r.body)["NodeNames"] == NODES for r in replies} == {True}
    assert counted(server, "filter") - before == 40


def test_a_filter_is_answered_while_a_bind_on_the_same_connection_waits_on_the_api_server(
    server: GasProcess, cluster: ApiServerDouble, tls_files: TLSFiles
) -> None:
    slow = cluster.add_pod(gpu_pod("slow-h2"))
    probe = cluster.add_pod(gpu_pod("probe-h2"))
    cluster.faults.add("POST", r"/pods/slow-h2/binding$", ("delay", 2.0))
    with H2Client(server.port, tls_files) as client:
        bind_stream = client.start("POST", "/scheduler/bind", bind_body(slow, "four-cards"))
        time.sleep(0.3)  # the bind now waits on the API server
        filter_body = json.dumps({"Pod": probe, "NodeNames": ["four-cards"]}).encode()
        filter_stream = client.start("POST", "/scheduler/filter", filter_body)
        assert json.loads(client.wait(filter_stream).body)["NodeNames"] == ["four-cards"]
        assert json.loads(client.wait(bind_stream).body)["Error"] == ""
        assert client.finished.index(filter_stream) < client.finished.index(bind_stream)
    assert ledger_of(server)["pods"][slow["metadata"]["uid"]]["node"] == "four-cards"


def test_a_body_over_the_limit_without_a_length_gets_413_and_the_connection_goes_on(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    filter_body = json.dumps({"Pod": pod_body("p"), "NodeNames": NODES}).encode()
    with H2Client(server.port, tls_files) as client:
        big = client.start("POST", "/scheduler/filter", b"x" * (4 * MAX_BODY), content_length=False)
        response = client.wait(big)
        assert response.status == 413
        assert json.loads(response.body)["Error"]
        # The connection still serves.
        assert client.request("POST", "/scheduler/filter", filter_body).status == 200


def test_more_streams_than_allowed_lose_the_connection_and_gas_serves_on(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    filter_body = json.dumps({"Pod": pod_body("p"), "NodeNames": NODES}).encode()
    with H2Client(server.port, tls_files) as client:
        client.settings()
        # Written as raw frames: h2 as a client keeps to the server's limit. Bodies left
        # open keep the streams open on gas's side.
        head = [(":method", "POST"), (":path", "/scheduler/filter")]
        head += [(":scheme", "https"), (":authority", "gas")]
        for number in range(MAX_STREAMS + 1):
            frame = HeadersFrame(1 + 2 * number, flags=["END_HEADERS"])
            frame.data = client.conn.encoder.encode(head)
            client.sock.sendall(frame.serialize())
        client.flush()
        while client.read_once():
            pass
        assert client.terminated is not None
        assert client.terminated.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    with H2Client(server.port, tls_files) as client:
        assert client.request("POST", "/scheduler/filter", filter_body).status == 200


_GOOD_HEAD = [
    (":method", "POST"),
    (":path", "/scheduler/filter"),
    (":scheme", "https"),
    (":authority", "gas"),
]


@pytest.mark.parametrize(
    "head",
    [
        _GOOD_HEAD[:1] + _GOOD_HEAD[2:],  # no :path
        [*_GOOD_HEAD, ("Content-Type", "application/json")],  # a name in upper case
        [*_GOOD_HEAD, ("connection", "keep-alive")],  # a hop-by-hop field
        [*_GOOD_HEAD, (":method", "GET")],  # a second pseudo-header
        [("content-type", "application/json"), *_GOOD_HEAD],  # pseudo-headers last
    ],
    ids=["no-path", "upper-case", "hop-by-hop", "second-method", "pseudo-last"],
)
def test_a_malformed_header_block_ends_the_connection_before_any_verb_sees_it(
    server: GasProcess, tls_files: TLSFiles, head: list[tuple[str, str]]
) -> None:
    filter_body = json.dumps({"Pod": pod_body("p"), "NodeNames": NODES}).encode()
    before = counted(server, "filter")
    with H2Client(server.port, tls_files) as client:
        client.settings()
        # Written as raw frames: h2 as a client refuses to send these.
        frame = HeadersFrame(1, flags=["END_HEADERS", "END_STREAM"])
        frame.data = client.conn.encoder.encode(head)
        client.sock.sendall(frame.serialize())
        while client.read_once():
            pass
        assert client.terminated is not None
        assert client.terminated.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert counted(server, "filter") == before
    with H2Client(server.port, tls_files) as client:
        assert client.request("POST", "/scheduler/filter", filter_body).status == 200


def test_garbage_instead_of_frames_ends_the_connection_and_gas_serves_on(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    with H2Client(server.port, tls_files) as client:
        client.settings()
        # A frame of an unknown type is to be ignored; a SETTINGS frame on a stream is not.
        client.sock.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x07" + b"GET / HTTP/1.1\r\n")
        while client.read_once():
            pass
        assert client.terminated is not None
        assert client.terminated.error_code != h2.errors.ErrorCodes.NO_ERROR
    assert server.session.get(server.url + "/healthz", timeout=5).status_code == 200
    with H2Client(server.port, tls_files) as client:
        assert client.request("GET", "/healthz").status == 200


def test_on_shutdown_the_client_gets_goaway_after_its_streams_are_answered(
    cluster: ApiServerDouble, tls_files: TLSFiles, tmp_path: Path
) -> None:
    with gas_serving(cluster, tmp_path, tls_files, [], NODES) as process:
        slow = cluster.add_pod(gpu_pod("slow-stop"))
        cluster.faults.add("POST", r"/pods/slow-stop/binding$", ("delay", 1.5))
        with H2Client(process.port, tls_files) as client:
            stream = client.start("POST", "/scheduler/bind", bind_body(slow, "two-cards"))
            time.sleep(0.3)
            stopper = threading.Thread(target=process.stop, args=(signal.SIGTERM,))
            stopper.start()
            response = client.wait(stream)
            while client.read_once():
                pass
            stopper.join(timeout=60)
        assert response.status == 200 and json.loads(response.body)["Error"] == ""
        assert client.terminated is not None
        assert client.terminated.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert client.terminated.last_stream_id == stream
