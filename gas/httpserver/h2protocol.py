"""HTTP/2's server side as gas serves it (RFC 9113): bytes in, a listener's calls out, bytes
to send. No I/O and no locks: `gas.httpserver.http2` owns the socket and the threads.

Why not the `h2` package, which gas used before: kube-scheduler sends a filter, a
prioritize and a bind per pod, and `h2`'s general state machines, event objects and frame
objects cost about 260 us of CPU per request on the 2-core machine gas is measured on,
more than the verbs themselves. A server that only answers requests needs a small part of
the protocol: this keeps that part, checks what a client sends as strictly as `h2` did
(a malformed frame or header block ends the connection before the app sees it), and
leaves HPACK to the `hpack` package.

What it does not do, as a server of requests: server push, priorities (PRIORITY frames and
the HEADERS priority fields are checked and ignored), the CONNECT method, and trailers
(a trailing header block is decoded, to keep HPACK's table in step, and dropped).

Errors: a connection error queues a GOAWAY with its code and raises `ConnectionFailed`;
the caller sends what is queued and closes. A stream error resets the stream
(RST_STREAM) and calls the listener's `reset`, the connection goes on.

What a peer may cost (`gas.httpserver.limits.Limits`): the connection's flow-control window
is given back only as the owner `release`s body bytes it has handed on or dropped, so
the request bytes a connection holds are bounded by `connection_window` however many
streams send; stream resets and frames that cost work without a request (SETTINGS,
PING, PRIORITY, WINDOW_UPDATE, empty DATA and CONTINUATION, headers on a closed stream,
unknown types) are rate limited, and a peer past either limit gets GOAWAY
ENHANCE_YOUR_CALM.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol

import hpack
from hpack.hpack import encode_integer
from hpack.table import HeaderTable

from gas.httpserver.limits import DEFAULT_LIMITS, Limits, TokenBucket

__all__ = [
    "CANCEL",
    "ENHANCE_YOUR_CALM",
    "FLOW_CONTROL_ERROR",
    "FRAME_SIZE_ERROR",
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "REFUSED_STREAM",
    "STREAM_CLOSED",
    "ConnectionFailed",
    "Listener",
    "ServerConnection",
]

# Error codes (RFC 9113, 7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

# Frame types (6).
_DATA = 0x0
_HEADERS = 0x1
_PRIORITY = 0x2
_RST_STREAM = 0x3
_SETTINGS = 0x4
_PUSH_PROMISE = 0x5
_PING = 0x6
_GOAWAY = 0x7
_WINDOW_UPDATE = 0x8
_CONTINUATION = 0x9

# Flags.
_END_STREAM = 0x1
_ACK = 0x1
_END_HEADERS = 0x4
_PADDED = 0x8
_PRIORITY_FLAG = 0x20

# Settings (6.5.2).
_HEADER_TABLE_SIZE = 0x1
_ENABLE_PUSH = 0x2
_MAX_CONCURRENT_STREAMS = 0x3
_INITIAL_WINDOW_SIZE = 0x4
_MAX_FRAME_SIZE = 0x5
_MAX_HEADER_LIST_SIZE = 0x6

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_TABLE_SIZE_ZERO = b"\x20"
"""HPACK's dynamic table size update to 0 (RFC 7541, 6.3)."""
_DEFAULT_WINDOW = 65535
_DEFAULT_FRAME_SIZE = 16384
_MAX_WINDOW = 2**31 - 1
_FRAME_HEADER = struct.Struct(">HBBBL")
_SETTING = struct.Struct(">HL")
_UINT32 = struct.Struct(">L")

# Fields that are about one hop's connection, never sent over HTTP/2 (8.2.2).
_CONNECTION_FIELDS = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
# A field name is lower case and holds no separator or control byte (RFC 9110, 5.1).
_NAME_REFUSED = (
    bytes(range(0x00, 0x21))
    + b'"(),/:;<=>?@[\\]{}'
    + bytes(range(0x41, 0x5B))
    + bytes(range(0x7F, 0x100))
)
_VALUE_REFUSED = b"\x00\r\n"
_LENGTH_DIGITS = 18
"""A content-length longer than this is refused (no body is that long; and `int` reads at
most 4,300 digits)."""
_WHITESPACE = b" \t"


class ConnectionFailed(Exception):
    """The connection is over: a GOAWAY with `code` is queued."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Listener(Protocol):
    """What the connection tells its owner, as frames arrive."""

    def request(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        """A new stream's request header block, checked."""

    def data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """Body bytes of an open stream (maybe none, with its end)."""

    def reset(self, stream_id: int) -> None:
        """The stream is gone (the client reset it, or it broke the protocol): answer
        nothing on it."""

    def window_opened(self, stream_id: int) -> None:
        """The client opened its flow-control window: on the connection (0) or a stream."""


@dataclass(slots=True)
class _Stream:
    send_window: int
    receive_window: int
    declared: int | None = None
    received: int = 0
    remote_ended: bool = False


class ServerConnection:
    """One HTTP/2 connection's protocol state, the server's side."""

    def __init__(
        self,
        listener: Listener,
        *,
        max_header_list: int,
        connection_window: int,
        limits: Limits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._listener = listener
        self._max_streams = limits.h2_max_streams
        self._window = limits.h2_stream_window
        self._connection_window = max(connection_window, _DEFAULT_WINDOW)
        self._max_header_list = max_header_list
        self._clock = clock
        now = clock()
        self._resets = TokenBucket(limits.h2_reset_burst, limits.h2_reset_rate, now)
        self._control = TokenBucket(limits.h2_control_burst, limits.h2_control_rate, now)
        self._control_per_stream = limits.h2_control_per_stream
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list)
        self._out: list[bytes] = []
        self._buffer = b""
        self._preface_seen = False
        self._settings_expected = True
        self._streams: dict[int, _Stream] = {}
        self._last_stream = 0
        # The header block being read: its stream, fragments, flags of its HEADERS frame.
        self._block_stream = 0
        self._block: list[bytes] = []
        self._block_size = 0
        self._block_end_stream = False
        self.block_started: float | None = None
        """When the header block being read began (None: none is): the owner bounds it
        in time, as CONTINUATION frames may trickle."""
        self._refusing = False
        self._goaway_last: int | None = None
        # An answer's first block starts by setting the client's table to 0 (RFC 7541,
        # 4.2, 6.3), and so does the first after the client changes the table's size:
        # gas indexes nothing, and a client that announced less than 4,096 bytes waits for
        # a size update before it reads any block.
        self._table_update = True
        self.ended = False
        # Flow control, in both directions (6.9).
        self._peer_window = _DEFAULT_WINDOW
        self._peer_stream_window = _DEFAULT_WINDOW
        self.max_outbound_frame_size = _DEFAULT_FRAME_SIZE
        self._receive_window = self._connection_window
        self._receive_unacked = 0

    # What the owner calls.

    def initiate(self) -> None:
        """Queues the server's preface: its SETTINGS, and the connection's window opened to
        `connection_window`."""
        settings = b"".join(
            _SETTING.pack(code, value)
            for code, value in (
                (_MAX_CONCURRENT_STREAMS, self._max_streams),
                (_INITIAL_WINDOW_SIZE, self._window),
                (_MAX_HEADER_LIST_SIZE, self._max_header_list),
            )
        )
        self._frame(_SETTINGS, 0, 0, settings)
        if self._connection_window > _DEFAULT_WINDOW:
            grant = self._connection_window - _DEFAULT_WINDOW
            self._frame(_WINDOW_UPDATE, 0, 0, _UINT32.pack(grant))

    def data_to_send(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)

    def receive(self, data: bytes) -> None:
        """Reads what arrived, calling the listener for each request, body part, reset and
        window update; raises ConnectionFailed when the client broke the protocol."""
        buffer = self._buffer + data if self._buffer else data
        offset = 0
        if not self._preface_seen:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(buffer):
                    self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._buffer = buffer
                return
            if not buffer.startswith(PREFACE):
                self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface_seen = True
            offset = len(PREFACE)
        view = memoryview(buffer)
        end = len(buffer)
        while end - offset >= 9:
            high, low, kind, flags, stream_id = _FRAME_HEADER.unpack_from(buffer, offset)
            length = (high << 8) | low
            if length > _DEFAULT_FRAME_SIZE:
                self._fail(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            if end - offset - 9 < length:
                break
            if self._settings_expected:
                if kind != _SETTINGS or flags & _ACK:
                    self._fail(PROTOCOL_ERROR, "the client's preface holds no SETTINGS")
                self._settings_expected = False
            payload = bytes(view[offset + 9 : offset + 9 + length])
            offset += 9 + length
            self._frame_received(kind, flags, stream_id & _MAX_WINDOW, payload)
        self._buffer = buffer[offset:] if offset < end else b""

    def send_headers(
        self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool
    ) -> None:
        if stream_id not in self._streams:
            return
        block = b"".join([_field(name, value) for name, value in headers])
        if self._table_update:
            self._table_update = False
            block = _TABLE_SIZE_ZERO + block
        size = self.max_outbound_frame_size
        flags = _END_STREAM if end_stream else 0
        if len(block) <= size:
            self._frame(_HEADERS, flags | _END_HEADERS, stream_id, block)
        else:
            self._frame(_HEADERS, flags, stream_id, block[:size])
            for start in range(size, len(block), size):
                last = start + size >= len(block)
                chunk = block[start : start + size]
                self._frame(_CONTINUATION, _END_HEADERS if last else 0, stream_id, chunk)
        if end_stream:
            self._close(stream_id)

    def window(self, stream_id: int) -> int:
        """What may be sent on the stream now: the least of its window and the
        connection's."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return min(stream.send_window, self._peer_window)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """Sends `data` on the stream as one DATA frame: the caller keeps it within `window`
        and `max_outbound_frame_size`."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.send_window -= len(data)
        self._peer_window -= len(data)
        self._frame(_DATA, _END_STREAM if end_stream else 0, stream_id, data)
        if end_stream:
            self._close(stream_id)

    def release(self, size: int) -> None:
        """Gives `size` body bytes back to the connection's window: the owner handed them
        to the app or dropped them. Sent in updates of at least a quarter of the window,
        or when the window ran low."""
        if size <= 0:
            return
        self._receive_unacked += size
        if (
            self._receive_unacked >= self._connection_window // 4
            or self._receive_window < self._connection_window // 2
        ):
            self._frame(_WINDOW_UPDATE, 0, 0, _UINT32.pack(self._receive_unacked))
            self._receive_window += self._receive_unacked
            self._receive_unacked = 0

    def reset_stream(self, stream_id: int, code: int = CANCEL) -> None:
        """Resets an open stream from the server's side (the owner gave up on it); the
        listener's `reset` is called."""
        if stream_id in self._streams:
            self._reset(stream_id, code, counted=False)

    def goaway(self, code: int = NO_ERROR) -> None:
        """Queues GOAWAY naming the last stream taken; streams opened after it are refused.
        The streams taken are still to be answered."""
        self._refusing = True
        self._goaway_last = self._last_stream
        self._frame(_GOAWAY, 0, 0, struct.pack(">LL", self._last_stream, code))

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # Frames received.

    def _frame_received(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block_stream and (kind != _CONTINUATION or stream_id != self._block_stream):
            self._fail(PROTOCOL_ERROR, "a header block interrupted")
        if _costs_without_request(kind, flags, payload):
            self._spend_control()
        if kind == _DATA:
            self._data(flags, stream_id, payload)
        elif kind == _HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == _CONTINUATION:
            if not self._block_stream:
                self._fail(PROTOCOL_ERROR, "CONTINUATION without a header block")
            self._fragment(payload, flags)
        elif kind == _SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == _WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _PING:
            if stream_id:
                self._fail(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                self._fail(FRAME_SIZE_ERROR, "PING of other than 8 bytes")
            if not flags & _ACK:
                self._frame(_PING, _ACK, 0, payload)
        elif kind == _RST_STREAM:
            if not stream_id:
                self._fail(PROTOCOL_ERROR, "RST_STREAM on the connection")
            if len(payload) != 4:
                self._fail(FRAME_SIZE_ERROR, "RST_STREAM of other than 4 bytes")
            self._idle_check(stream_id, "RST_STREAM")
            if not self._resets.take(self._clock()):
                self._fail(ENHANCE_YOUR_CALM, "streams reset faster than allowed")
            if self._streams.pop(stream_id, None) is not None:
                self._listener.reset(stream_id)
        elif kind == _PRIORITY:
            if not stream_id:
                self._fail(PROTOCOL_ERROR, "PRIORITY on the connection")
            if stream_id > self._last_stream or not stream_id % 2:
                return  # on an idle stream: allowed, and no stream to reset (6.3)
            if len(payload) != 5:
                self._reset(stream_id, FRAME_SIZE_ERROR)
            elif _UINT32.unpack_from(payload)[0] & _MAX_WINDOW == stream_id:
                self._reset(stream_id, PROTOCOL_ERROR)  # a stream depending on itself
        elif kind == _GOAWAY:
            if stream_id:
                self._fail(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                self._fail(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self.ended = True  # the client opens no more streams: the owner stops reading
        elif kind == _PUSH_PROMISE:
            self._fail(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Frames of other types are ignored (5.5).

    def _spend_control(self) -> None:
        if not self._control.take(self._clock()):
            self._fail(ENHANCE_YOUR_CALM, "frames without requests faster than allowed")

    def _idle_check(self, stream_id: int, what: str) -> None:
        # A client's streams are odd: an even one is never opened, so always idle.
        if stream_id > self._last_stream or not stream_id % 2:
            self._fail(PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")

    def _unpad(self, flags: int, payload: bytes, what: str) -> bytes:
        if not flags & _PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            self._fail(PROTOCOL_ERROR, f"{what} padding longer than the frame")
        return payload[1 : len(payload) - payload[0]]

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "DATA on the connection")
        length = len(payload)
        self._receive_window -= length
        if self._receive_window < 0:
            self._fail(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        # The connection's window comes back only through `release`: what the owner was
        # handed stays counted until it is handed on or dropped.
        data = self._unpad(flags, payload, "DATA")
        stream = self._streams.get(stream_id)
        if stream is None:
            self._idle_check(stream_id, "DATA")
            self.release(length)  # a stream reset or answered: dropped (5.4.2)
            return
        if stream.remote_ended:
            self.release(length)
            self._reset(stream_id, STREAM_CLOSED)
            return
        stream.receive_window -= length
        if stream.receive_window < 0:
            self.release(length)
            self._reset(stream_id, FLOW_CONTROL_ERROR)
            return
        self.release(length - len(data))  # the padding
        stream.received += len(data)
        end = bool(flags & _END_STREAM)
        if not end and stream.receive_window < self._window // 2:
            given = self._window - stream.receive_window
            self._frame(_WINDOW_UPDATE, 0, stream_id, _UINT32.pack(given))
            stream.receive_window = self._window
        if stream.declared is not None and (
            stream.received > stream.declared or (end and stream.received != stream.declared)
        ):
            self.release(len(data))
            self._reset(stream_id, PROTOCOL_ERROR)  # body and content-length disagree
            return
        if end:
            stream.remote_ended = True
        self._listener.data(stream_id, data, end)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "HEADERS on the connection")
        fragment = self._unpad(flags, payload, "HEADERS")
        if flags & _PRIORITY_FLAG:
            if len(fragment) < 5:
                self._fail(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if _UINT32.unpack_from(fragment)[0] & _MAX_WINDOW == stream_id:
                self._fail(PROTOCOL_ERROR, "a stream depending on itself")
            fragment = fragment[5:]
        self._block_stream = stream_id
        self._block = []
        self._block_size = 0
        self._block_end_stream = bool(flags & _END_STREAM)
        self.block_started = self._clock()
        self._fragment(fragment, flags)

    def _fragment(self, fragment: bytes, flags: int) -> None:
        if fragment:
            self._block.append(fragment)
        # A block is bounded as its decoded list is: HPACK's literals are never longer
        # than twice their text, and the limit is counted with 32 bytes a field. Each
        # frame's header counts too, so empty CONTINUATION frames cannot go on for ever
        # (RFC 9113, 10.5).
        self._block_size += len(fragment) + 9
        if self._block_size > 2 * self._max_header_list + _DEFAULT_FRAME_SIZE:
            self._fail(PROTOCOL_ERROR, "a header block over the header list limit")
        if flags & _END_HEADERS:
            stream_id, self._block_stream = self._block_stream, 0
            self.block_started = None
            block = b"".join(self._block)
            self._block = []
            self._block_complete(stream_id, block)

    def _block_complete(self, stream_id: int, block: bytes) -> None:
        try:
            headers = [(name, value) for name, value in self._decode(block)]
        except hpack.OversizedHeaderListError:
            self._fail(PROTOCOL_ERROR, "a header list over the limit")
        except hpack.HPACKError as exc:
            self._fail(COMPRESSION_ERROR, f"a header block HPACK cannot read: {exc}")
        end_stream = self._block_end_stream
        stream = self._streams.get(stream_id)
        if stream is not None:
            # Trailers: they end the request and are not read (gas's requests carry none).
            if not end_stream or stream.remote_ended:
                self._fail(PROTOCOL_ERROR, "a second header block that does not end the stream")
            if any(name.startswith(b":") for name, _ in headers):
                self._fail(PROTOCOL_ERROR, "a pseudo-header in trailers")
            if stream.declared is not None and stream.received != stream.declared:
                self._reset(stream_id, PROTOCOL_ERROR)  # body and content-length disagree
                return
            stream.remote_ended = True
            self._listener.data(stream_id, b"", True)
            return
        if stream_id % 2 == 0:
            self._fail(PROTOCOL_ERROR, f"a client stream of even number {stream_id}")
        if stream_id <= self._last_stream:
            self._spend_control()
            return  # on a stream already answered or reset: in flight, and dropped (5.4.2)
        self._last_stream = stream_id
        self._control.give(self._control_per_stream)
        if self._refusing:
            self._frame(_RST_STREAM, 0, stream_id, _UINT32.pack(REFUSED_STREAM))
            return
        if len(self._streams) >= self._max_streams:
            self._fail(PROTOCOL_ERROR, f"more than {self._max_streams} streams open")
        declared = _check_request(headers, self._fail)
        self._streams[stream_id] = _Stream(
            send_window=self._peer_stream_window,
            receive_window=self._window,
            declared=declared,
            remote_ended=end_stream,
        )
        if end_stream and declared:
            self._reset(stream_id, PROTOCOL_ERROR)  # a length declared, and no body
            return
        self._listener.request(stream_id, headers, end_stream)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        return self._decoder.decode(block, raw=True)  # type: ignore[return-value]

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            self._fail(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            if payload:
                self._fail(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            self._fail(FRAME_SIZE_ERROR, "SETTINGS not a whole number of settings")
        for offset in range(0, len(payload), 6):
            code, value = _SETTING.unpack_from(payload, offset)
            if code == _HEADER_TABLE_SIZE:
                self._table_update = True
            elif code == _ENABLE_PUSH:
                if value > 1:
                    self._fail(PROTOCOL_ERROR, "ENABLE_PUSH other than 0 or 1")
            elif code == _INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    self._fail(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE over 2^31-1")
                delta = value - self._peer_stream_window
                self._peer_stream_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > _MAX_WINDOW:
                        self._fail(FLOW_CONTROL_ERROR, "a stream's window over 2^31-1")
                if delta > 0:
                    for opened in list(self._streams):
                        self._listener.window_opened(opened)
            elif code == _MAX_FRAME_SIZE:
                if not _DEFAULT_FRAME_SIZE <= value <= 2**24 - 1:
                    self._fail(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.max_outbound_frame_size = value
            # MAX_CONCURRENT_STREAMS limits pushes, which gas never makes; the peer's
            # MAX_HEADER_LIST_SIZE is advice, and gas's answers carry a few fields.
        self._frame(_SETTINGS, _ACK, 0, b"")

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "WINDOW_UPDATE of other than 4 bytes")
        increment = _UINT32.unpack(payload)[0] & _MAX_WINDOW
        if not stream_id:
            if not increment:
                self._fail(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self._peer_window += increment
            if self._peer_window > _MAX_WINDOW:
                self._fail(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
            self._listener.window_opened(0)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            self._idle_check(stream_id, "WINDOW_UPDATE")
            return
        if not increment:
            self._reset(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > _MAX_WINDOW:
            self._reset(stream_id, FLOW_CONTROL_ERROR)
            return
        self._listener.window_opened(stream_id)

    # Helpers.

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        self._out.append(
            _FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload
        )

    def _close(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None and not stream.remote_ended:
            # Answered before the whole request came (a body over the limit): the client
            # is to stop sending it (8.1).
            self._frame(_RST_STREAM, 0, stream_id, _UINT32.pack(NO_ERROR))

    def _reset(self, stream_id: int, code: int, counted: bool = True) -> None:
        """A stream error: the stream is reset, the owner told. One the peer's frames
        caused takes from the same budget as the peer's own resets: a peer that makes the
        server reset its streams frees their slots as fast as by resetting them
        (CVE-2025-8671, "MadeYouReset")."""
        if counted and not self._resets.take(self._clock()):
            self._fail(ENHANCE_YOUR_CALM, "streams reset faster than allowed")
        self._frame(_RST_STREAM, 0, stream_id, _UINT32.pack(code))
        if self._streams.pop(stream_id, None) is not None:
            self._listener.reset(stream_id)

    def _fail(self, code: int, message: str) -> NoReturn:
        self.ended = True
        # A second GOAWAY never names a later stream than the first (RFC 9113, 6.8).
        last = self._last_stream if self._goaway_last is None else self._goaway_last
        self._frame(_GOAWAY, 0, 0, struct.pack(">LL", last, code))
        raise ConnectionFailed(code, message)


def _costs_without_request(kind: int, flags: int, payload: bytes) -> bool:
    """Whether a frame is one that makes the server work without bringing a request or
    its body: what a flood is made of (RFC 9113, 10.5)."""
    if kind in (_SETTINGS, _PING):
        return not flags & _ACK
    if kind in (_PRIORITY, _WINDOW_UPDATE):
        return True
    if kind == _DATA:
        return not payload and not flags & _END_STREAM
    if kind == _CONTINUATION:
        return not payload and not flags & _END_HEADERS
    return kind > _CONTINUATION  # a type gas does not know, ignored


def _field(name: bytes, value: bytes) -> bytes:
    """One answer header field in HPACK: the static table's entry when it holds the field
    (`:status: 200`), else a literal without indexing (RFC 7541, 6.2.2), its name from the
    static table where it is there. Added to no table, gas's fields leave the client's
    table as it is, so a field is written the same each time and is written once (hpack's
    encoder took about 30 us an answer)."""
    key = (name, value)
    written = _FIELDS.get(key)
    if written is None:
        if len(_FIELDS) >= _FIELDS_KEPT:
            _FIELDS.clear()  # answers' lengths vary: a bound on what is kept
        whole = _STATIC_FIELDS.get(key)
        if whole is not None:
            indexed = encode_integer(whole, 7)
            indexed[0] |= 0x80
            written = bytes(indexed)
        else:
            named = _STATIC_NAMES.get(name)
            head = b"\x00" + _string(name) if named is None else bytes(encode_integer(named, 4))
            written = head + _string(value)
        _FIELDS[key] = written
    return written


def _string(data: bytes) -> bytes:
    """An HPACK string literal, not Huffman coded."""
    return bytes(encode_integer(len(data), 7)) + data


# The static table (RFC 7541, appendix A), by field and by name (the first index of each).
_STATIC_FIELDS = {field: index for index, field in enumerate(HeaderTable.STATIC_TABLE, start=1)}
_STATIC_NAMES: dict[bytes, int] = {}
for _index, (_name, _) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_NAMES.setdefault(_name, _index)
_FIELDS: dict[tuple[bytes, bytes], bytes] = {}
_FIELDS_KEPT = 4096


def _check_request(headers: list[tuple[bytes, bytes]], fail: _Fail) -> int | None:
    """Checks a request's header list as 8.1.2 and 8.3 ask (a malformed one ends the
    connection); returns its content-length, if it declares one."""
    seen: set[bytes] = set()
    regular = False
    declared: int | None = None
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                fail(PROTOCOL_ERROR, "a pseudo-header after a regular field")
            if name not in _REQUEST_PSEUDO:
                fail(PROTOCOL_ERROR, f"pseudo-header {name!r} in a request")
            if name in seen:
                fail(PROTOCOL_ERROR, f"a second {name!r}")
            if name == b":path" and not value:
                fail(PROTOCOL_ERROR, "an empty :path")
            seen.add(name)
        else:
            regular = True
            if not name or name.translate(None, _NAME_REFUSED) != name:
                fail(PROTOCOL_ERROR, f"field name {name!r} is not lower case or not a token")
            if name in _CONNECTION_FIELDS:
                fail(PROTOCOL_ERROR, f"connection-specific field {name!r}")
            if name == b"te" and value != b"trailers":
                fail(PROTOCOL_ERROR, "te other than trailers")
            if name == b"content-length":
                if (
                    not value.isdigit()
                    or len(value) > _LENGTH_DIGITS
                    or (declared is not None and int(value) != declared)
                ):
                    fail(PROTOCOL_ERROR, "a content-length that is not one number")
                declared = int(value)
        if value.translate(None, _VALUE_REFUSED) != value or (
            value and (value[0] in _WHITESPACE or value[-1] in _WHITESPACE)
        ):
            fail(PROTOCOL_ERROR, f"field {name!r} holds a byte a value may not")
    if not {b":method", b":scheme", b":path"} <= seen:
        fail(PROTOCOL_ERROR, "a request without :method, :scheme and :path")
    return declared


class _Fail(Protocol):
    def __call__(self, code: int, message: str) -> NoReturn: ...
