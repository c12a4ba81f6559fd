"""A body over --maxRequestBytes: gas answers 413 without waiting for the body, then reads
and drops the rest of it (up to a bound), so a client still sending gets to finish and read
the answer, and the connection serves its next request."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import gas_serving
from tests.support.objects import gpu_node, gpu_pod

MAX_BODY = 256 * 1024


@pytest.fixture(scope="module")
def server(tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GasProcess]:
    with ApiServerDouble() as api:
        api.add_node(gpu_node("two-cards", "0.1", i915="2", memory_max="16Gi"))
        directory = tmp_path_factory.mktemp("gas-413")
        args = ["--maxRequestBytes", str(MAX_BODY)]
        with gas_serving(api, directory, tls_files, args, ["two-cards"]) as process:
            yield process


def _connect(server: GasProcess, tls_files: TLSFiles) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=tls_files.ca)
    context.load_cert_chain(tls_files.client_cert, tls_files.client_key)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _read_answer(conn: ssl.SSLSocket) -> tuple[str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        assert more, f"closed before the answer's head: {data!r}"
        data += more
    head, body = data.split(b"\r\n\r\n", 1)
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers["content-length"]):
        more = conn.recv(65536)
        assert more, "closed in the answer's body"
        body += more
    return status, headers, body


def _head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: gas\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("connection", ["", "Connection: keep-alive\r\n"])
def test_a_client_still_sending_an_oversized_body_finishes_and_reads_the_413(
    server: GasProcess, tls_files: TLSFiles, connection: str
) -> None:
    """The race made certain: the client sends the head, reads the 413 that comes before
    the body, then sends the body slowly. gas must keep reading it: a server that stops
    reading and closes makes the client's writes fail (reset, or TLS EOF), and a client
    that writes its whole body before reading (Python's http.client) never sees the 413."""
    length = MAX_BODY + 300 * 1024
    with _connect(server, tls_files) as conn:
        head = _head("/scheduler/filter", length)
        conn.sendall(head.replace(b"Host: gas\r\n", b"Host: gas\r\n" + connection.encode()))
        status, headers, body = _read_answer(conn)
        assert status == "HTTP/1.1 413 REQUEST ENTITY TOO LARGE"
        assert "413" in json.loads(body)["Error"]
        piece = 16 * 1024
        for start in range(0, length, piece):
            conn.sendall(b"x" * min(piece, length - start))
            time.sleep(0.005)
        # The body was read to its end: the connection takes the next request.
        assert headers["connection"] == "keep-alive"
        request = json.dumps({"Pod": gpu_pod("p"), "NodeNames": ["two-cards"]}).encode()
        conn.sendall(_head("/scheduler/filter", len(request)) + request)
        status, _, body = _read_answer(conn)
        assert status == "HTTP/1.1 200 OK", body
        assert json.loads(body)["NodeNames"] == ["two-cards"]


def test_a_body_far_over_the_limit_is_answered_and_the_connection_closed(
    server: GasProcess, tls_files: TLSFiles
) -> None:
    """Past what gas drains (twice the limit) it stops reading and closes: the client
    has its 413 when it reads before it has sent everything."""
    with _connect(server, tls_files) as conn:
        conn.sendall(_head("/scheduler/filter", 64 * MAX_BODY))
        status, _, _ = _read_answer(conn)
        assert status == "HTTP/1.1 413 REQUEST ENTITY TOO LARGE"
        sent = 0
        with pytest.raises(OSError):
            while sent < 64 * MAX_BODY:
                conn.sendall(b"x" * 65536)
                sent += 65536
