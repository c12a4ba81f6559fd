"""gas's HTTP/2 server protocol against the `h2` package as the client: what a client sends
reaches the listener whole and in order however the bytes are cut, answers come back as
the client reads them, flow control holds both ways, and every way a client can break the
protocol ends the connection (or the stream) with the code RFC 9113 gives."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gas.httpserver import h2protocol
from gas.httpserver.h2protocol import ConnectionFailed, ServerConnection
from gas.httpserver.limits import Limits

WINDOW = 1 << 20
MAX_STREAMS = 8
HEADER_LIMIT = 8190

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"https"),
    (b":authority", b"127.0.0.1:9001"),
    (b":path", b"/scheduler/filter"),
    (b"content-type", b"application/json"),
    (b"user-agent", b"kube-scheduler/v1.28.0"),
    (b"accept-encoding", b"gzip"),
]


def server_connection(
    listener: h2protocol.Listener,
    max_streams: int = MAX_STREAMS,
    max_header_list: int = HEADER_LIMIT,
    **limits: object,
) -> ServerConnection:
    """A server connection whose streams and connection have WINDOW, as gas's had."""
    return ServerConnection(
        listener,
        max_header_list=max_header_list,
        connection_window=WINDOW,
        limits=Limits(h2_max_streams=max_streams, h2_stream_window=WINDOW, **limits),  # type: ignore[arg-type]
    )


@dataclass
class Recorder:
    """The listener: every call, in order."""

    calls: list[tuple[object, ...]] = field(default_factory=list)

    def request(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        self.calls.append(("request", stream_id, headers, end_stream))

    def data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.calls.append(("data", stream_id, data, end_stream))

    def reset(self, stream_id: int) -> None:
        self.calls.append(("reset", stream_id))

    def window_opened(self, stream_id: int) -> None:
        self.calls.append(("window", stream_id))

    def bodies(self) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for call in self.calls:
            if call[0] == "request":
                out[call[1]] = b""  # type: ignore[index]
            elif call[0] == "data":
                out[call[1]] += call[2]  # type: ignore[index, operator]
        return out


class Pair:
    """A server connection and an `h2` client wired together in memory."""

    def __init__(self, max_header_list: int = HEADER_LIMIT) -> None:
        self.listener = Recorder()
        self.server = server_connection(self.listener, max_header_list=max_header_list)
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.client.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20}
        )
        self.client_events: list[h2.events.Event] = []
        self.server.initiate()
        self.client.initiate_connection()
        self.to_server()
        self.to_client()
        self.to_server()

    def to_server(self) -> None:
        self.server.receive(self.client.data_to_send())

    def to_client(self) -> list[h2.events.Event]:
        events = self.client.receive_data(self.server.data_to_send())
        self.client_events += events
        return events

    def post(self, body: bytes, headers: list[tuple[bytes, bytes]] = REQUEST) -> int:
        stream_id = self.client.get_next_available_stream_id()
        head = [*headers, (b"content-length", str(len(body)).encode())]
        self.client.send_headers(stream_id, head, end_stream=not body)
        if body:
            self.client.send_data(stream_id, body, end_stream=True)
        self.to_server()
        return stream_id

    def answer(self, stream_id: int, body: bytes) -> None:
        head = [(b":status", b"200"), (b"content-type", b"application/json")]
        self.server.send_headers(stream_id, head, end_stream=False)
        self.server.send_data(stream_id, body, end_stream=True)

    def responses(self) -> dict[int, tuple[list[tuple[bytes, bytes]], bytes, bool]]:
        out: dict[int, tuple[list[tuple[bytes, bytes]], bytes, bool]] = {}
        for event in self.client_events:
            if isinstance(event, h2.events.ResponseReceived):
                head = [(bytes(n), bytes(v)) for n, v in event.headers or ()]
                out[event.stream_id or 0] = (head, b"", False)
            elif isinstance(event, h2.events.DataReceived):
                head, body, ended = out[event.stream_id or 0]
                out[event.stream_id or 0] = (head, body + (event.data or b""), ended)
            elif isinstance(event, h2.events.StreamEnded):
                head, body, _ = out[event.stream_id or 0]
                out[event.stream_id or 0] = (head, body, True)
        return out


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">HBBBL", len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream_id) + (
        payload
    )


def goaway_code(data: bytes) -> int | None:
    """The error code of the GOAWAY in `data` (frames the server queued), if any."""
    offset = 0
    while offset + 9 <= len(data):
        high, low, kind, _, _ = struct.unpack_from(">HBBBL", data, offset)
        length = (high << 8) | low
        if kind == 0x7:
            return int(struct.unpack_from(">L", data, offset + 13)[0])
        offset += 9 + length
    return None


def rst_codes(data: bytes) -> dict[int, int]:
    out: dict[int, int] = {}
    offset = 0
    while offset + 9 <= len(data):
        high, low, kind, _, stream_id = struct.unpack_from(">HBBBL", data, offset)
        length = (high << 8) | low
        if kind == 0x3:
            out[stream_id] = int(struct.unpack_from(">L", data, offset + 9)[0])
        offset += 9 + length
    return out


def test_a_request_reaches_the_listener_and_its_answer_the_client() -> None:
    pair = Pair()
    body = b'{"Pod": {}, "NodeNames": ["a", "b"]}'
    stream_id = pair.post(body)
    assert pair.listener.calls[0] == (
        "request",
        stream_id,
        [*REQUEST, (b"content-length", str(len(body)).encode())],
        False,
    )
    assert pair.listener.calls[-1] == ("data", stream_id, body, True)
    pair.answer(stream_id, b'{"NodeNames": ["a"]}')
    pair.to_client()
    head, answer, ended = pair.responses()[stream_id]
    assert head[0] == (b":status", b"200") and answer == b'{"NodeNames": ["a"]}' and ended
    assert pair.server.open_streams == 0


def test_many_requests_decode_with_hpacks_table_in_step() -> None:
    pair = Pair()
    ids = []
    for n in range(200):
        ids.append(pair.post(f'{{"n": {n}}}'.encode()))
        pair.answer(ids[-1], b"{}")
        pair.to_client()
    requests = [call for call in pair.listener.calls if call[0] == "request"]
    assert [call[1] for call in requests] == ids
    assert all(call[2][:7] == REQUEST for call in requests)  # type: ignore[index]
    assert pair.listener.bodies() == {sid: f'{{"n": {n}}}'.encode() for n, sid in enumerate(ids)}
    assert len(pair.responses()) == 200


def test_a_header_block_in_continuation_frames_is_read_whole() -> None:
    pair = Pair(max_header_list=1 << 16)
    big = b"x" * 40000  # over two frames of 16 KiB
    pair.post(b"{}", [*REQUEST, (b"x-big", big)])
    request = pair.listener.calls[0]
    assert request[0] == "request" and (b"x-big", big) in request[2]  # type: ignore[operator]


def test_a_header_list_over_the_limit_ends_the_connection() -> None:
    pair = Pair()
    pair.client.send_headers(1, [*REQUEST, (b"x-big", b"x" * 9000)], end_stream=True)
    with pytest.raises(ConnectionFailed) as failed:
        pair.to_server()
    assert failed.value.code == h2protocol.PROTOCOL_ERROR
    assert pair.listener.calls == []


def test_an_answer_larger_than_the_clients_window_waits_for_it() -> None:
    pair = Pair()
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    pair.to_server()
    pair.to_client()
    stream_id = pair.post(b"{}")
    pair.server.send_headers(stream_id, [(b":status", b"200")], end_stream=False)
    assert pair.server.window(stream_id) == 1000
    pair.server.send_data(stream_id, b"a" * 1000, end_stream=False)
    assert pair.server.window(stream_id) == 0
    pair.to_client()
    pair.client.acknowledge_received_data(1000, stream_id)
    pair.listener.calls.clear()
    pair.to_server()
    assert ("window", stream_id) in pair.listener.calls
    assert pair.server.window(stream_id) == 1000
    pair.server.send_data(stream_id, b"b" * 500, end_stream=True)
    pair.to_client()
    assert pair.responses()[stream_id][1:] == (b"a" * 1000 + b"b" * 500, True)


def test_a_client_sending_far_more_than_the_window_is_never_held_up() -> None:
    pair = Pair()
    body = b"y" * 200_000
    for _ in range(30):  # 6 MB, six times the window
        stream_id = pair.client.get_next_available_stream_id()
        pair.client.send_headers(stream_id, REQUEST)
        for start in range(0, len(body), 16384):
            # The client sends only within the window it has been given.
            assert pair.client.local_flow_control_window(stream_id) >= 16384
            pair.client.send_data(
                stream_id, body[start : start + 16384], end_stream=start + 16384 >= len(body)
            )
            pair.to_server()
            pair.to_client()
        pair.answer(stream_id, b"{}")
        pair.server.release(len(body))  # the owner is done with the body
        pair.to_client()
    assert sum(len(b) for b in pair.listener.bodies().values()) == 30 * len(body)


def test_what_a_client_may_send_is_bounded_by_what_the_owner_released() -> None:
    pair = Pair()
    chunk = b"z" * 16384
    sent = 0
    for _ in range(8):  # streams that never end, each as far as its window lets it
        stream_id = pair.client.get_next_available_stream_id()
        pair.client.send_headers(stream_id, REQUEST)
        while min(
            pair.client.local_flow_control_window(stream_id),
            pair.client.outbound_flow_control_window,
        ) >= len(chunk):
            pair.client.send_data(stream_id, chunk)
            sent += len(chunk)
        pair.to_server()
        pair.to_client()
    # Whatever the streams' windows, the connection's holds what the owner still has.
    held = sum(len(b) for b in pair.listener.bodies().values())
    assert held == sent
    assert WINDOW - len(chunk) < held <= WINDOW
    pair.server.release(held)
    pair.to_client()
    assert pair.client.outbound_flow_control_window == WINDOW


def test_data_beyond_the_connections_window_ends_the_connection() -> None:
    pair = Pair()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST)
    pair.to_server()
    wire = b"".join(frame(0x0, 0, stream_id, b"q" * 16384) for _ in range(WINDOW // 16384 + 1))
    with pytest.raises(ConnectionFailed) as failed:
        pair.server.receive(wire)
    assert failed.value.code == h2protocol.FLOW_CONTROL_ERROR


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limited_pair(clock: Clock, **limits: object) -> Pair:
    pair = Pair.__new__(Pair)
    pair.listener = Recorder()
    pair.server = ServerConnection(
        pair.listener,
        max_header_list=HEADER_LIMIT,
        connection_window=WINDOW,
        limits=Limits(h2_max_streams=MAX_STREAMS, h2_stream_window=WINDOW, **limits),  # type: ignore[arg-type]
        clock=clock,
    )
    pair.client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    pair.client_events = []
    pair.server.initiate()
    pair.client.initiate_connection()
    pair.to_server()
    pair.to_client()
    pair.to_server()
    return pair


def reset_streams(pair: Pair, count: int) -> None:
    for _ in range(count):
        stream_id = pair.client.get_next_available_stream_id()
        pair.client.send_headers(stream_id, REQUEST)
        pair.client.reset_stream(stream_id)
    pair.to_server()


def test_resets_within_the_burst_pass_and_one_more_gets_enhance_your_calm() -> None:
    clock = Clock()
    pair = limited_pair(clock, h2_reset_burst=10, h2_reset_rate=1.0)
    reset_streams(pair, 10)
    assert [c[0] for c in pair.listener.calls].count("reset") == 10
    with pytest.raises(ConnectionFailed) as failed:
        reset_streams(pair, 1)
    assert failed.value.code == h2protocol.ENHANCE_YOUR_CALM
    assert "reset" in str(failed.value)
    assert goaway_code(pair.server.data_to_send()) == h2protocol.ENHANCE_YOUR_CALM


def test_resets_come_back_at_their_rate() -> None:
    clock = Clock()
    pair = limited_pair(clock, h2_reset_burst=10, h2_reset_rate=2.0)
    reset_streams(pair, 10)
    clock.now += 0.99  # 1.98 resets earned: one
    reset_streams(pair, 1)
    with pytest.raises(ConnectionFailed):
        reset_streams(pair, 1)


def pings(pair: Pair, count: int) -> None:
    for n in range(count):
        pair.client.ping(n.to_bytes(8, "big"))
    pair.to_server()


def test_pings_within_the_burst_pass_and_one_more_gets_enhance_your_calm() -> None:
    clock = Clock()
    # The client's preface SETTINGS was the first frame of the burst.
    pair = limited_pair(clock, h2_control_burst=11, h2_control_rate=0.0)
    pings(pair, 10)
    assert len(pair.to_client()) == 10  # each acknowledged
    with pytest.raises(ConnectionFailed) as failed:
        pings(pair, 1)
    assert failed.value.code == h2protocol.ENHANCE_YOUR_CALM
    assert "reset" not in str(failed.value)


def test_each_request_earns_frames_and_time_earns_frames() -> None:
    clock = Clock()
    pair = limited_pair(clock, h2_control_burst=11, h2_control_rate=4.0, h2_control_per_stream=3)
    pings(pair, 10)
    pair.post(b"{}")  # earns 3
    pings(pair, 3)
    with pytest.raises(ConnectionFailed):
        pings(pair, 1)
    clock.now += 0.5  # 2 more
    pair = limited_pair(clock, h2_control_burst=11, h2_control_rate=4.0)
    pings(pair, 10)
    clock.now += 0.5
    pings(pair, 2)
    with pytest.raises(ConnectionFailed):
        pings(pair, 1)


@pytest.mark.parametrize(
    ("kind", "flags", "payload", "costs"),
    [
        (0x6, 0, b"\0" * 8, True),  # PING
        (0x6, 0x1, b"\0" * 8, False),  # PING acknowledgement
        (0x4, 0, b"", True),  # SETTINGS
        (0x4, 0x1, b"", False),  # SETTINGS acknowledgement
        (0x8, 0, b"\0\0\0\1", True),  # WINDOW_UPDATE
        (0x2, 0, b"\0" * 5, True),  # PRIORITY
        (0x0, 0, b"", True),  # empty DATA
        (0x0, 0x1, b"", False),  # empty DATA ending the stream
        (0x0, 0, b"x", False),  # DATA with a body
        (0x9, 0, b"", True),  # empty CONTINUATION
        (0x9, 0x4, b"", False),  # CONTINUATION ending a block
        (0x20, 0, b"", True),  # unknown type
    ],
)
def test_which_frames_cost_work_without_a_request(
    kind: int, flags: int, payload: bytes, costs: bool
) -> None:
    assert h2protocol._costs_without_request(kind, flags, payload) is costs


def test_a_header_block_in_progress_is_timed_from_its_headers_frame() -> None:
    clock = Clock()
    pair = limited_pair(clock)
    assert pair.server.block_started is None
    block = hpack.Encoder().encode(REQUEST)
    pair.server.receive(frame(0x1, 0x1, 1, block[:5]))
    assert pair.server.block_started == clock.now
    clock.now += 3
    pair.server.receive(frame(0x9, 0, 1, block[5:8]))
    assert pair.server.block_started == clock.now - 3  # a fragment does not restart it
    pair.server.receive(frame(0x9, 0x4, 1, block[8:]))
    assert pair.server.block_started is None
    assert pair.listener.calls[-1][0] == "request"


def test_the_owner_resets_a_stream() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST)
    pair.to_server()
    pair.server.reset_stream(1)
    assert pair.listener.calls[-1] == ("reset", 1)
    events = pair.to_client()
    assert any(
        isinstance(e, h2.events.StreamReset) and e.error_code == h2protocol.CANCEL for e in events
    )
    pair.server.reset_stream(1)  # gone: nothing more
    assert pair.server.data_to_send() == b""


def test_the_client_preface_must_come_first_and_with_settings() -> None:
    for first in (
        b"GET / HTTP/1.1\r\nHost: gas\r\n\r\n",
        h2protocol.PREFACE + frame(8, 0, 0, b"\0\0\0\1"),
    ):
        server = server_connection(Recorder(), max_streams=4)
        with pytest.raises(ConnectionFailed) as failed:
            server.receive(first)
        assert failed.value.code == h2protocol.PROTOCOL_ERROR
        assert goaway_code(server.data_to_send()) == h2protocol.PROTOCOL_ERROR


def test_the_preface_may_come_a_byte_at_a_time() -> None:
    listener = Recorder()
    server = server_connection(listener, max_streams=4)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, REQUEST, end_stream=True)
    for byte in client.data_to_send():
        server.receive(bytes([byte]))
    assert listener.calls == [("request", 1, REQUEST, True)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=60))
def test_however_the_bytes_are_cut_the_listener_hears_the_same(cuts: list[int]) -> None:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    for n in range(3):
        stream_id = client.get_next_available_stream_id()
        body = bytes([65 + n]) * (300 * (n + 1))
        client.send_headers(stream_id, [*REQUEST, (b"content-length", str(len(body)).encode())])
        client.send_data(stream_id, body, end_stream=True)
    wire = client.data_to_send()
    whole = Recorder()
    server_connection(whole, max_streams=4).receive(wire)
    cut = Recorder()
    server = server_connection(cut, max_streams=4)
    offset = 0
    for size in cuts:
        server.receive(wire[offset : offset + size])
        offset += size
    server.receive(wire[offset:])
    assert cut.bodies() == whole.bodies() and len(whole.bodies()) == 3
    assert [c for c in cut.calls if c[0] == "request"] == [
        c for c in whole.calls if c[0] == "request"
    ]


MALFORMED = {
    "no-path": [h for h in REQUEST if h[0] != b":path"],
    "empty-path": [(n, b"" if n == b":path" else v) for n, v in REQUEST],
    "no-method": [h for h in REQUEST if h[0] != b":method"],
    "upper-case": [*REQUEST, (b"Content-Length", b"0")],
    "space-in-name": [*REQUEST, (b"x y", b"1")],
    "hop-by-hop": [*REQUEST, (b"connection", b"keep-alive")],
    "transfer-encoding": [*REQUEST, (b"transfer-encoding", b"chunked")],
    "te-gzip": [*REQUEST, (b"te", b"gzip")],
    "second-method": [*REQUEST, (b":method", b"GET")],
    "pseudo-last": [(b"x-a", b"1"), *REQUEST],
    "response-pseudo": [*REQUEST[:4], (b":status", b"200")],
    "newline-in-value": [*REQUEST, (b"x-a", b"1\r\nx-b: 2")],
    "leading-space": [*REQUEST, (b"x-a", b" 1")],
    "bad-length": [*REQUEST, (b"content-length", b"12a")],
    "two-lengths": [*REQUEST, (b"content-length", b"1"), (b"content-length", b"2")],
    "huge-length": [*REQUEST, (b"content-length", b"9" * 5000)],  # past int()'s digits
    "non-ascii-name": [*REQUEST, (b"x\xe9", b"1")],
    "colon-in-name": [*REQUEST, (b"a:b", b"1")],
}


@pytest.mark.parametrize("head", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_request_header_block_ends_the_connection_unheard(
    head: list[tuple[bytes, bytes]],
) -> None:
    pair = Pair()
    encoder = hpack.Encoder()
    with pytest.raises(ConnectionFailed) as failed:
        pair.server.receive(frame(0x1, 0x5, 1, encoder.encode(head)))
    assert failed.value.code == h2protocol.PROTOCOL_ERROR
    assert goaway_code(pair.server.data_to_send()) == h2protocol.PROTOCOL_ERROR
    assert pair.listener.calls == []


BROKEN_FRAMES = {
    "data-on-connection": (frame(0x0, 0x1, 0, b"x"), h2protocol.PROTOCOL_ERROR),
    "data-on-idle-stream": (frame(0x0, 0x1, 5, b"x"), h2protocol.PROTOCOL_ERROR),
    "headers-on-connection": (frame(0x1, 0x5, 0, b"\x82"), h2protocol.PROTOCOL_ERROR),
    "even-stream": (frame(0x1, 0x5, 2, hpack.Encoder().encode(REQUEST)), h2protocol.PROTOCOL_ERROR),
    "settings-on-stream": (frame(0x4, 0, 7, b""), h2protocol.PROTOCOL_ERROR),
    "settings-odd-length": (frame(0x4, 0, 0, b"\0\4\0"), h2protocol.FRAME_SIZE_ERROR),
    "settings-ack-payload": (frame(0x4, 0x1, 0, b"\0\4\0\0\0\0"), h2protocol.FRAME_SIZE_ERROR),
    "window-over-2^31": (frame(0x4, 0, 0, b"\0\4\x80\0\0\0"), h2protocol.FLOW_CONTROL_ERROR),
    "frame-size-small": (frame(0x4, 0, 0, b"\0\5\0\0\0\1"), h2protocol.PROTOCOL_ERROR),
    "enable-push-2": (frame(0x4, 0, 0, b"\0\2\0\0\0\2"), h2protocol.PROTOCOL_ERROR),
    "push-promise": (frame(0x5, 0x4, 1, b"\0\0\0\2"), h2protocol.PROTOCOL_ERROR),
    "ping-on-stream": (frame(0x6, 0, 1, b"12345678"), h2protocol.PROTOCOL_ERROR),
    "ping-short": (frame(0x6, 0, 0, b"1234"), h2protocol.FRAME_SIZE_ERROR),
    "continuation-alone": (frame(0x9, 0x4, 1, b"\x82"), h2protocol.PROTOCOL_ERROR),
    "zero-window-update": (frame(0x8, 0, 0, b"\0\0\0\0"), h2protocol.PROTOCOL_ERROR),
    "rst-on-connection": (frame(0x3, 0, 0, b"\0\0\0\0"), h2protocol.PROTOCOL_ERROR),
    "rst-on-idle": (frame(0x3, 0, 9, b"\0\0\0\0"), h2protocol.PROTOCOL_ERROR),
    "goaway-on-stream": (frame(0x7, 0, 1, b"\0" * 8), h2protocol.PROTOCOL_ERROR),
    "goaway-short": (frame(0x7, 0, 0, b"\0" * 4), h2protocol.FRAME_SIZE_ERROR),
    "oversized-frame": (frame(0x0, 0, 1, b"x" * 16385), h2protocol.FRAME_SIZE_ERROR),
    "hpack-garbage": (frame(0x1, 0x5, 1, b"\xff\xff\xff\xff\xff"), h2protocol.COMPRESSION_ERROR),
}


@pytest.mark.parametrize("raw,code", list(BROKEN_FRAMES.values()), ids=list(BROKEN_FRAMES))
def test_a_frame_breaking_the_protocol_ends_the_connection_with_its_code(
    raw: bytes, code: int
) -> None:
    pair = Pair()
    with pytest.raises(ConnectionFailed) as failed:
        pair.server.receive(raw)
    assert failed.value.code == code
    assert goaway_code(pair.server.data_to_send()) == code
    assert pair.listener.calls == []


def test_a_header_block_interrupted_by_another_frame_ends_the_connection() -> None:
    pair = Pair()
    block = hpack.Encoder().encode(REQUEST)
    with pytest.raises(ConnectionFailed) as failed:
        pair.server.receive(frame(0x1, 0x1, 1, block[:3]) + frame(0x6, 0, 0, b"12345678"))
    assert failed.value.code == h2protocol.PROTOCOL_ERROR


def test_more_streams_than_allowed_end_the_connection() -> None:
    pair = Pair()
    encoder = hpack.Encoder()  # the raw frames' own, in step with the server's table
    for n in range(MAX_STREAMS):
        pair.server.receive(frame(0x1, 0x4, 1 + 2 * n, encoder.encode(REQUEST)))
    assert len([c for c in pair.listener.calls if c[0] == "request"]) == MAX_STREAMS
    with pytest.raises(ConnectionFailed) as failed:
        pair.server.receive(frame(0x1, 0x4, 1 + 2 * MAX_STREAMS, encoder.encode(REQUEST)))
    assert failed.value.code == h2protocol.PROTOCOL_ERROR


def test_a_body_longer_or_shorter_than_its_length_resets_only_its_stream() -> None:
    pair = Pair()
    for declared, sent in ((b"5", b"123456"), (b"5", b"1234")):
        stream_id = pair.client.get_next_available_stream_id()
        pair.client.send_headers(stream_id, [*REQUEST, (b"content-length", declared)])
        pair.client.send_data(stream_id, sent, end_stream=True)
        pair.to_server()
        assert rst_codes(pair.server.data_to_send()) == {stream_id: h2protocol.PROTOCOL_ERROR}
        assert pair.listener.calls[-1] == ("reset", stream_id)
    good = pair.post(b"12345")
    assert pair.listener.calls[-1] == ("data", good, b"12345", True)


def test_a_client_reset_reaches_the_listener_and_its_answer_is_dropped() -> None:
    pair = Pair()
    stream_id = pair.post(b"{}")
    pair.client.reset_stream(stream_id)
    pair.to_server()
    assert pair.listener.calls[-1] == ("reset", stream_id)
    pair.answer(stream_id, b"late")
    assert pair.server.data_to_send() == b""


def test_an_answer_before_the_body_ended_resets_the_stream_with_no_error() -> None:
    pair = Pair()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST)
    pair.client.send_data(stream_id, b"partial")
    pair.to_server()
    pair.server.send_headers(stream_id, [(b":status", b"413")], end_stream=True)
    assert rst_codes(pair.server.data_to_send()) == {stream_id: h2protocol.NO_ERROR}
    # What the client still had in flight is dropped, and the connection goes on.
    pair.server.receive(frame(0x0, 0x1, stream_id, b"rest"))
    assert pair.listener.calls[-1] == ("data", stream_id, b"partial", False)
    assert pair.post(b"{}") == stream_id + 2


def test_trailers_end_the_request_and_are_not_read() -> None:
    pair = Pair()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST)
    pair.client.send_data(stream_id, b"{}")
    pair.client.send_headers(stream_id, [(b"x-checksum", b"1")], end_stream=True)
    pair.to_server()
    assert pair.listener.calls[-1] == ("data", stream_id, b"", True)


def test_ping_is_answered_and_settings_acknowledged() -> None:
    pair = Pair()
    pair.client.ping(b"gas-ping")
    pair.client.update_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: 32768})
    pair.to_server()
    events = pair.to_client()
    assert any(
        isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"gas-ping" for e in events
    )
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in events)
    assert pair.server.max_outbound_frame_size == 32768


def test_after_goaway_new_streams_are_refused_and_taken_ones_answered() -> None:
    pair = Pair()
    taken = pair.post(b"{}")
    pair.server.goaway()
    pair.to_client()
    terminated = [e for e in pair.client_events if isinstance(e, h2.events.ConnectionTerminated)]
    assert terminated and terminated[0].last_stream_id == taken
    assert terminated[0].error_code == h2protocol.NO_ERROR
    # A stream the client opened before it read the GOAWAY is refused.
    pair.server.receive(frame(0x1, 0x5, taken + 2, hpack.Encoder().encode(REQUEST)))
    assert rst_codes(pair.server.data_to_send()) == {taken + 2: h2protocol.REFUSED_STREAM}
    pair.answer(taken, b"done")
    assert pair.server.data_to_send()  # still answered


def test_a_goaway_from_the_client_ends_reading() -> None:
    pair = Pair()
    pair.client.close_connection()
    pair.to_server()
    assert pair.server.ended


def test_frames_of_unknown_types_and_priorities_are_ignored() -> None:
    pair = Pair()
    pair.server.receive(frame(0xA, 0, 0, b"whatever") + frame(0x2, 0, 1, b"\0\0\0\0\x10"))
    stream_id = pair.post(b"{}")
    assert pair.listener.calls[-1] == ("data", stream_id, b"{}", True)


def test_padded_frames_are_unpadded() -> None:
    pair = Pair()
    stream_id = pair.client.get_next_available_stream_id()
    block = pair.client.encoder.encode([*REQUEST, (b"content-length", b"2")])
    pair.server.receive(frame(0x1, 0x4 | 0x8, stream_id, b"\x0a" + block + b"\0" * 10))
    pair.server.receive(frame(0x0, 0x1 | 0x8, stream_id, b"\x14{}" + b"\0" * 20))
    assert pair.listener.calls == [
        ("request", stream_id, [*REQUEST, (b"content-length", b"2")], False),
        ("data", stream_id, b"{}", True),
    ]


def test_answer_fields_decode_as_sent_and_leave_the_clients_table_empty() -> None:
    pair = Pair()
    stream_id = pair.post(b"{}")
    head = [
        (b":status", b"413"),  # not in the static table as a whole field
        (b"content-type", b"application/json"),
        (b"content-length", b"1234567"),
        (b"x-gas-reason", b"r" * 300),  # a name of its own, a length over one byte
    ]
    pair.server.send_headers(stream_id, head, end_stream=True)
    pair.to_client()
    assert pair.responses()[stream_id] == (head, b"", True)
    assert len(pair.client.decoder.header_table.dynamic_entries) == 0
    # The same fields again are written the same (the client's table being unchanged).
    second = pair.post(b"{}")
    pair.server.send_headers(second, [(b":status", b"200"), *head[1:]], end_stream=True)
    pair.to_client()
    assert pair.responses()[second][0] == [(b":status", b"200"), *head[1:]]


def test_empty_continuation_frames_cannot_grow_a_header_block_for_ever() -> None:
    # Past the rate of frames without requests first...
    pair = Pair()
    flood = frame(0x1, 0, 1, b"") + frame(0x9, 0, 1, b"") * 100_000
    with pytest.raises(ConnectionFailed) as failed:
        pair.server.receive(flood)
    assert failed.value.code == h2protocol.ENHANCE_YOUR_CALM
    # ...and, with no such rate, past the header block's bound.
    server = server_connection(Recorder(), h2_control_burst=10**6)
    server.receive(h2protocol.PREFACE + frame(0x4, 0, 0, b""))
    with pytest.raises(ConnectionFailed) as failed:
        server.receive(flood)
    assert failed.value.code == h2protocol.PROTOCOL_ERROR
    assert pair.listener.calls == []


def first_block_byte(data: bytes) -> int:
    """The first byte of the first HEADERS frame's header block in `data`."""
    offset = 0
    while offset + 9 <= len(data):
        high, low, kind, _, _ = struct.unpack_from(">HBBBL", data, offset)
        if kind == 0x1:
            return data[offset + 9]
        offset += 9 + ((high << 8) | low)
    raise AssertionError("no HEADERS frame")


def test_the_clients_table_is_set_to_zero_first_and_after_it_changes_size() -> None:
    pair = Pair()
    head = [(b":status", b"200")]
    for expected in (0x20, 0x88):  # a size update to 0, then the field alone
        stream_id = pair.post(b"{}")
        pair.server.send_headers(stream_id, head, end_stream=True)
        data = pair.server.data_to_send()
        assert first_block_byte(data) == expected
        pair.client.receive_data(data)
    pair.client.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 256})
    pair.to_server()
    pair.to_client()
    stream_id = pair.post(b"{}")
    pair.server.send_headers(stream_id, head, end_stream=True)
    data = pair.server.data_to_send()
    assert first_block_byte(data) == 0x20
    events = pair.client.receive_data(data)
    assert any(isinstance(e, h2.events.ResponseReceived) for e in events)


def test_trailers_ending_a_body_shorter_than_its_length_reset_the_stream() -> None:
    pair = Pair()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, [*REQUEST, (b"content-length", b"100")])
    pair.client.send_data(stream_id, b"0123456789")
    pair.client.send_headers(stream_id, [(b"x-checksum", b"1")], end_stream=True)
    pair.to_server()
    assert rst_codes(pair.server.data_to_send()) == {stream_id: h2protocol.PROTOCOL_ERROR}
    assert pair.listener.calls[-1] == ("reset", stream_id)
    assert ("data", stream_id, b"", True) not in pair.listener.calls


def test_a_later_goaway_never_names_a_later_stream() -> None:
    pair = Pair()
    taken = pair.post(b"{}")
    pair.server.goaway()
    pair.server.data_to_send()
    # Refused after the GOAWAY: it must not raise the last stream a GOAWAY names.
    pair.server.receive(frame(0x1, 0x5, taken + 2, hpack.Encoder().encode(REQUEST)))
    pair.server.data_to_send()
    with pytest.raises(ConnectionFailed):
        pair.server.receive(frame(0x6, 0, 1, b"12345678"))  # PING on a stream
    data = pair.server.data_to_send()
    offset = data.index(b"\x07\x00\x00\x00\x00\x00") - 3  # the GOAWAY frame's header
    assert struct.unpack_from(">L", data, offset + 9)[0] == taken


def test_frames_on_idle_or_even_streams() -> None:
    pair = Pair()
    # A PRIORITY frame may name an idle stream, even a malformed one: nothing to reset.
    pair.server.receive(frame(0x2, 0, 9, b"\0\0"))
    assert rst_codes(pair.server.data_to_send()) == {}
    pair.post(b"{}")
    pair.post(b"{}")  # streams 1 and 3
    with pytest.raises(ConnectionFailed) as failed:
        pair.server.receive(frame(0x8, 0, 2, b"\0\0\0\1"))  # even: never opened
    assert failed.value.code == h2protocol.PROTOCOL_ERROR
