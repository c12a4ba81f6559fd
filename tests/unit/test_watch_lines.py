"""The watch's events read from a urllib3 response (gas/cluster/kube.py `_json_lines`):
chunks are read whole and split into lines by gas, so an event split over chunks, several
events in one chunk, blank lines and a last line without its newline all read as the
events sent, whether the body is chunked or not."""

from __future__ import annotations

import http.client
import io
import itertools
from typing import Any

import orjson
import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st

from gas.cluster.kube import _json_lines

EVENTS: list[dict[str, Any]] = [
    {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "1"}}},
    {"type": "MODIFIED", "object": {"metadata": {"name": "b\u00e9", "resourceVersion": "2"}}},
    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "3"}}},
    {"type": "DELETED", "object": {"metadata": {"name": "c", "resourceVersion": "4"}}},
]
STREAM = b"".join(orjson.dumps(event) + b"\n" for event in EVENTS)


class _Socket:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))


def response(body: bytes, chunks: list[bytes] | None) -> urllib3.HTTPResponse:
    """A urllib3 response over http.client's, as the client's pool makes one: `chunks` as
    the chunks of a chunked body, else `body` to the connection's end."""
    if chunks is None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        data = head + body
    else:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        framed = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks if chunk)
        data = head + b"Transfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"
    raw = http.client.HTTPResponse(_Socket(data), method="GET")  # type: ignore[arg-type]
    raw.begin()
    return urllib3.HTTPResponse(
        body=raw,
        headers=dict(raw.getheaders()),
        status=raw.status,
        preload_content=False,
        original_response=raw,
    )


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_one_event_a_chunk() -> None:
    chunks = [orjson.dumps(event) + b"\n" for event in EVENTS]
    resp = response(b"", chunks)
    assert resp.chunked
    assert list(_json_lines(resp)) == EVENTS


def test_several_events_in_one_chunk() -> None:
    assert list(_json_lines(response(b"", [STREAM]))) == EVENTS


def test_an_event_split_over_chunks() -> None:
    cut = len(orjson.dumps(EVENTS[0])) // 2
    chunks = [STREAM[:cut], STREAM[cut : cut + 3], STREAM[cut + 3 :]]
    assert list(_json_lines(response(b"", chunks))) == EVENTS


def test_a_chunk_ending_at_a_newline_and_the_next_starting_with_one() -> None:
    first = orjson.dumps(EVENTS[0])
    chunks = [first, b"\n", STREAM[len(first) + 1 :]]
    assert list(_json_lines(response(b"", chunks))) == EVENTS


def test_a_last_line_without_its_newline() -> None:
    body = STREAM.rstrip(b"\n")
    assert list(_json_lines(response(b"", split(body, [10, 70])))) == EVENTS
    assert list(_json_lines(response(body, None))) == EVENTS


def test_blank_lines_and_carriage_returns_are_skipped() -> None:
    body = b"\n\r\n" + STREAM.replace(b"\n", b"\r\n  \n") + b"  "
    assert list(_json_lines(response(b"", split(body, [1, 50, 51])))) == EVENTS


def test_a_body_that_is_not_chunked() -> None:
    resp = response(STREAM, None)
    assert not resp.chunked
    assert list(_json_lines(resp)) == EVENTS


def test_an_empty_stream_has_no_events() -> None:
    assert list(_json_lines(response(b"", []))) == []


def test_a_broken_line_raises() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        list(_json_lines(response(b"", [STREAM[:20] + b"\n"])))


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_any_chunking_reads_the_events_sent(cuts: list[int]) -> None:
    assert list(_json_lines(response(b"", split(STREAM, cuts)))) == EVENTS
