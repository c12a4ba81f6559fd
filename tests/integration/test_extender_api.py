"""The extender's HTTP API through real gunicorn, real mutual TLS and the real `kubernetes`
client watching the API-server double: wire format, status codes, filter and bind."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles, free_port
from tests.support.ledger_checks import gas_serving, ledger_of
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.promtext import total

MAX_BODY = 256 * 1024
REPLY_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as api:
        api.add_node(gpu_node("two-cards", "0.1", i915="2", memory_max="16Gi"))
        api.add_node(gpu_node("four-cards", "0.1.2.3", i915="4", memory_max="32Gi"))
        api.add_node({"metadata": {"name": "cpu-only"}, "status": {"allocatable": {"cpu": "4"}}})
        yield api


@pytest.fixture(scope="module")
def server(
    cluster: ApiServerDouble, tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GasProcess]:
    directory = tmp_path_factory.mktemp("gas-api")
    args = ["--maxRequestBytes", str(MAX_BODY)]
    nodes = ["two-cards", "four-cards", "cpu-only"]
    with gas_serving(cluster, directory, tls_files, args, nodes) as process:
        yield process


def pod_body(name: str, *containers: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    pod = gpu_pod(name, *containers)
    pod["metadata"]["uid"] = uid or f"uid-{name}"
    return pod


# ------------------------------------------------------------------ filter


def test_filter_accounts_for_every_node_with_exact_keys(server: GasProcess) -> None:
    names = ["two-cards", "cpu-only", "ghost", "four-cards"]
    response = server.post("/scheduler/filter", {"Pod": pod_body("p"), "NodeNames": names})
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    reply = response.json()
    assert set(reply) == REPLY_KEYS
    assert reply["Nodes"] is None
    assert reply["NodeNames"] == ["two-cards", "four-cards"]  # input order kept
    assert reply["FailedNodes"] == {"ghost": "gpu: node is not known to gas"}
    assert set(reply["FailedAndUnresolvableNodes"]) == {"cpu-only"}
    assert "gpu-numbers" in reply["FailedAndUnresolvableNodes"]["cpu-only"]
    assert reply["Error"] == ""


def test_filter_keys_are_read_case_insensitively(server: GasProcess) -> None:
    reply = server.post(
        "/scheduler/filter", {"pod": pod_body("p"), "nodenames": ["two-cards"]}
    ).json()
    assert reply["NodeNames"] == ["two-cards"]


def test_filter_with_full_nodes_returns_them_unchanged(
    server: GasProcess, cluster: ApiServerDouble
) -> None:
    items = [cluster.get_node("two-cards"), cluster.get_node("cpu-only")]
    big = container(i915="1", memory_max="9Gi")  # more than one card's 8Gi
    reply = server.post(
        "/scheduler/filter",
        {"Pod": pod_body("p"), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None},
    ).json()
    assert reply["Nodes"]["items"] == [items[0]]
    assert reply["NodeNames"] == ["two-cards"]
    assert set(reply["FailedAndUnresolvableNodes"]) == {"cpu-only"}
    reply = server.post(
        "/scheduler/filter",
        {"Pod": pod_body("q", big), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None},
    ).json()
    assert reply["Nodes"]["items"] == []
    assert "memory.max" in reply["FailedAndUnresolvableNodes"]["two-cards"]


def test_full_nodes_come_back_exactly_even_where_orjson_cannot_carry_them(
    server: GasProcess, cluster: ApiServerDouble
) -> None:
    """Integers beyond 64 bits (orjson reads them as floats) and nesting beyond the 254
    levels orjson writes: gas reads and writes those with the stdlib."""
    node = cluster.get_node("two-cards")
    assert node is not None
    deep: Any = []
    for _ in range(600):
        deep = [deep]
    node["metadata"]["annotations"] = {"note": "名前"}
    node["extra"] = {"big": 2**70, "negative": -(2**64), "deep": deep}
    body = {"Pod": pod_body("p"), "Nodes": {"metadata": {}, "items": [node]}}
    response = server.post("/scheduler/filter", body)
    assert response.status_code == 200
    (echoed,) = json.loads(response.content)["Nodes"]["items"]
    assert echoed == node
    assert b"%d" % 2**70 in response.content


def test_filter_rejects_init_container_gpu_requests_clearly(server: GasProcess) -> None:
    pod = pod_body("p")
    pod["spec"]["initContainers"] = [container("setup", i915="1")]
    reply = server.post("/scheduler/filter", {"Pod": pod, "NodeNames": ["two-cards"]}).json()
    assert reply["NodeNames"] == []
    reason = reply["FailedAndUnresolvableNodes"]["two-cards"]
    assert "init container 'setup'" in reason


@pytest.mark.parametrize(
    ("quantity", "words"),
    [
        ("1.5", "not a whole number"),
        ("-1", "negative"),
        ("1e400", "too large"),
        ("lots", "not a valid"),
    ],
)
def test_filter_rejects_bad_quantities_with_a_reason(
    server: GasProcess, quantity: str, words: str
) -> None:
    pod = pod_body("p", container(i915="1", memory_max=quantity))
    reply = server.post("/scheduler/filter", {"Pod": pod, "NodeNames": ["two-cards"]}).json()
    assert reply["NodeNames"] == []
    assert words in reply["FailedAndUnresolvableNodes"]["two-cards"]


# ------------------------------------------------------------------ bad requests


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"Pod": null, "NodeNames": ["two-cards"]}', "Pod must be a Pod object"),
        (b'{"Pod": [], "NodeNames": ["two-cards"]}', "Pod must be a Pod object"),
        (b'{"Pod": {}, "NodeNames": "two-cards"}', "NodeNames must be a list of strings"),
        (b'{"Pod": {}, "NodeNames": [1, 2]}', "NodeNames must be a list of strings"),
        (b'{"Pod": {}, "Nodes": {"items": "x"}}', "Nodes must be a NodeList"),
        (b'{"Pod": {}}', "neither NodeNames nor Nodes"),
        (b'{"Pod": {}, "NodeNames": [NaN]}', "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        # JSON on the wire is UTF-8: the stdlib decoder gas used once guessed UTF-16 and
        # read lone surrogates into names that could not be written back.
        ('{"Pod": {}, "NodeNames": ["a"]}'.encode("utf-16"), "not valid JSON"),
        (b'{"Pod": {}, "NodeNames": ["\\ud800"]}', "lone UTF-16 surrogate"),
    ],
)
def test_malformed_filter_requests_get_400_with_a_reason(
    server: GasProcess, body: bytes, words: str
) -> None:
    response = server.session.post(
        server.url + "/scheduler/filter",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400
    assert words in response.json()["Error"]
    assert "%" not in response.json()["Error"]


@pytest.mark.parametrize(
    "body",
    [
        {"PodName": "p", "PodNamespace": "default", "PodUID": "u"},
        {"PodName": "p", "PodNamespace": "default", "PodUID": 7, "Node": "two-cards"},
        {"PodName": "", "PodNamespace": "default", "PodUID": "u", "Node": "two-cards"},
    ],
)
def test_malformed_bind_requests_get_400(server: GasProcess, body: dict[str, Any]) -> None:
    response = server.post("/scheduler/bind", body)
    assert response.status_code == 400
    assert "ExtenderBindingArgs" in response.json()["Error"]


def test_unknown_route_wrong_method_and_no_redirects(server: GasProcess) -> None:
    assert server.post("/scheduler/nope", {}).status_code == 404
    trailing = server.session.post(
        server.url + "/scheduler/filter/", json={}, allow_redirects=False, timeout=5
    )
    assert trailing.status_code == 404
    wrong = server.session.get(server.url + "/scheduler/filter", timeout=5)
    assert wrong.status_code == 405
    assert wrong.json()["Error"].startswith("405")


def test_oversized_body_gets_413_without_being_read(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    """The declared size alone is refused: gas answers before the body is sent."""
    context = ssl.create_default_context(cafile=tls_files.ca)
    context.load_cert_chain(tls_files.client_cert, tls_files.client_key)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        sock.sendall(
            b"POST /scheduler/filter HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert "413" in json.loads(body)["Error"]
    assert server.session.get(server.url + "/healthz", timeout=5).status_code == 200


def test_health_and_readiness(server: GasProcess) -> None:
    assert server.get_json("/healthz") == {"status": "ok"}
    assert server.get_json("/readyz") == {"status": "ready"}


def test_clients_without_a_certificate_are_refused(server: GasProcess, tls_files: TLSFiles) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url + "/healthz", verify=tls_files.ca, timeout=5)


# ------------------------------------------------------------------ bind


def add_pending(cluster: ApiServerDouble, name: str, *containers: dict[str, Any]) -> dict[str, Any]:
    return cluster.add_pod(gpu_pod(name, *containers))


def test_bind_writes_annotations_and_node_in_one_binding(
    server: GasProcess, cluster: ApiServerDouble
) -> None:
    pod = add_pending(cluster, "bind-ok", container(i915="2", memory_max="8Gi"))
    reply = server.post("/scheduler/filter", {"Pod": pod, "NodeNames": ["four-cards"]}).json()
    assert reply["NodeNames"] == ["four-cards"]
    cluster.clear_requests()
    before = time.time_ns()
    assert server.bind(pod, "four-cards") == ""
    stored = cluster.get_pod("default", "bind-ok")
    assert stored is not None
    assert stored["spec"]["nodeName"] == "four-cards"
    annotations = stored["metadata"]["annotations"]
    assert annotations["gas-container-cards"] == "card0,card1"
    assert before <= int(annotations["gas-ts"]) <= time.time_ns()
    # One API write: the Binding; no separate annotation patch, and no pod read (the pod
    # came with the filter call).
    writes = [(m, p) for m, p in cluster.requests if m != "GET" and not p.endswith("/events")]
    assert writes == [("POST", "/api/v1/namespaces/default/pods/bind-ok/binding")]
    wait_for(lambda: ledger_of(server)["pods"][pod["metadata"]["uid"]]["state"] == "bound")


def test_bind_without_a_filter_call_reads_the_pod(
    server: GasProcess, cluster: ApiServerDouble
) -> None:
    pod = add_pending(cluster, "bind-nofilter")
    cluster.clear_requests()
    assert server.bind(pod, "two-cards") == ""
    assert ("GET", "/api/v1/namespaces/default/pods/bind-nofilter") in cluster.requests
    stored = cluster.get_pod("default", "bind-nofilter")
    assert stored is not None and stored["spec"]["nodeName"] == "two-cards"


def test_bind_with_a_wrong_uid_writes_nothing(server: GasProcess, cluster: ApiServerDouble) -> None:
    pod = add_pending(cluster, "bind-uid")
    cluster.clear_requests()
    error = server.bind(pod, "two-cards", uid="not-the-uid")
    assert "has UID" in error and "not-the-uid" in error
    assert cluster.count_requests("POST", r"/binding$") == 0
    assert cluster.get_pod("default", "bind-uid")["spec"].get("nodeName") is None  # type: ignore[index]


def test_bind_of_a_missing_pod(server: GasProcess) -> None:
    ghost = {"metadata": {"name": "gh%st", "namespace": "default", "uid": "u"}}
    error = server.bind(ghost, "two-cards")
    assert "does not exist" in error
    assert "%" not in error


def test_bind_that_no_longer_fits_writes_nothing(
    server: GasProcess, cluster: ApiServerDouble
) -> None:
    pod = add_pending(cluster, "bind-big", container(i915="1", memory_max="9Gi"))
    cluster.clear_requests()
    error = server.bind(pod, "two-cards")
    assert "memory.max" in error
    assert cluster.count_requests("POST", r"/binding$") == 0
    assert pod["metadata"]["uid"] not in ledger_of(server)["pods"]


def test_binding_refused_by_the_api_server_releases_the_cards(
    server: GasProcess, cluster: ApiServerDouble
) -> None:
    pod = add_pending(cluster, "bind-taken")
    server.post("/scheduler/filter", {"Pod": pod, "NodeNames": ["two-cards"]})
    cluster.patch_pod("default", "bind-taken", {"spec": {"nodeName": "elsewhere"}})
    error = server.bind(pod, "two-cards")
    assert "already assigned" in error
    assert pod["metadata"]["uid"] not in ledger_of(server)["pods"]


def test_not_synced_gas_answers_503(tmp_path: Path, tls_files: TLSFiles) -> None:
    """The API server is unreachable: gas is alive but not ready, and says so."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: c\n  cluster: {{server: 'http://127.0.0.1:{free_port()}'}}\n"
        "users:\n- name: u\n  user: {token: t}\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
    )
    process = GasProcess(["--kubeConfig", str(kubeconfig)], tmp_path / "gas.log", tls_files)
    try:
        process.wait_status("/healthz", 200)
        assert process.session.get(process.url + "/readyz", timeout=5).status_code == 503
        response = process.post("/scheduler/filter", {"Pod": pod_body("p"), "NodeNames": ["a"]})
        assert response.status_code == 503
        assert response.json()["Error"] == "gas is not synced"
        response = process.post(
            "/scheduler/bind",
            {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "a"},
        )
        assert response.status_code == 503
    finally:
        process.stop()


# ------------------------------------------------------------------ both ways in


def raw_post(
    server: GasProcess, tls_files: TLSFiles, path: str, body: bytes, connection: bool
) -> tuple[int, list[tuple[str, str]], bytes]:
    """POST as kube-scheduler writes it, which gas answers without gunicorn's parser, or
    with a Connection field, which goes through gunicorn and the WSGI app: the status,
    every header but Date in order, and the body."""
    context = ssl.create_default_context(cafile=tls_files.ca)
    context.load_cert_chain(tls_files.client_cert, tls_files.client_key)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    headers = {"Content-Type": "application/json"}
    if connection:
        headers["Connection"] = "keep-alive"
    try:
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    return response.status, [(k, v) for k, v in response.getheaders() if k != "Date"], data


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/scheduler/filter", {"Pod": pod_body("p"), "NodeNames": ["two-cards", "ghost"]}),
        ("/scheduler/prioritize", {"Pod": pod_body("p"), "NodeNames": ["four-cards"]}),
        ("/scheduler/preempt", {"Pod": pod_body("p"), "NodeNameToMetaVictims": {}}),
        ("/scheduler/bind", {"PodName": "gone", "PodNamespace": "default", "PodUID": "u"}),
        ("/scheduler/filter", b"{not json"),
        ("/scheduler/filter", b"[]"),
        ("/scheduler/filter", b"x" * (MAX_BODY + 1)),
        ("/scheduler/nothing", b"{}"),
    ],
)
def test_a_post_gets_the_same_answer_and_count_whichever_way_it_is_read(
    server: GasProcess, tls_files: TLSFiles, path: str, body: object
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    before = server.session.get(server.url + "/metrics", timeout=5).text
    direct = raw_post(server, tls_files, path, data, connection=False)
    through_gunicorn = raw_post(server, tls_files, path, data, connection=True)
    after = server.session.get(server.url + "/metrics", timeout=5).text
    assert direct == through_gunicorn
    _, headers, _ = direct
    assert ("Content-Type", "application/json") in headers
    verb = path.rsplit("/", 1)[-1]
    if verb in ("filter", "prioritize", "preempt", "bind"):
        counted = total(after, "gas_requests_total", verb=verb)
        assert counted - total(before, "gas_requests_total", verb=verb) == 2


def test_a_verbs_post_is_answered_in_one_write_whatever_its_fields(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    # Seen from outside by how the answer is written: head and body in one TLS record
    # (a TLS read returns one record at most), with or without a Connection field.
    context = ssl.create_default_context(cafile=tls_files.ca)
    context.load_cert_chain(tls_files.client_cert, tls_files.client_key)
    body = json.dumps({"Pod": pod_body("p"), "NodeNames": ["two-cards"]}).encode()
    for extra in (b"", b"Connection: keep-alive\r\n"):
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(
                b"POST /scheduler/filter HTTP/1.1\r\nHost: gas\r\n"
                + extra
                + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
            first = conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b'"Error":""}')
        assert b"\r\nConnection: keep-alive\r\n" in first
