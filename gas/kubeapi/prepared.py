"""Requests with prepared JSON bodies over the official client's own connection pool.

The generated client builds and validates a model for every body, sanitises it back into a
dict and encodes it with the standard library: for the one write kube-scheduler waits on,
the Binding, that costs more than the write itself (p50 6.5 ms through the models against
2.8 ms as prepared JSON, measured against a real kube-apiserver). These requests skip the
models but nothing else the client settles from its configuration: they use the same
kept-alive connections of the client's urllib3 pool (host, CA, client certificate, TLS
server name; through a proxy, urllib3's own request path) with the same headers, and read
the credentials through `Configuration.auth_settings()`, so a token that the configuration
refreshes (exec plugins, projected service-account tokens) is used once it changes (see
CREDENTIALS_SECONDS). Unlike the generated calls, they follow no redirect: the API server
sends none for these requests, and a 3xx is then an answer like any other (for a Binding,
an outcome gas cannot know), not a reason to send the Binding and its credentials on.

Without a proxy, a request is written as one prepared block of bytes on a connection taken
from the pool, and its answer read by httptools (llhttp, in C): urllib3's own request path
(retry and timeout objects, header checks on every request, a response wrapper, head and
body in two sends) cost a Binding twice the CPU of writing it this way, and the standard
library's response parser, which reads the headers through the `email` package, took 80 us
to read a Binding's answer where httptools takes 2 us. The answer is read as http.client
reads one (its status line and header limits, a 100 Continue skipped, the connection kept
unless http.client would close it; see `_read_reply`). The header block is checked and
built once per credentials read. As urllib3 does, a connection is re-opened when the API
server has closed it while idle; a failure to connect is tried again (nothing was sent), a
failed GET once more on a new connection, and a failed POST never (it may have been
applied).
"""

from __future__ import annotations

import http.client
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode

import httptools
import urllib3
from kubernetes import client

from gas.kubeapi.core import EVENTS_PATH, POD_PATH

CREDENTIALS_SECONDS = 1.0
"""How long credentials read from the configuration are used before being read again.

Reading them runs the configuration's refresh hook, through which the kubeconfig and
in-cluster loaders reload an expiring token; the hook also assigns the host again, which
scans the process environment for proxies: a tenth of a bind's CPU, read every request
(more in a pod whose namespace has many services, each adding environment variables). A
token the loader replaced is in use within this long, and a 401 answer reads the
credentials again at once and sends the request once more."""


class Reply(NamedTuple):
    """The API server's answer, read to the end (its connection back in the pool)."""

    status: int
    reason: str
    data: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


BINDING_PATH = POD_PATH + "/binding"


CONNECT_ATTEMPTS = 4
"""Attempts to open a connection for one request, as urllib3's default retries make (a
`retries` set in the client's configuration applies to the requests through a proxy only)."""

# What http.client refuses in a request target and in header names and values.
_BAD_TARGET = re.compile("[\x00-\x20\x7f]")
_HEADER_NAME = re.compile(r"[^:\s][^:\r\n]*")
_BAD_HEADER_VALUE = re.compile(r"\n(?![ \t])|\r(?![ \t\n])")


class _Credentials(NamedTuple):
    read_at: float
    headers: dict[str, str]  # the client's headers with the credentials
    json_headers: dict[str, str]  # the same, for a JSON body
    query: str  # "" or "?" and credentials that go in the query
    block: bytes  # `headers` as written on the wire, with the Host header


class PreparedApi:
    """Prepared requests to the API server of `api_client`'s configuration. Thread-safe,
    as its pool is.

    The operations carry the names of the generated client's (`CoreV1Api`), so what gas
    calls, and the RBAC rules it needs, read the same whichever way a call is made."""

    def __init__(
        self, api_client: client.ApiClient, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._configuration: Any = api_client.configuration
        self._pool: urllib3.PoolManager = api_client.rest_client.pool_manager
        # Without a trailing slash, so that a host with a path joins the API's paths once.
        self._host: str = str(self._configuration.host).rstrip("/")
        self._safe: str = self._configuration.safe_chars_for_path_param
        self._clock = clock
        headers: dict[str, str] = {str(k): str(v) for k, v in api_client.default_headers.items()}
        if api_client.cookie:
            headers["Cookie"] = str(api_client.cookie)
        headers["Accept"] = "application/json"
        self._headers = headers
        self._credentials: _Credentials | None = None
        # Straight to the host's connection pool, as the manager would pick it, without
        # parsing the URL each time; through a proxy, the manager's own routing.
        url = urllib3.util.parse_url(self._host)
        self._direct = type(self._pool) is urllib3.PoolManager
        self._scheme = url.scheme or "http"
        self._hostname = url.host or ""
        self._port = url.port
        self._prefix = (url.path or "").rstrip("/")
        if _BAD_TARGET.search(self._prefix):
            raise ValueError(f"the API server's address {self._host!r} has a path gas cannot send")
        # As http.client writes it: the port only when it is not the scheme's own.
        default_port = 443 if self._scheme == "https" else 80
        netloc = self._hostname.rstrip(".")
        if self._port is not None and self._port != default_port:
            netloc = f"{netloc}:{self._port}"
        self._host_header = netloc
        self._connections: Any = None

    def read_namespaced_pod(self, name: str, namespace: str, timeout: tuple[float, float]) -> Reply:
        """GET the pod (RBAC: `get` on pods)."""
        return self.request(
            "GET", self.path(POD_PATH, namespace=namespace, name=name), None, timeout
        )

    def create_namespaced_pod_binding(
        self, name: str, namespace: str, body: bytes, timeout: tuple[float, float]
    ) -> Reply:
        """POST a Binding, JSON-encoded, to the pod's `binding` subresource (RBAC: `create`
        on pods/binding)."""
        return self.request(
            "POST", self.path(BINDING_PATH, namespace=namespace, name=name), body, timeout
        )

    def create_namespaced_event(
        self, namespace: str, body: bytes, timeout: tuple[float, float]
    ) -> Reply:
        """POST a core/v1 Event, JSON-encoded (RBAC: `create` on events)."""
        return self.request("POST", self.path(EVENTS_PATH, namespace=namespace), body, timeout)

    def path(self, template: str, **params: str) -> str:
        """`template` with each `{name}` replaced by its parameter, percent-encoded as the
        generated client encodes path parameters."""
        return template.format(**{k: quote(v, safe=self._safe) for k, v in params.items()})

    def request(
        self, method: str, path: str, body: bytes | None, timeout: tuple[float, float]
    ) -> Reply:
        """Send `body` (JSON) to `path`; the reply whatever its status. Transport failures
        (connection refused, TLS, timeouts, a connection lost) raise `OSError`, or
        http.client's or urllib3's exceptions."""
        credentials = self._credentials
        reread = credentials is None or self._clock() - credentials.read_at >= CREDENTIALS_SECONDS
        if credentials is None or reread:
            credentials = self._read_credentials()
        reply = self._send(method, path, body, timeout, credentials)
        if reply.status == 401 and not reread:
            # Refused unread (401 comes before anything is applied): the token may have
            # been replaced since it was read.
            reply = self._send(method, path, body, timeout, self._read_credentials())
        return reply

    def _read_credentials(self) -> _Credentials:
        headers = dict(self._headers)
        query: list[tuple[str, str]] = []
        for setting in self._configuration.auth_settings().values():
            value = setting.get("value")
            if value is None:
                continue
            if setting["in"] == "header":
                headers[setting["key"]] = str(value)
            elif setting["in"] == "query":
                query.append((setting["key"], str(value)))
        json_headers = dict(headers, **{"Content-Type": "application/json"})
        suffix = "?" + urlencode(query) if query else ""
        credentials = _Credentials(
            self._clock(), headers, json_headers, suffix, self._header_block(headers)
        )
        self._credentials = credentials
        return credentials

    def _header_block(self, headers: dict[str, str]) -> bytes:
        """`headers` (without the body's), checked as http.client checks them and written
        as they go on the wire, with Host and, unless given, an identity encoding."""
        lines = {"host": f"Host: {self._host_header}\r\n"}
        for name, value in headers.items():
            if not _HEADER_NAME.fullmatch(name) or _BAD_HEADER_VALUE.search(value):
                raise ValueError(f"header {name!r} cannot be sent: a line break or a bad name")
            lines[name.lower()] = f"{name}: {value}\r\n"
        lines.setdefault("accept-encoding", "Accept-Encoding: identity\r\n")
        return "".join(lines.values()).encode("latin-1")

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        timeout: tuple[float, float],
        credentials: _Credentials,
    ) -> Reply:
        if self._direct:
            return self._write(method, path + credentials.query, body, timeout, credentials)
        headers = credentials.headers if body is None else credentials.json_headers
        response = self._pool.urlopen(
            method,
            self._host + path + credentials.query,
            body=body,
            headers=headers,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            preload_content=True,
            redirect=False,
        )
        return Reply(response.status, response.reason or "", response.data)

    def _write(
        self,
        method: str,
        target: str,
        body: bytes | None,
        timeout: tuple[float, float],
        credentials: _Credentials,
    ) -> Reply:
        if _BAD_TARGET.search(target):
            raise ValueError(f"request target {target!r} cannot be sent")
        head = f"{method} {self._prefix}{target} HTTP/1.1\r\n".encode() + credentials.block
        if body is None:
            request = head + b"\r\n"
        else:
            request = b"%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                head,
                len(body),
                body,
            )
        connections = self._connections
        if connections is None or connections.pool is None:  # none yet, or closed
            connections = self._connections = self._pool.connection_from_host(
                self._hostname, port=self._port, scheme=self._scheme
            )
        opened = 0
        again = method == "GET"
        fresh = False  # the one more GET goes on a connection of its own
        while True:
            # A kept connection the API server closed while idle comes back closed.
            conn = connections._get_conn()
            done = False
            try:
                if fresh and conn.sock is not None:
                    conn.close()
                reused = conn.sock is not None
                if not reused:
                    opened += 1
                    conn.timeout = timeout[0]
                    try:
                        conn.connect()
                    except Exception:
                        if opened < CONNECT_ATTEMPTS:
                            continue  # nothing was sent
                        raise
                conn.sock.settimeout(timeout[1])
                try:
                    conn.sock.sendall(request)
                    reply, will_close = _read_reply(conn.sock)
                except Exception:
                    if reused and again:
                        again, fresh = False, True
                        continue  # a connection lost while idle: once more, on a new one
                    raise
                if will_close:
                    conn.close()
                done = True
                return reply
            finally:
                if not done:
                    conn.close()
                connections._put_conn(conn)


# http.client's limits on an answer's head: a longer line or more headers is refused.
_MAXLINE = 65536
_MAXHEADERS = 100
_RECEIVE = 65536
# The headers http.client decides an answer's framing and the connection's reuse by.
_FRAMING = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"content-length", b"transfer-encoding"}
)


class _Answer:
    """What httptools' parser reports of an answer, as its callbacks (names are its own)."""

    __slots__ = ("body", "complete", "count", "headers", "headers_done", "overlong", "reason")

    def __init__(self) -> None:
        self.on_message_begin()

    def on_message_begin(self) -> None:
        # Also after a 100 Continue, whose head http.client skips: the answer starts over.
        self.reason = b""
        self.headers: dict[bytes, bytes] = {}
        self.count = 0
        self.overlong = ""
        self.body: list[bytes] = []
        self.headers_done = False
        self.complete = False

    def on_status(self, reason: bytes) -> None:
        self.reason += reason  # in pieces when the status line came in pieces
        if len(self.reason) > _MAXLINE:
            self.overlong = "status line"

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count += 1
        if len(name) + len(value) > _MAXLINE:
            self.overlong = "header line"
        key = name.lower()
        if key in _FRAMING and key not in self.headers:
            self.headers[key] = value  # the first, as http.client's message.get reads it

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def check(self) -> None:
        """Refuse a head http.client would refuse for its size."""
        if self.overlong:
            raise http.client.LineTooLong(self.overlong)
        if self.count > _MAXHEADERS:
            raise http.client.HTTPException(f"got more than {_MAXHEADERS} headers")

    def content_length(self) -> int | None:
        """The body's declared length, ignored when chunked as http.client ignores it (one
        that is not a number llhttp has refused already; http.client read on to the end)."""
        length = self.headers.get(b"content-length")
        return None if length is None or self.chunked() else int(length)

    def chunked(self) -> bool:
        return self.headers.get(b"transfer-encoding", b"").lower() == b"chunked"

    def will_close(self, version: str, status: int) -> bool:
        """Whether http.client would close the connection after this answer
        (`HTTPResponse._check_close`, and a body that only the connection's end delimits)."""
        connection = self.headers.get(b"connection", b"").lower()
        if version == "1.1":
            closes = b"close" in connection
        else:
            closes = not (
                self.headers.get(b"keep-alive")
                or b"keep-alive" in connection
                or b"keep-alive" in self.headers.get(b"proxy-connection", b"").lower()
            )
        bodiless = status in (204, 304) or 100 <= status < 200
        return closes or not (self.chunked() or bodiless or self.content_length() is not None)


def _read_reply(sock: Any) -> tuple[Reply, bool]:
    """The answer to the GET or POST just written on `sock` (a HEAD's would be read as
    having the body its length announces), and whether the connection must then be
    closed. Raises what http.client raises for an answer cut short
    (`RemoteDisconnected` before any byte, `IncompleteRead` after some, `LineTooLong`),
    httptools' `HttpParserError` for one that is malformed, `OSError` (a timeout too) for
    the socket's failures."""
    answer = _Answer()
    parser = httptools.HttpResponseParser(answer)
    received = False
    while True:
        data = sock.recv(_RECEIVE)
        if not data:
            if not received or (answer.complete and parser.get_status_code() == 100):
                raise http.client.RemoteDisconnected(
                    "Remote end closed connection without response"
                )
            length = answer.content_length()
            if not answer.headers_done or answer.chunked() or length is not None:
                got = b"".join(answer.body)
                raise http.client.IncompleteRead(
                    got, None if length is None else max(length - len(got), 0)
                )
            break  # the body ends where the connection does
        received = True
        parser.feed_data(data)
        answer.check()
        if answer.complete and parser.get_status_code() != 100:
            break
    status = parser.get_status_code()
    reason = answer.reason.decode("iso-8859-1").strip()
    will_close = answer.will_close(parser.get_http_version(), status)
    return Reply(status, reason, b"".join(answer.body)), will_close
