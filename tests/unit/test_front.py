"""The serving loop's bounds at their edges (gas/httpserver/front.py, connection.py, http1.py,
http2.py): connections driven through asyncio's Protocol calls with a transport that
records what is written, a clock the test moves, and a pool the test runs. Just under a
bound passes, at it the connection is closed for that bound's reason."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from gas.httpserver.answering import App
from gas.httpserver.connection import Connection, Listener
from gas.httpserver.front import Front
from gas.httpserver.limits import Limits, TokenBucket
from gas.httpserver.stats import CloseReason, ServingStats
from gas.serving import tls

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Transport(asyncio.Transport):
    """What asyncio's socket transport offers a protocol, recording instead of sending."""

    def __init__(self, port: int = 40000) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True
        self.buffered = 0
        self.port = port

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("10.0.0.9", self.port) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return self.buffered


class Pool(Executor):
    """Runs jobs when the test says so."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.append((future, lambda: fn(*args, **kwargs)))
        return future

    def run_all(self, loop: asyncio.AbstractEventLoop) -> None:
        jobs, self.jobs = self.jobs, []
        for future, job in jobs:
            future.set_result(job())
        loop.run_until_complete(asyncio.sleep(0))  # the answers' hand-back to the loop


calls: list[str] = []


def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    calls.append(environ["PATH_INFO"])
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok " + body]


class Rig:
    def __init__(self, **limits: Any) -> None:
        calls.clear()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.pool = Pool()
        self.stats = ServingStats(clock=self.clock)
        self.front = Front(self.loop, Limits(**limits), self.pool, self.stats, clock=self.clock)
        app = App(wsgi, None, 1000, "http", ("127.0.0.1", 9001))
        self.listener = Listener(app, None, http2=True)

    def connect(self, listener: Listener | None = None) -> tuple[Connection, Transport]:
        conn = Connection(self.front, listener or self.listener)
        transport = Transport(40000 + self.front.connections)
        conn.connection_made(transport)
        return conn, transport

    def later(self, seconds: float) -> None:
        self.clock.now += seconds
        self.front.sweep()

    def closed(self, reason: str) -> int:
        return self.stats.closed.get(reason, 0)


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    made.loop.close()


def get(path: str = "/x") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: gas\r\n\r\n".encode()


# ------------------------------------------------------------------ HTTP/1.1 deadlines


def test_the_first_head_is_timed_from_the_connections_start(rig: Rig) -> None:
    conn, transport = rig.connect()
    rig.later(9.99)
    conn.data_received(get()[:5])
    assert not transport.closed
    rig.later(0.01)
    assert transport.closed
    assert rig.closed(CloseReason.HEADER_TIMEOUT) == 1


def test_a_trickled_head_gains_nothing_from_its_bytes(rig: Rig) -> None:
    conn, transport = rig.connect()
    rig.later(0.5)
    conn.data_received(get()[:1])
    for byte in get()[1:10]:
        rig.later(1.0)
        conn.data_received(bytes([byte]))
    assert rig.clock.now - 100.0 == pytest.approx(9.5)
    assert not transport.closed
    rig.later(0.5)
    assert transport.closed and rig.closed(CloseReason.HEADER_TIMEOUT) == 1


def test_a_body_is_timed_from_its_head(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(b"POST /x HTTP/1.1\r\nHost: g\r\nContent-Length: 10\r\n\r\n12345")
    rig.later(29.99)
    assert not transport.closed
    rig.later(0.01)
    assert transport.closed and rig.closed(CloseReason.BODY_TIMEOUT) == 1
    assert rig.front.buffered == 0  # what it held is let go


def test_a_kept_alive_connection_is_closed_at_the_idle_timeout_and_not_before(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(get())
    rig.pool.run_all(rig.loop)
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.reading
    rig.later(119.99)
    assert not transport.closed
    rig.later(0.01)
    assert transport.closed and rig.closed(CloseReason.IDLE_TIMEOUT) == 1


def test_the_next_head_is_timed_from_its_first_byte(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(get())
    rig.pool.run_all(rig.loop)
    rig.later(100.0)
    conn.data_received(get()[:3])
    rig.later(9.99)
    assert not transport.closed
    rig.later(0.01)
    assert transport.closed and rig.closed(CloseReason.HEADER_TIMEOUT) == 1


def test_a_connection_is_not_read_while_its_request_is_answered(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(get("/a") + get("/b"))
    assert not transport.reading
    rig.later(200.0)  # answering has no deadline of its own
    assert not transport.closed
    rig.pool.run_all(rig.loop)
    rig.pool.run_all(rig.loop)
    assert calls == ["/a", "/b"]
    assert transport.written.count(b"HTTP/1.1 200 OK") == 2
    assert transport.reading


def test_a_peer_that_reads_nothing_is_closed_at_the_write_timeout(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(get())
    rig.pool.run_all(rig.loop)
    conn.pause_writing()  # asyncio: the output is over the high-water mark
    assert not transport.reading
    rig.later(29.99)
    assert not transport.closed
    rig.later(0.01)
    assert transport.aborted and rig.closed(CloseReason.WRITE_TIMEOUT) == 1


def test_a_head_over_the_line_limit_is_refused(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(b"GET /x HTTP/1.1\r\nX-A: " + b"a" * 8200 + b"\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert transport.closed and rig.closed(CloseReason.MALFORMED) == 1


def test_pipelined_requests_in_one_read_are_no_head_too_large(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(get() * 3000 + get()[:10])  # 105 kB: 3,000 heads and a partial one
    for _ in range(3000):
        rig.pool.run_all(rig.loop)
    assert transport.written.count(b"HTTP/1.1 200 OK") == 3000
    assert not transport.closed


def test_a_head_growing_over_reads_is_refused_past_64_kib(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(b"GET /x HTTP/1.1\r\nX-A: ")
    for _ in range(16):
        conn.data_received(b"a" * 4096)
    assert not transport.closed
    conn.data_received(b"a" * 4096)
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert transport.closed and rig.closed(CloseReason.MALFORMED) == 1


def test_hundreds_of_pipelined_requests_answered_on_the_loop_are_answered_in_order() -> None:
    rig = Rig()
    rig.front.inline = frozenset({"/inline"})
    conn, transport = rig.connect()
    post = b"POST /inline HTTP/1.1\r\nHost: g\r\nContent-Length: 1\r\n\r\nx"
    conn.data_received(post * 2000)  # no recursion per request
    assert transport.written.count(b"HTTP/1.1 200 OK") == 2000
    assert calls == ["/inline"] * 2000
    assert transport.reading and not transport.closed
    rig.loop.close()


def test_pipelined_heads_waiting_their_turn_count_towards_the_buffered_bound() -> None:
    rig = Rig(max_buffered_bytes=1000)
    conn, transport = rig.connect()
    # Each head counts its target and fields: 91 + len("host") + len("gas") = 98 bytes.
    conn.data_received(get("/" + "p" * 90) * 5)
    assert rig.front.buffered == 490
    conn.data_received(get("/" + "p" * 90) * 6)  # none answered yet: 1,078 held
    assert transport.closed and rig.closed(CloseReason.BUFFER_LIMIT) == 1
    assert rig.front.buffered == 0
    rig.loop.close()


def test_100_continue_comes_after_the_answers_before_it(rig: Rig) -> None:
    conn, transport = rig.connect()
    waiting = b"POST /b HTTP/1.1\r\nHost: g\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    conn.data_received(get("/a") + waiting)
    assert b"100 Continue" not in transport.written  # /a is not answered yet
    rig.pool.run_all(rig.loop)
    answer_a = transport.written.index(b"HTTP/1.1 200 OK")
    assert transport.written.index(b"HTTP/1.1 100 Continue") > answer_a
    conn.data_received(b"hi")
    rig.pool.run_all(rig.loop)
    assert transport.written.endswith(b"ok hi")


def test_a_refused_body_its_client_waits_to_send_ends_the_connection(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(
        b"POST /x HTTP/1.1\r\nHost: g\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n"
    )
    rig.pool.run_all(rig.loop)
    assert b"100 Continue" not in transport.written
    assert b"\r\nConnection: close\r\n" in transport.written
    assert transport.closed and rig.closed(CloseReason.DONE) == 1


def test_a_declared_body_over_the_limit_is_answered_unread(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(b"POST /x HTTP/1.1\r\nHost: g\r\nContent-Length: 1001\r\n\r\n")
    assert len(rig.pool.jobs) == 1  # answered before a byte of it came
    rig.pool.run_all(rig.loop)
    conn.data_received(b"b" * 1001)  # read and dropped: the connection goes on
    assert rig.front.buffered == 0
    conn.data_received(get())
    rig.pool.run_all(rig.loop)
    assert transport.written.count(b"HTTP/1.1 200 OK") == 2
    assert not transport.closed


def test_malformed_http1_is_refused_with_400(rig: Rig) -> None:
    conn, transport = rig.connect()
    conn.data_received(b"GET /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 400 ")
    assert transport.closed and rig.closed(CloseReason.MALFORMED) == 1


# ------------------------------------------------------------------ across connections


def test_at_the_connection_bound_the_longest_idle_one_makes_room() -> None:
    rig = Rig(max_connections=3)
    first, first_t = rig.connect()
    second, second_t = rig.connect()
    _third, third_t = rig.connect()
    first.data_received(get())  # busy: answering
    second.data_received(get()[:3])  # reading a head: not busy
    rig.connect()
    assert second_t.closed and not first_t.closed and not third_t.closed
    assert rig.closed(CloseReason.CONNECTION_LIMIT) == 1
    assert rig.front.connections == 3
    rig.loop.close()


def test_at_the_bound_with_every_connection_busy_the_newcomer_is_closed() -> None:
    rig = Rig(max_connections=2)
    for _ in range(2):
        conn, _ = rig.connect()
        conn.data_received(get())
    _, newcomer = rig.connect()
    assert newcomer.closed and rig.closed(CloseReason.CONNECTION_LIMIT) == 1
    assert rig.front.connections == 2
    rig.loop.close()


def test_past_the_buffered_bound_the_connection_holding_most_is_closed() -> None:
    rig = Rig(max_buffered_bytes=1000)
    big, big_t = rig.connect()
    small, small_t = rig.connect()
    big.data_received(b"POST /x HTTP/1.1\r\nContent-Length: 900\r\n\r\n" + b"b" * 700)
    small.data_received(b"POST /x HTTP/1.1\r\nContent-Length: 900\r\n\r\n" + b"s" * 300)
    assert rig.front.buffered == 1000 and not big_t.closed
    small.data_received(b"s")
    assert big_t.closed and not small_t.closed
    assert rig.closed(CloseReason.BUFFER_LIMIT) == 1
    assert rig.front.buffered == 301
    # A connection closed while its bytes are still read counts nothing more.
    small.close(CloseReason.PEER)
    assert rig.front.buffered == 0
    rig.front.hold(small, 500)
    assert rig.front.buffered == 0 and small.held == 0
    rig.loop.close()


def test_output_a_peer_leaves_unread_counts_towards_the_buffered_bound() -> None:
    rig = Rig(max_buffered_bytes=1000)
    reader, reader_t = rig.connect()
    lazy, lazy_t = rig.connect()
    lazy.data_received(get())
    rig.pool.run_all(rig.loop)
    lazy_t.buffered = 900  # its answers pile up in the transport
    rig.later(0.25)
    assert rig.front.buffered == 900
    reader.data_received(b"POST /x HTTP/1.1\r\nContent-Length: 200\r\n\r\n" + b"r" * 101)
    assert lazy_t.closed and not reader_t.closed
    assert rig.closed(CloseReason.BUFFER_LIMIT) == 1
    assert rig.front.buffered == 101
    rig.loop.close()


# ------------------------------------------------------------------ TLS


def test_a_stalled_handshake_is_cut_at_the_handshake_timeout(rig: Rig, tmp_path: Path) -> None:
    cert, key = tls.write_self_signed(str(tmp_path), ["localhost"])
    context = tls.server_ssl_context(cert, key, None)
    conn, transport = rig.connect(Listener(rig.listener.app, lambda: context))
    conn.data_received(b"\x16\x03\x01")  # the start of a ClientHello
    rig.later(9.99)
    assert not transport.closed
    rig.later(0.01)
    assert transport.closed and rig.closed(CloseReason.HANDSHAKE_TIMEOUT) == 1


def test_a_handshake_that_is_no_tls_is_closed_at_once(rig: Rig, tmp_path: Path) -> None:
    cert, key = tls.write_self_signed(str(tmp_path), ["localhost"])
    context = tls.server_ssl_context(cert, key, None)
    conn, transport = rig.connect(Listener(rig.listener.app, lambda: context))
    conn.data_received(get())
    assert transport.closed and rig.closed(CloseReason.HANDSHAKE_FAILED) == 1


def test_tls_through_memory_buffers_serves_a_request(rig: Rig, tmp_path: Path) -> None:
    cert, key = tls.write_self_signed(str(tmp_path), ["localhost"])
    context = tls.server_ssl_context(cert, key, None)
    conn, transport = rig.connect(Listener(rig.listener.app, lambda: context))
    client_ctx = ssl.create_default_context(cafile=cert)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    for _ in range(5):
        try:
            client.do_handshake()
            break
        except ssl.SSLWantReadError:
            conn.data_received(outgoing.read())
            incoming.write(bytes(transport.written))
            transport.written.clear()
    client.write(get("/tls"))
    conn.data_received(outgoing.read())
    rig.pool.run_all(rig.loop)
    incoming.write(bytes(transport.written))
    assert client.read(4096).startswith(b"HTTP/1.1 200 OK")
    assert calls == ["/tls"]


# ------------------------------------------------------------------ HTTP/2


class H2Peer:
    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.conn, self.transport = rig.connect()
        self.conn.start_protocol("h2")  # as after ALPN chose it
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.client.initiate_connection()
        self.send()

    def send(self) -> None:
        self.conn.data_received(self.client.data_to_send())

    def events(self) -> list[h2.events.Event]:
        data = bytes(self.transport.written)
        self.transport.written.clear()
        return self.client.receive_data(data)

    def headers(self, path: str, end: bool = True) -> int:
        stream_id = self.client.get_next_available_stream_id()
        self.client.send_headers(
            stream_id,
            [(":method", "POST"), (":scheme", "https"), (":authority", "g"), (":path", path)],
            end_stream=end,
        )
        return stream_id


def test_h2_pings_do_not_keep_a_connection_open(rig: Rig) -> None:
    peer = H2Peer(rig)
    peer.headers("/first")
    peer.send()
    rig.pool.run_all(rig.loop)
    for n in range(119):
        rig.later(1.0)
        peer.client.ping(n.to_bytes(8, "big"))
        peer.send()
    assert not peer.transport.closed
    rig.later(1.0)
    assert peer.transport.closed and rig.closed(CloseReason.IDLE_TIMEOUT) == 1
    assert any(isinstance(e, h2.events.ConnectionTerminated) for e in peer.events())


def test_h2_a_request_resets_the_idle_time(rig: Rig) -> None:
    peer = H2Peer(rig)
    peer.headers("/a")
    peer.send()
    rig.pool.run_all(rig.loop)
    rig.later(119.0)
    peer.headers("/b")
    peer.send()
    rig.pool.run_all(rig.loop)
    rig.later(119.0)
    assert not peer.transport.closed


def test_h2_a_connection_that_never_asks_is_cut_at_the_header_timeout(rig: Rig) -> None:
    peer = H2Peer(rig)
    rig.later(9.99)
    assert not peer.transport.closed
    rig.later(0.01)
    assert peer.transport.closed and rig.closed(CloseReason.HEADER_TIMEOUT) == 1


def test_h2_a_stream_reset_before_its_answer_began_is_not_run(rig: Rig) -> None:
    peer = H2Peer(rig)
    stream_id = peer.headers("/reset-me")
    peer.send()
    peer.client.reset_stream(stream_id)
    peer.send()
    rig.pool.run_all(rig.loop)
    assert calls == []
    assert rig.stats.reset_skipped == 1


def test_h2_rapid_reset_gets_enhance_your_calm(rig: Rig) -> None:
    peer = H2Peer(rig)
    for _ in range(200):
        peer.client.reset_stream(peer.headers("/r"))
    peer.send()
    assert not peer.transport.closed
    peer.client.reset_stream(peer.headers("/r"))
    peer.send()
    assert peer.transport.closed and rig.closed(CloseReason.RESET_FLOOD) == 1
    ended = [e for e in peer.events() if isinstance(e, h2.events.ConnectionTerminated)]
    assert ended and ended[0].error_code == 0xB
    rig.pool.run_all(rig.loop)
    assert calls == []


def test_h2_resets_the_peer_makes_the_server_do_count_against_its_budget(rig: Rig) -> None:
    peer = H2Peer(rig)
    for _ in range(200):  # a stream opened, then a WINDOW_UPDATE of 0: the server resets it
        stream_id = peer.headers("/r", end=False)
        peer.send()
        peer.conn.data_received(b"\x00\x00\x04\x08\x00" + stream_id.to_bytes(4, "big") + bytes(4))
    assert not peer.transport.closed
    stream_id = peer.headers("/r", end=False)
    peer.send()
    peer.conn.data_received(b"\x00\x00\x04\x08\x00" + stream_id.to_bytes(4, "big") + bytes(4))
    assert peer.transport.closed and rig.closed(CloseReason.RESET_FLOOD) == 1


def test_h2_unfinished_bodies_are_held_within_the_window_and_let_go_on_reset(rig: Rig) -> None:
    peer = H2Peer(rig)
    ids = [peer.headers("/body", end=False) for _ in range(4)]
    for stream_id in ids:
        peer.client.send_data(stream_id, b"x" * 500)
    peer.send()
    assert rig.front.buffered == 2000
    for stream_id in ids:
        peer.client.reset_stream(stream_id)
    peer.send()
    assert rig.front.buffered == 0


def test_h2_a_stream_not_finished_in_the_body_timeout_is_reset(rig: Rig) -> None:
    peer = H2Peer(rig)
    stream_id = peer.headers("/slow", end=False)
    peer.send()
    rig.later(29.99)
    assert not any(isinstance(e, h2.events.StreamReset) for e in peer.events())
    rig.later(0.01)
    resets = [e for e in peer.events() if isinstance(e, h2.events.StreamReset)]
    assert [r.stream_id for r in resets] == [stream_id]
    assert not peer.transport.closed


def test_h2_a_header_block_left_open_is_cut_at_the_header_timeout(rig: Rig) -> None:
    peer = H2Peer(rig)
    peer.headers("/x")
    peer.send()
    rig.pool.run_all(rig.loop)
    # A HEADERS frame without END_HEADERS, then nothing.
    peer.conn.data_received(b"\x00\x00\x01\x01\x00\x00\x00\x00\x03\x82")
    rig.later(9.99)
    assert not peer.transport.closed
    rig.later(0.01)
    assert peer.transport.closed and rig.closed(CloseReason.HEADER_TIMEOUT) == 1


# ------------------------------------------------------------------ the bucket


def test_a_token_bucket_gives_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(3, 2.0, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(0.49)  # 0.98 of a token
    assert bucket.take(0.5)
    bucket.give(10)
    assert bucket.tokens == 3.0  # never past its capacity


def test_limits_that_make_no_sense_are_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        Limits(max_connections=0).check()
    with pytest.raises(ValueError, match="idle_timeout"):
        Limits(idle_timeout=0).check()
    with pytest.raises(ValueError, match="h2_stream_window"):
        Limits(h2_stream_window=100).check()
