"""The bind path's prepared requests (gas/kubeapi/prepared.py) against real servers: the
Binding is one POST that the API server applies, errors map to rejected or uncertain as
the generated client's did, pod reads answer None only for 404, and the requests carry
the configuration's credentials (refreshed tokens, client certificate) over its TLS
settings on kept-alive connections.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from gas.cluster.kube import KubeCluster, load_api_client
from gas.cluster.protocol import BindRejected, BindUncertain, ClusterError
from gas.core.ledger import Ledger
from gas.kubeapi.prepared import CONNECT_ATTEMPTS, CREDENTIALS_SECONDS, PreparedApi
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import TLSFiles

ANNOTATIONS = {"gas-ts": "1", "gas-container-cards": "card0"}


def pending_pod(name: str = "p", uid: str = "uid-p") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }


@pytest.fixture
def cluster(apiserver: ApiServerDouble, kubeconfig: str) -> Iterator[KubeCluster]:
    apiserver.add_node({"metadata": {"name": "n1"}})
    api_client = load_api_client(kubeconfig)
    yield KubeCluster(Ledger(), api_client)
    api_client.close()


def test_bind_is_one_post_the_api_server_applies(
    apiserver: ApiServerDouble, cluster: KubeCluster
) -> None:
    apiserver.add_pod(pending_pod())
    apiserver.clear_requests()
    cluster.bind(pending_pod(), "n1", ANNOTATIONS)
    assert apiserver.requests == [("POST", "/api/v1/namespaces/default/pods/p/binding")]
    bound = apiserver.get_pod("default", "p")
    assert bound is not None
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == ANNOTATIONS


@pytest.mark.parametrize(
    ("fault", "error", "words"),
    [
        (("status", 429), BindUncertain, "429 the server has received too many requests"),
        (("status", 500), BindUncertain, "500 Internal error occurred: injected fault"),
        (("status", 503), BindUncertain, "503 the server is currently unable"),
        (("status", 403), BindRejected, "403 "),
        (("close", None), BindUncertain, "binding default/p to n1: "),
    ],
)
def test_bind_failures_are_rejected_or_uncertain(
    apiserver: ApiServerDouble,
    cluster: KubeCluster,
    fault: tuple[str, float | None],
    error: type[Exception],
    words: str,
) -> None:
    apiserver.add_pod(pending_pod())
    apiserver.faults.add("POST", "/binding$", fault)
    with pytest.raises(error) as raised:
        cluster.bind(pending_pod(), "n1", ANNOTATIONS)
    assert str(raised.value).startswith("binding default/p to n1: ")
    assert words in str(raised.value)
    pod = apiserver.get_pod("default", "p")
    assert pod is not None and not pod["spec"].get("nodeName")


def test_bind_refusals_carry_the_api_servers_reason(
    apiserver: ApiServerDouble, cluster: KubeCluster
) -> None:
    with pytest.raises(BindRejected, match='404 pods "ghost" not found'):
        cluster.bind(pending_pod("ghost"), "n1", ANNOTATIONS)
    apiserver.add_pod(pending_pod())
    # A namesake: the UID in the Binding is a precondition.
    with pytest.raises(BindRejected, match=r"409 .*UID"):
        cluster.bind(pending_pod(uid="uid-other"), "n1", ANNOTATIONS)
    cluster.bind(pending_pod(), "n1", ANNOTATIONS)
    with pytest.raises(BindRejected, match=r'409 .*already assigned to node "n1"'):
        cluster.bind(pending_pod(), "n1", ANNOTATIONS)


def test_get_pod_answers_none_only_when_the_pod_is_gone(
    apiserver: ApiServerDouble, cluster: KubeCluster
) -> None:
    apiserver.add_pod(pending_pod())
    pod = cluster.get_pod("default", "p")
    assert pod is not None and pod["metadata"]["uid"] == "uid-p"
    assert cluster.get_pod("default", "ghost") is None
    apiserver.faults.add("GET", "/pods/p$", ("status", 500))
    with pytest.raises(ClusterError, match="reading pod default/p: 500 Internal error"):
        cluster.get_pod("default", "p")
    # Every time: urllib3 retries a read whose connection broke.
    apiserver.faults.add("GET", "/pods/p$", ("close", None), times=None)
    with pytest.raises(ClusterError, match="reading pod default/p: "):
        cluster.get_pod("default", "p")


def test_names_are_percent_encoded_in_the_path(
    apiserver: ApiServerDouble, cluster: KubeCluster
) -> None:
    # Names come from the scheduler's request: one holding a slash must not reach
    # another resource.
    with pytest.raises(BindRejected):
        cluster.bind(pending_pod("a/b"), "n1", ANNOTATIONS)
    assert ("POST", "/api/v1/namespaces/default/pods/a%2Fb/binding") in apiserver.requests


# ------------------------------------------------------------ credentials and TLS


@dataclass
class Seen:
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    client_names: list[str] = field(default_factory=list)
    connections: int = 0
    revoked: set[str] = field(default_factory=set)  # tokens answered 401
    close_idle: bool = False  # close each connection after its answer, saying nothing
    drop_from: int = 0  # a connection's requests from this one on are read, never answered
    closed: threading.Event = field(default_factory=threading.Event)


class _Recorder(BaseHTTPRequestHandler):
    """Records each request and answers as the API server does on success."""

    protocol_version = "HTTP/1.1"  # kept-alive connections, as the API server's
    seen: Seen

    def setup(self) -> None:
        super().setup()
        self.seen.connections += 1
        peer = cast(ssl.SSLSocket, self.connection).getpeercert() or {}
        subject = cast(tuple[tuple[tuple[str, str], ...], ...], peer.get("subject", ()))
        for rdn in subject:
            self.seen.client_names += [value for key, value in rdn if key == "commonName"]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _headers(self) -> dict[str, str]:
        return {key.lower(): value for key, value in self.headers.items()}

    def finish(self) -> None:
        super().finish()
        self.seen.closed.set()

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        self.served = getattr(self, "served", 0) + 1
        if self.seen.drop_from and self.served >= self.seen.drop_from:
            self.close_connection = True
            return
        if self.seen.close_idle:
            self.close_connection = True
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.requests.append(("POST", self.path, self._headers(), body))
        if self._headers().get("authorization") in self.seen.revoked:
            self._answer(401, {"kind": "Status", "status": "Failure", "code": 401})
            return
        self._answer(201, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def do_GET(self) -> None:
        self.seen.requests.append(("GET", self.path, self._headers(), b""))
        self._answer(200, pending_pod())


@pytest.fixture
def recorder(tls_files: TLSFiles) -> Iterator[tuple[int, Seen]]:
    """An HTTPS server that requires a client certificate from the test CA."""
    seen = Seen()
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files.server_cert, tls_files.server_key)
    context.load_verify_locations(tls_files.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def rotating_configuration(port: int, tls_files: TLSFiles) -> client.Configuration:
    """The recorder's address and TLS files, and a token that changes each time the
    configuration's refresh hook runs: token-1, token-2, ..."""
    configuration = client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.ssl_ca_cert = tls_files.ca
    configuration.cert_file = tls_files.client_cert
    configuration.key_file = tls_files.client_key
    configuration.api_key["BearerToken"] = "token-0"
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    rotations = iter(range(1, 100))

    def refresh(config: Any) -> None:
        # As the exec-plugin and service-account loaders do: a new token when it expires.
        config.api_key["BearerToken"] = f"token-{next(rotations)}"

    cast(Any, configuration).refresh_api_key_hook = refresh
    return configuration


def test_requests_carry_refreshed_tokens_and_the_client_certificate(
    recorder: tuple[int, Seen], tls_files: TLSFiles, tmp_path: Path
) -> None:
    port, seen = recorder
    api_client = client.ApiClient(rotating_configuration(port, tls_files))
    try:
        cluster = KubeCluster(Ledger(), api_client)
        cluster.bind(pending_pod(), "n1", ANNOTATIONS)
        assert cluster.get_pod("default", "p") == pending_pod()
        cluster.bind(pending_pod("q", "uid-q"), "n2", ANNOTATIONS)
    finally:
        api_client.close()

    assert [(m, p) for m, p, _, _ in seen.requests] == [
        ("POST", "/api/v1/namespaces/default/pods/p/binding"),
        ("GET", "/api/v1/namespaces/default/pods/p"),
        ("POST", "/api/v1/namespaces/default/pods/q/binding"),
    ]
    tokens = [headers["authorization"] for _, _, headers, _ in seen.requests]
    # Read through the refresh hook, never the token the configuration started with.
    assert tokens[0] == "Bearer token-1"
    assert all(t.startswith("Bearer token-") and t != "Bearer token-0" for t in tokens)
    assert seen.connections == 1  # one TLS handshake: the pool kept the connection
    assert seen.client_names == ["kube-scheduler"]
    _, _, headers, body = seen.requests[0]
    assert headers["host"] == f"127.0.0.1:{port}"
    assert headers["accept"] == "application/json"
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(body))
    assert headers["user-agent"] == api_client.user_agent
    assert json.loads(body) == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "p",
            "namespace": "default",
            "uid": "uid-p",
            "annotations": ANNOTATIONS,
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }


def test_credentials_are_read_again_each_second_and_after_a_401(
    recorder: tuple[int, Seen], tls_files: TLSFiles
) -> None:
    port, seen = recorder
    api_client = client.ApiClient(rotating_configuration(port, tls_files))
    now = [100.0]
    api = PreparedApi(api_client, clock=lambda: now[0])

    def bind(name: str) -> int:
        return api.create_namespaced_pod_binding(name, "default", b"{}", (5, 5)).status

    try:
        assert bind("a") == 201
        now[0] += CREDENTIALS_SECONDS / 2
        assert bind("b") == 201  # the token read for "a"
        now[0] += CREDENTIALS_SECONDS / 2
        assert bind("c") == 201  # read again: a second has passed
        # The API server stops taking the token in use: the 401 makes gas read the
        # credentials at once, and the request goes again with the new token.
        seen.revoked.add("Bearer token-2")
        assert bind("d") == 201
        # A 401 on credentials just read is the API server's answer: sent once.
        seen.revoked.add("Bearer token-4")
        now[0] += CREDENTIALS_SECONDS
        assert bind("e") == 401
    finally:
        api_client.close()
    sent = [(path.split("/")[-2], h["authorization"]) for _, path, h, _ in seen.requests]
    assert sent == [
        ("a", "Bearer token-1"),
        ("b", "Bearer token-1"),
        ("c", "Bearer token-2"),
        ("d", "Bearer token-2"),
        ("d", "Bearer token-3"),
        ("e", "Bearer token-4"),
    ]
    assert seen.connections == 1


def test_requests_go_through_the_configured_proxy() -> None:
    # The recorder, in plain HTTP, stands as the proxy: a request for the API server's
    # address reaches it in absolute form, as a forward proxy receives it.
    seen = Seen()
    handler = type("Proxy", (_Recorder,), {"seen": seen, "setup": BaseHTTPRequestHandler.setup})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = "http://apiserver.invalid:6443/prefix"
    configuration.proxy = f"http://127.0.0.1:{server.server_address[1]}"
    api_client = client.ApiClient(configuration)
    try:
        reply = PreparedApi(api_client).create_namespaced_pod_binding("p", "default", b"{}", (5, 5))
    finally:
        api_client.close()
        server.shutdown()
        server.server_close()
    assert reply.status == 201
    assert [(m, p) for m, p, _, _ in seen.requests] == [
        ("POST", "http://apiserver.invalid:6443/prefix/api/v1/namespaces/default/pods/p/binding")
    ]


def test_a_host_with_a_path_keeps_it(recorder: tuple[int, Seen], tls_files: TLSFiles) -> None:
    # As behind an API gateway that serves several clusters under their own paths.
    port, seen = recorder
    configuration = rotating_configuration(port, tls_files)
    configuration.host = f"https://127.0.0.1:{port}/clusters/c-1/"
    api_client = client.ApiClient(configuration)
    try:
        api = PreparedApi(api_client)
        assert api.create_namespaced_pod_binding("p", "default", b"{}", (5, 5)).status == 201
        assert api.read_namespaced_pod("p", "default", (5, 5)).status == 200
    finally:
        api_client.close()
    assert [(m, p) for m, p, _, _ in seen.requests] == [
        ("POST", "/clusters/c-1/api/v1/namespaces/default/pods/p/binding"),
        ("GET", "/clusters/c-1/api/v1/namespaces/default/pods/p"),
    ]


# ------------------------------------------------------------ connections


def test_a_connection_the_api_server_closed_while_idle_is_opened_again(
    recorder: tuple[int, Seen], tls_files: TLSFiles
) -> None:
    port, seen = recorder
    seen.close_idle = True  # as after its idle timeout, without a Connection: close
    api_client = client.ApiClient(rotating_configuration(port, tls_files))
    try:
        api = PreparedApi(api_client)
        for name in ("a", "b", "c"):
            seen.closed.clear()
            assert api.create_namespaced_pod_binding(name, "default", b"{}", (5, 5)).status == 201
            assert seen.closed.wait(5)
    finally:
        api_client.close()
    # Each POST sent once, each on a connection of its own.
    assert [p.split("/")[-2] for _, p, _, _ in seen.requests] == ["a", "b", "c"]
    assert seen.connections == 3


def test_a_lost_connection_resends_a_get_but_never_a_post(
    recorder: tuple[int, Seen], tls_files: TLSFiles
) -> None:
    port, seen = recorder
    seen.drop_from = 2
    api_client = client.ApiClient(rotating_configuration(port, tls_files))
    try:
        api = PreparedApi(api_client)
        assert api.create_namespaced_pod_binding("a", "default", b"{}", (5, 5)).status == 201
        # Read, then the connection lost before an answer: a read is sent again.
        assert api.read_namespaced_pod("p", "default", (5, 5)).status == 200
        assert seen.connections == 2
        # The same on the new connection for a Binding, which may have been applied: it
        # is not sent again, and the failure is the caller's to judge.
        with pytest.raises((OSError, http.client.HTTPException)):
            api.create_namespaced_pod_binding("b", "default", b"{}", (5, 5))
        assert api.create_namespaced_pod_binding("c", "default", b"{}", (5, 5)).status == 201
        # Every request lost: a read is sent twice, no more.
        seen.drop_from = 1
        with pytest.raises((OSError, http.client.HTTPException)):
            api.read_namespaced_pod("q", "default", (5, 5))
    finally:
        api_client.close()
    assert [(m, p.rsplit("/", 2)[-2:]) for m, p, _, _ in seen.requests] == [
        ("POST", ["a", "binding"]),
        ("GET", ["pods", "p"]),
        ("GET", ["pods", "p"]),
        ("POST", ["b", "binding"]),
        ("POST", ["c", "binding"]),
        ("GET", ["pods", "q"]),
        ("GET", ["pods", "q"]),
    ]
    assert seen.connections == 4


def test_a_failed_connect_is_tried_again_then_reported(tls_files: TLSFiles) -> None:
    # Accepts and hangs up at once: every TLS handshake fails, nothing is ever sent.
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    api_client = client.ApiClient(rotating_configuration(listener.getsockname()[1], tls_files))
    try:
        with pytest.raises(Exception) as raised:
            PreparedApi(api_client).create_namespaced_pod_binding("a", "default", b"{}", (5, 5))
    finally:
        api_client.close()
        listener.close()
    assert not isinstance(raised.value, AssertionError)
    assert len(accepted) == CONNECT_ATTEMPTS


def test_a_credential_with_a_line_break_is_refused_before_anything_is_sent(
    recorder: tuple[int, Seen], tls_files: TLSFiles
) -> None:
    port, seen = recorder
    configuration = rotating_configuration(port, tls_files)
    cast(Any, configuration).refresh_api_key_hook = lambda config: config.api_key.update(
        BearerToken="t\r\nX-Injected: 1"
    )
    api_client = client.ApiClient(configuration)
    try:
        with pytest.raises(ValueError, match="line break"):
            PreparedApi(api_client).create_namespaced_pod_binding("a", "default", b"{}", (5, 5))
    finally:
        api_client.close()
    assert seen.requests == []
