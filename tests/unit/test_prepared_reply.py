"""The prepared requests' answer reader (gas/kubeapi/prepared.py `_read_reply`, httptools)
reads what the standard library's http.client reads, which it replaced: the same status,
reason, body and decision to close the connection, whatever pieces the answer arrives in,
and the same exceptions for an answer cut short or too large."""

from __future__ import annotations

import http.client
import io
import itertools

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gas.kubeapi.prepared import Reply, _read_reply

# The head kube-apiserver sends with a created Binding.
KUBE_HEAD = (
    b"HTTP/1.1 201 Created\r\n"
    b"Audit-Id: 2f0c5b6e-4f2a-4b8a-9c55-1c8e3c1f9a11\r\n"
    b"Cache-Control: no-cache, private\r\n"
    b"Content-Type: application/json\r\n"
    b"X-Kubernetes-Pf-Flowschema-Uid: 8e1b7c1a-6f3a-4a55-9d0e-3c0f5b2b7a10\r\n"
    b"X-Kubernetes-Pf-Prioritylevel-Uid: 5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d\r\n"
    b"Date: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
)
STATUS = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":201}'

ANSWERS = {
    "kube-apiserver": KUBE_HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(STATUS), STATUS),
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nTrailer: x\r\n\r\n",
    "connection close": b"HTTP/1.1 409 Conflict\r\nConnection: close\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    "closed by its end": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
    "no content": b"HTTP/1.1 204 No Content\r\n\r\n",
    "continue first": b"HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    "no reason": b"HTTP/1.1 500 \r\nContent-Length: 0\r\n\r\n",
    "reason with spaces": b"HTTP/1.1 503 Service  Unavailable \r\nContent-Length: 1\r\n\r\nx",
    "1.0 closes": b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    "1.0 keep-alive": b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx",
    "1.0 keep-alive header": b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\n"
    b"Content-Length: 1\r\n\r\nx",
    "1.0 proxy keep-alive": b"HTTP/1.0 200 OK\r\nProxy-Connection: keep-alive\r\n"
    b"Content-Length: 1\r\n\r\nx",
    "first connection header": b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n"
    b"Connection: close\r\nContent-Length: 1\r\n\r\nx",
    "mixed case": b"HTTP/1.1 200 OK\r\ncOnNeCtIoN: CLOSE\r\ncontent-LENGTH: 2\r\n\r\nok",
}


class _Socket:
    """An answer as a socket hands it over: `pieces`, then the connection's end."""

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = list(pieces)
        self._whole = b"".join(pieces)

    def recv(self, size: int) -> bytes:
        if not self._pieces:
            return b""
        piece = self._pieces.pop(0)
        if len(piece) > size:
            self._pieces.insert(0, piece[size:])
            piece = piece[:size]
        return piece

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._whole))


def stdlib(answer: bytes) -> tuple[Reply, bool]:
    """The answer as http.client read it (prepared.py's reader before httptools)."""
    response = http.client.HTTPResponse(_Socket([answer]), method="POST")  # type: ignore[arg-type]
    response.begin()
    data = response.read()
    return Reply(response.status, response.reason or "", data), response.will_close


def pieces(answer: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(answer), *(c % (len(answer) + 1) for c in cuts)})
    return [answer[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_answers_read_as_http_client_reads_them(name: str) -> None:
    answer = ANSWERS[name]
    assert _read_reply(_Socket([answer])) == stdlib(answer)


def test_the_api_servers_answer_keeps_the_connection() -> None:
    reply, will_close = _read_reply(_Socket([ANSWERS["kube-apiserver"]]))
    assert reply == Reply(201, "Created", STATUS)
    assert not will_close


@given(
    name=st.sampled_from(sorted(ANSWERS)),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_an_answer_in_any_pieces_reads_the_same(name: str, cuts: list[int]) -> None:
    answer = ANSWERS[name]
    assert _read_reply(_Socket(pieces(answer, cuts))) == stdlib(answer)


def test_an_answer_byte_by_byte_reads_the_same() -> None:
    answer = ANSWERS["continue first"]
    assert _read_reply(_Socket([bytes([b]) for b in answer])) == stdlib(answer)


def test_the_bytes_after_a_complete_answer_are_not_waited_for() -> None:
    class NoMore(_Socket):
        def recv(self, size: int) -> bytes:
            if not self._pieces:
                raise AssertionError("read past a complete answer")
            return super().recv(size)

    answer = ANSWERS["kube-apiserver"]
    assert _read_reply(NoMore([answer]))[0].status == 201


def test_nothing_at_all_is_a_remote_disconnect_as_in_http_client() -> None:
    with pytest.raises(http.client.RemoteDisconnected) as ours:
        _read_reply(_Socket([]))
    with pytest.raises(http.client.RemoteDisconnected) as theirs:
        stdlib(b"")
    assert str(ours.value) == str(theirs.value)


def test_only_a_continue_is_a_remote_disconnect() -> None:
    with pytest.raises(http.client.RemoteDisconnected):
        _read_reply(_Socket([b"HTTP/1.1 100 Continue\r\n\r\n"]))


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n12345",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
)
def test_a_body_cut_short_is_an_incomplete_read_as_in_http_client(answer: bytes) -> None:
    with pytest.raises(http.client.IncompleteRead) as ours:
        _read_reply(_Socket(pieces(answer, [20, 41])))
    with pytest.raises(http.client.IncompleteRead) as theirs:
        stdlib(answer)
    assert str(ours.value) == str(theirs.value)


def test_a_head_cut_short_is_an_incomplete_read() -> None:
    with pytest.raises(http.client.IncompleteRead):
        _read_reply(_Socket([b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"]))


def test_too_many_headers_are_refused_as_in_http_client() -> None:
    answer = b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 101 + b"Content-Length: 0\r\n\r\n"
    with pytest.raises(http.client.HTTPException) as ours:
        _read_reply(_Socket([answer]))
    with pytest.raises(http.client.HTTPException) as theirs:
        stdlib(answer)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    ("answer", "line"),
    [
        (b"HTTP/1.1 200 " + b"x" * 65537 + b"\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nX-A: " + b"x" * 65537 + b"\r\n\r\n", "header line"),
    ],
)
def test_an_overlong_line_is_refused_as_in_http_client(answer: bytes, line: str) -> None:
    with pytest.raises(http.client.LineTooLong, match=line):
        _read_reply(_Socket([answer]))
    with pytest.raises(http.client.LineTooLong, match=line):
        stdlib(answer)


@pytest.mark.parametrize(
    "answer",
    [
        b"SMTP ready\r\n\r\n",
        # http.client read these bodies until the connection's end; they now fail, as an
        # answer whose framing cannot be trusted.
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nbody",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\nbody",
    ],
)
def test_a_malformed_answer_raises(answer: bytes) -> None:
    with pytest.raises(httptools.HttpParserError):
        _read_reply(_Socket([answer]))
