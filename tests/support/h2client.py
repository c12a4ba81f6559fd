"""A blocking HTTP/2 client over mutual TLS (the `h2` package's protocol, a real TLS socket),
for tests of gas's HTTP/2 serving: several streams at once, their answers in the order
they finished, and raw frames for the protocol's error cases."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings

from tests.support.gasproc import TLSFiles


@dataclass
class Response:
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    ended: bool = False
    reset: int | None = None
    """The error code of a RST_STREAM from the server."""


class H2Client:
    def __init__(
        self,
        port: int,
        tls: TLSFiles,
        alpn: tuple[str, ...] = ("h2", "http/1.1"),
        timeout: float = 10.0,
    ) -> None:
        context = ssl.create_default_context(cafile=tls.ca)
        context.load_cert_chain(tls.client_cert, tls.client_key)
        context.set_alpn_protocols(list(alpn))
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        # As Go's clients: a request's HEADERS and DATA frames do not wait for an ACK.
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        self.protocol = self.sock.selected_alpn_protocol()
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.responses: dict[int, Response] = {}
        self.finished: list[int] = []
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self.server_settings: dict[int, int] = {}
        if self.protocol == "h2":
            self.conn.initiate_connection()
            self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),),
        content_length: bool = True,
    ) -> int:
        """Opens a stream and sends the whole request; its id."""
        stream_id = self.conn.get_next_available_stream_id()
        head = [
            (":method", method),
            (":path", path),
            (":scheme", "https"),
            (":authority", "127.0.0.1"),
            *headers,
        ]
        if body and content_length:
            head.append(("content-length", str(len(body))))
        self.responses[stream_id] = Response()
        self.conn.send_headers(stream_id, head, end_stream=not body)
        self.flush()
        view = memoryview(body)
        while view:
            window = min(
                self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size
            )
            if self.responses[stream_id].ended or self.responses[stream_id].reset is not None:
                break  # answered (413) before the whole body went
            if window <= 0:
                self.read_once()
                continue
            chunk, view = view[:window], view[window:]
            self.conn.send_data(stream_id, bytes(chunk), end_stream=not view)
            self.flush()
        return stream_id

    def wait(self, stream_id: int) -> Response:
        response = self.responses[stream_id]
        while not (response.ended or response.reset is not None):
            if not self.read_once():
                raise ConnectionError(f"connection ended before stream {stream_id} was answered")
        return response

    def request(self, method: str, path: str, body: bytes = b"") -> Response:
        return self.wait(self.start(method, path, body))

    def read_once(self) -> bool:
        """Reads and handles what the server sent: False once the connection ended."""
        if self.closed:
            return False
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            return False
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                response = self.responses[event.stream_id]
                for name, value in event.headers or ():
                    if name == b":status":
                        response.status = int(value)
                    else:
                        response.headers.append((name.decode(), value.decode()))
            elif isinstance(event, h2.events.DataReceived):
                self.responses[event.stream_id].body += event.data or b""
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.responses[event.stream_id].ended = True
                self.finished.append(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.responses[event.stream_id].reset = int(event.error_code or 0)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                for code, change in event.changed_settings.items():
                    self.server_settings[int(code)] = change.new_value
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.terminated = event
                # h2 takes nothing after a GOAWAY, but the server still answers the
                # streams up to its last_stream_id (RFC 9113, section 6.8), as Go's
                # client expects: read on.
                self.conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        self.flush()
        return True

    def settings(self) -> dict[int, int]:
        """The server's SETTINGS, read until they came."""
        while not self.server_settings:
            if not self.read_once():
                break
        return self.server_settings

    def close(self) -> None:
        try:
            if self.protocol == "h2" and not self.closed:
                self.conn.close_connection()
                self.flush()
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MAX_CONCURRENT_STREAMS = int(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
