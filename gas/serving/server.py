"""Serve the extender's Flask app with gunicorn, in-process, over HTTPS.

One worker process with a pool of threads: the ledger lives in process memory, and a
second worker would hold a second, diverging ledger. The app is built inside the worker
(``preload_app`` off) because it starts background threads (list+watch), and threads do not
survive the fork from the gunicorn master.

TLS goes through gunicorn's ``ssl_context`` hook so that the policy of
``gas.serving.tls.server_ssl_context`` applies (TLS >= 1.2, ECDHE+AEAD, optional mTLS) rather than
gunicorn's defaults. gunicorn asks the hook for a context on every new connection; the hook
hands out one cached context and rebuilds it when the certificate files change, so a
renewed certificate (cert-manager, a rotated Secret) is picked up without a restart.
"""

from __future__ import annotations

import errno
import gc
import logging
import math
import os
import re
import select
import signal
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from gunicorn.app.base import BaseApplication  # type: ignore[import-untyped]
from gunicorn.arbiter import Arbiter  # type: ignore[import-untyped]
from gunicorn.workers.gthread import (  # type: ignore[import-untyped]
    _DEFER,
    DEFAULT_WORKER_DATA_TIMEOUT,
    ThreadWorker,
)

from gas.serving import direct, http2, logformat, routes
from gas.serving.tls import ALPN_PROTOCOLS, TLS12_CIPHERS, TLSConfigError, server_ssl_context

if TYPE_CHECKING:
    import flask

__all__ = ["DEFAULT_PORT", "ServerSettings", "build_options", "serve"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 9001

# gunicorn's parser never accepts a longer request line than this, whatever it is told.
_GUNICORN_MAX_REQUEST_LINE = 8190

# How often, at most, the certificate files are checked for a change.
_RELOAD_CHECK_INTERVAL = 1.0

_FileStamp = tuple[int, int, int, int] | None


def _stamp(path: str) -> _FileStamp:
    # stat() follows symlinks, so the atomic "..data" symlink swap that Kubernetes does
    # when a mounted Secret changes shows up as a new inode.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _ReloadingContext:
    """gunicorn ``ssl_context`` hook: one shared context, rebuilt when its files change.

    A failed rebuild (files caught half-rotated, key not matching the new certificate yet)
    keeps the previous context and is retried when the files change again.
    """

    def __init__(
        self,
        certfile: str,
        keyfile: str,
        cafile: str | None,
        handshake_timeout: float | None,
        alpn_protocols: tuple[str, ...] = ALPN_PROTOCOLS,
    ) -> None:
        self._alpn_protocols = alpn_protocols
        self._certfile = certfile
        self._keyfile = keyfile
        self._cafile = cafile
        self._handshake_timeout = handshake_timeout
        self._paths = tuple(p for p in (certfile, keyfile, cafile) if p is not None)
        self._stamps = self._current_stamps()
        self._context = self._build()
        self._next_check = time.monotonic() + _RELOAD_CHECK_INTERVAL
        self._lock = threading.Lock()

    def _current_stamps(self) -> tuple[_FileStamp, ...]:
        return tuple(_stamp(p) for p in self._paths)

    def _build(self) -> ssl.SSLContext:
        return server_ssl_context(
            self._certfile,
            self._keyfile,
            self._cafile,
            handshake_timeout=self._handshake_timeout,
            alpn_protocols=self._alpn_protocols,
        )

    def __call__(
        self, config: Any, default_factory: Callable[[], ssl.SSLContext]
    ) -> ssl.SSLContext:
        if time.monotonic() >= self._next_check and self._lock.acquire(blocking=False):
            # Connections arriving while another thread checks use the current context.
            try:
                self._next_check = time.monotonic() + _RELOAD_CHECK_INTERVAL
                self._maybe_reload()
            finally:
                self._lock.release()
        return self._context

    def _maybe_reload(self) -> None:
        stamps = self._current_stamps()
        if stamps == self._stamps:
            return
        self._stamps = stamps
        if None in stamps:
            log.warning("TLS files changed and one is missing; keeping the current certificate")
            return
        try:
            context = self._build()
        except TLSConfigError as exc:
            log.error("TLS files changed but cannot be loaded, keeping the current ones: %s", exc)
            return
        self._context = context
        log.info("TLS certificate reloaded from %s", self._certfile)


def _bind_address(host: str, port: int) -> str:
    bare = host.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    if not bare:
        raise ValueError("host must not be empty (use 0.0.0.0 or ::)")
    if ":" in bare:
        return f"[{bare}]:{port}"
    return f"{bare}:{port}"


def _worker_tmp_dir() -> str | None:
    # gunicorn's heartbeat file. /tmp may be read-only in a container (the worker then
    # cannot start) or on a disk slow enough to make a healthy worker look hung.
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def _thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, '?')} ({ident}) ---\n")
        parts.extend(traceback.format_stack(frame))
    return "".join(parts)


def _on_worker_abort(worker: Any) -> None:
    # SIGABRT from the master means the worker's main loop stopped reporting for `timeout`
    # seconds. The stacks show where it was stuck; the master then starts a new worker,
    # which rebuilds its state from the cluster.
    worker.log.critical(
        "worker %s aborted (SIGABRT: the master sends it when the worker misses its "
        "heartbeat for the timeout); thread stacks:\n%s",
        worker.pid,
        _thread_stacks(),
    )


def _make_worker_exit_hook(
    on_worker_exit: Callable[[], None] | None,
) -> Callable[[Any, Any], None]:
    def worker_exit(server: Any, worker: Any) -> None:
        # Runs in the worker after it stopped serving, before the interpreter joins
        # non-daemon threads: the last chance to stop background threads cleanly.
        worker.log.info("worker %s stopped serving", worker.pid)
        if on_worker_exit is None:
            return
        try:
            on_worker_exit()
        except Exception:
            worker.log.exception("on_worker_exit callback failed")

    return worker_exit


class _SingleWorkerArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's master, minus the signals that would run two workers at once.

    Stock gunicorn adds a worker on SIGTTIN, starts a second master with its own workers on
    SIGUSR2, and on SIGHUP starts the new worker before the old one has stopped. Each of
    those would put a second ledger next to the first, both binding pods.
    """

    def handle_ttin(self) -> None:
        self.log.warning("SIGTTIN ignored: gas runs exactly one worker process")

    def handle_ttou(self) -> None:
        self.log.warning("SIGTTOU ignored: gas runs exactly one worker process")

    def handle_usr2(self) -> None:
        self.log.warning("SIGUSR2 ignored: a second master would run a second worker")

    def handle_hup(self) -> None:
        # Stop first; the main loop starts the replacement once the old worker is reaped.
        # Requests arriving in between wait in the listen backlog.
        self.log.info("SIGHUP: restarting the worker")
        self.kill_workers(signal.SIGTERM)


# Slow clients. Stock gthread hands a connection to a thread as soon as its first byte
# arrives, and the thread then blocks until the whole request is in: a few clients that
# send their headers or body a byte at a time hold every thread forever (slowloris), and
# kube-scheduler's requests wait behind them. So a request is first collected without a
# thread: each time the socket is readable a thread takes what is there, without
# blocking, and hands the connection back to gunicorn's poller until the request is
# complete (up to _PREBUFFER_LIMIT bytes, which bounds memory per connection). A client
# gets REQUEST_READ_TIMEOUT seconds from its first byte to deliver the whole request;
# past that it is disconnected, and a body larger than the prebuffer limit is read with
# the same deadline on every blocking read. kube-scheduler sends a request in
# milliseconds, so neither limit touches it.
REQUEST_READ_TIMEOUT = 30.0
_PREBUFFER_LIMIT = 512 * 1024
_HEAD_LIMIT = 64 * 1024
_TLS_RECORD = 16 * 1024  # the most plaintext one TLS record carries
_EARLY_CHECKS = 2
"""Reads shorter than a TLS record after which a request is checked for completeness
before the socket is found drained: two cover kube-scheduler's requests (a small one in
one write; a larger one as Go's 4 kB buffer, then the rest). Each check copies what was
read so far, so a client sending many small records must not get one per read: the work
would grow with the square of the request's size."""
UNREAD_BODY_SECONDS = 10.0
UNREAD_BODY_MIN_BYTES = 1024 * 1024
"""A body the app answered without reading (413 for one over the limit, 404, 405) is still
read to its end and dropped after the answer, for up to this long and up to twice the
app's body limit (at least UNREAD_BODY_MIN_BYTES): a client may be writing it still, and
one that writes its whole body before reading (Python's http.client, most scripts) fails
mid-write and never sees the answer if gas closes early; read to its end, the connection
also serves the next request. gunicorn alone drains 64 KiB, then closes. Past either bound
the connection is closed, as other servers do (Go's drains 256 KiB)."""
NEXT_REQUEST_WAIT = 0.002
"""How long a thread that answered a request on a kept-alive connection waits for the
connection's next request, when no other connection waits for a thread, before handing the
connection back to gunicorn's poller. Under load kube-scheduler sends its next request on
the connection it just used within this long, and answered in the same thread it skips the
hand-offs between the poller's thread and the pool's (two wake-ups of the worker's main
loop, a pipe write, the poller's register and unregister, the pool's queue): a fifth of a
bind's CPU. An idle connection costs the thread this long once."""
_NO_IO_VERBS = frozenset(routes.VERBS) - {routes.BIND}
"""The verbs answered from the ledger alone: over HTTP/2 they are answered in the
connection's reader thread; a bind, which waits on the API server, on the pool."""
_HEADER = re.compile(rb"\r\n([A-Za-z0-9-]+)[ \t]*:[ \t]*([^\r\n]*)")
_LAST_CHUNK = re.compile(rb"(?:^|\r\n)0+[ \t]*(?:;[^\r\n]*)?\r\n(?:[^\r\n]+\r\n)*\r\n")


def _request_complete(data: bytes, body_limit: int | None = None) -> bool:
    """Whether ``data`` holds a whole HTTP/1.x request, or enough to stop waiting: the
    parser then reads the rest, answers a malformed request, or the app refuses a body
    over ``body_limit`` without reading it."""
    cap = _PREBUFFER_LIMIT if body_limit is None else min(body_limit, _PREBUFFER_LIMIT)
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return len(data) > _HEAD_LIMIT
    headers = {k.lower(): v.strip().lower() for k, v in _HEADER.findall(data[: end + 2])}
    body = data[end + 4 :]
    if b"100-continue" in headers.get(b"expect", b""):
        return True  # the client waits for "100 Continue" before sending the body
    if b"chunked" in headers.get(b"transfer-encoding", b""):
        return _LAST_CHUNK.search(body) is not None or len(body) > cap
    length = headers.get(b"content-length", b"0")
    if not length.isdigit():
        return True  # malformed: the parser answers 400
    if body_limit is not None and int(length) > body_limit:
        return True
    return len(body) >= min(int(length), cap)


class _DeadlineSocket:
    """The socket a request is parsed from, with a deadline on every blocking read."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.deadline: float | None = None

    def recv(self, size: int) -> bytes:
        if self.deadline is None:
            return bytes(self.sock.recv(size))
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the client took too long to send its request")
        prior = self.sock.gettimeout()
        self.sock.settimeout(remaining if prior is None else min(prior, remaining))
        try:
            return bytes(self.sock.recv(size))
        finally:
            self.sock.settimeout(prior)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def direct_posts(app: Any, cfg: Any) -> tuple[direct.DirectPost | None, direct.Limits]:
    """The POSTs the worker answers itself (`gas.serving.direct`): the app's
    `routes.DIRECT_POST` (None: none), and the limits of the requests it takes, from
    gunicorn's configuration `cfg`. None with an access log (written from gunicorn's
    response), the PROXY protocol (read by gunicorn's parser), or under a SCRIPT_NAME (the
    app's routes are then not the request's path)."""
    post = getattr(app, routes.DIRECT_POST, None)
    proxied = cfg.proxy_protocol not in (False, None, "off")
    plain = not (cfg.accesslog or proxied or os.environ.get("SCRIPT_NAME"))
    read_by_gunicorn = [*cfg.secure_scheme_headers, *cfg.forwarder_headers]
    limits = direct.Limits(
        cfg.limit_request_line or _GUNICORN_MAX_REQUEST_LINE,
        cfg.limit_request_field_size or _GUNICORN_MAX_REQUEST_LINE,
        cfg.limit_request_fields,
        getattr(app, "config", {}).get("MAX_CONTENT_LENGTH"),
        frozenset(name.lower().encode("latin-1") for name in read_by_gunicorn),
    )
    return (post if plain else None), limits


class QuickQuitThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker with a quick shutdown (SIGQUIT, sent on the master's
    SIGINT) that cannot deadlock, and that slow clients cannot starve (see above).

    Stock gthread shuts its thread pool down inside the signal handler; when the signal
    lands while the main thread is handing a connection to that pool, both wait on the
    pool's lock and the worker hangs until the master kills it. Quick shutdown means
    in-flight requests are dropped anyway, so leave without touching the pool.

    It also answers kube-scheduler's plain POSTs itself (`gas.serving.direct`) and a
    kept-alive connection's next request in the thread that answered the last
    (NEXT_REQUEST_WAIT).
    """

    _notified_at = -math.inf
    alive: bool

    def notify(self) -> None:
        # gthread tells the master it is alive on every turn of its loop, which turns twice
        # per request, a system call each time; the master needs a sign once per timeout.
        now = time.monotonic()
        if now - self._notified_at >= min(1.0, self.timeout / 4):
            self._notified_at = now
            super().notify()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._queued = 0  # connections handed to the pool, not yet taken by a thread
        self._queued_lock = threading.Lock()
        self._http2_pool: ThreadPoolExecutor | None = None
        self._http2_lock = threading.Lock()

    def enqueue_req(self, conn: Any) -> None:
        with self._queued_lock:
            self._queued += 1
        try:
            super().enqueue_req(conn)
        except BaseException:
            with self._queued_lock:
                self._queued -= 1
            raise

    def handle(self, conn: Any) -> Any:
        with self._queued_lock:
            self._queued -= 1
        result = self._handle_one(conn)
        while result is True and self._next_request_soon(conn):
            result = self._handle_one(conn)
        return result

    def _next_request_soon(self, conn: Any) -> bool:
        """Whether the kept-alive `conn` is to be read again in this thread: its next
        request (or its end) is in, or comes within NEXT_REQUEST_WAIT, while no other
        connection waits for a thread and the worker is not stopping."""
        if not self.alive or self._queued > 0 or conn.is_http2:
            return False
        # Read ahead by the last request's parser, or decrypted and not yet taken.
        if conn.parser.unreader.buf.getvalue() or getattr(conn.sock, "pending", int)():
            return True
        poller = select.poll()
        poller.register(conn.sock.fileno(), select.POLLIN)
        # Once more after the wait: a connection that came meanwhile goes first.
        return bool(poller.poll(NEXT_REQUEST_WAIT * 1000)) and self._queued == 0

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self._direct, self._direct_limits = direct_posts(self.wsgi, self.cfg)

    def _keepalive_after(self, conn: Any, keepalive: bool) -> bool:
        """gthread's: whether to keep `conn` after an answer, its request's unread body
        first read and dropped, here within UNREAD_BODY_SECONDS and bytes."""
        if not keepalive:
            return False
        limit = getattr(self.wsgi, "config", {}).get("MAX_CONTENT_LENGTH") or 0
        drained = conn.parser.finish_body(
            deadline=time.monotonic() + UNREAD_BODY_SECONDS,
            max_bytes=max(2 * limit, UNREAD_BODY_MIN_BYTES),
        )
        return bool(drained)

    def _answer_direct(self, conn: Any) -> bool | None:
        """Answer the buffered request through the app's `routes.DIRECT_POST` when it
        takes it (`gas.serving.direct`): whether to keep the connection; None when it is
        for gunicorn and the app's WSGI side, which then find it as it came."""
        if self._direct is None:
            return None
        unreader = conn.parser.unreader
        data = unreader.buf.getvalue()
        request = direct.read_request(data, self._direct_limits)
        if request is None:
            return None
        answer = self._direct(request.path, request.body)
        if answer is None:
            return None
        unreader.take_buffered()
        if len(data) > request.end:
            unreader.unread(data[request.end :])  # the next request's start
        # As gthread's handle_request decides it.
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        keep = bool(
            self.alive and self.cfg.keepalive and len(self.keepalived_conns) < self.max_keepalived
        )
        conn.sock.sendall(direct.frame(*answer, keep_alive=keep))
        return keep

    def _serve_http2(self, conn: Any) -> bool:
        """Serves the HTTP/2 connection `conn` in this thread until it ends: False, for the
        worker to close it. Its streams are answered on a pool of their own: one must
        never wait for a thread that a connection's reader holds."""
        with self._http2_lock:
            if self._http2_pool is None:
                self._http2_pool = ThreadPoolExecutor(self.cfg.threads, "gas-http2")
        http2.serve_worker_connection(self, conn, self._http2_pool, _NO_IO_VERBS)
        return False

    def _handle_one(self, conn: Any) -> Any:
        if conn.is_http2:
            return self._serve_http2(conn)
        try:
            ready = self._collect_request(conn)
            if ready is True and conn.is_http2:
                return self._serve_http2(conn)
            if ready is True:
                answered = self._answer_direct(conn)
                if answered is not None:
                    return answered
        except ssl.SSLError as exc:
            # As gthread itself: a client that hung up is not worth a log line.
            if exc.args[0] != ssl.SSL_ERROR_EOF:
                self.handle_error(None, conn.sock, conn.client, exc)
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                self.log.exception("Socket error reading a request.")
            elif exc.errno is None:
                self.handle_error(None, conn.sock, conn.client, exc)
            return False
        except Exception as exc:
            self.handle_error(None, conn.sock, conn.client, exc)
            return False
        if ready is not True:
            return ready
        return super().handle(conn)

    def _collect_request(self, conn: Any) -> Any:
        """True when the request is buffered (or HTTP/2), _DEFER to wait for more without
        a thread, False to close a connection that took too long."""
        if not conn.initialized:
            if not conn.wait_for_data(DEFAULT_WORKER_DATA_TIMEOUT):
                return _DEFER
            conn.sock.setblocking(True)
            http2.init_connection(conn, self.cfg)
            opened = getattr(self.wsgi, routes.CONNECTION_OPENED, None)
            if opened is not None:
                opened("h2" if conn.is_http2 else "http/1.1")
            if conn.is_http2:
                return True
        unreader = conn.parser.unreader
        if not isinstance(unreader.sock, _DeadlineSocket):
            unreader.sock = _DeadlineSocket(unreader.sock)
        started = getattr(conn, "gas_request_started", None)
        if started is None:
            started = conn.gas_request_started = time.monotonic()
        buffer = unreader.buf
        buffer.seek(0, os.SEEK_END)
        limit = getattr(self.wsgi, "config", {}).get("MAX_CONTENT_LENGTH")
        eof = complete = False
        checks = 0
        conn.sock.setblocking(False)
        try:
            while buffer.tell() <= _PREBUFFER_LIMIT + _HEAD_LIMIT:
                try:
                    data = conn.sock.recv(65536)
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    break
                if not data:
                    eof = True
                    break
                buffer.write(data)
                # Less than a full TLS record: most often the end of one of the client's
                # writes, and then maybe of the request, which needs no further read to
                # find the socket drained.
                if len(data) < _TLS_RECORD and checks < _EARLY_CHECKS:
                    checks += 1
                    if _request_complete(buffer.getvalue(), limit):
                        complete = True
                        break
        finally:
            conn.sock.setblocking(True)
        if eof or complete or _request_complete(buffer.getvalue(), limit):
            conn.gas_request_started = None
            unreader.sock.deadline = started + REQUEST_READ_TIMEOUT
            return True
        if time.monotonic() - started > REQUEST_READ_TIMEOUT:
            self.log.info(
                "closing connection from %s: no complete request in %gs",
                conn.client,
                REQUEST_READ_TIMEOUT,
            )
            return False
        conn.data_ready = False
        return _DEFER

    def handle_quit(self, sig: int, frame: Any) -> None:
        self.alive = False
        self.cfg.worker_int(self)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class _GasApplication(BaseApplication):  # type: ignore[misc]
    """A gunicorn application configured from a dict, loading the app lazily."""

    def __init__(self, app_factory: Callable[[], flask.Flask], options: dict[str, Any]) -> None:
        self._app_factory = app_factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> flask.Flask:
        # Called by the worker (preload_app is off), after the fork.
        app = self._app_factory()
        # What the worker built to serve (modules, the app, with the demo cluster its whole
        # ledger) lives as long as the worker: frozen, the collector's full passes no
        # longer go over it, which would stall requests for hundreds of milliseconds.
        # Objects freed later still go by reference counting.
        gc.collect()
        gc.freeze()
        return app

    def run(self) -> None:
        # BaseApplication.run() with our arbiter.
        try:
            _SingleWorkerArbiter(self).run()
        except RuntimeError as exc:
            print(f"\nError: {exc}\n", file=sys.stderr)
            sys.stderr.flush()
            sys.exit(1)


def _check_positive(name: str, value: float, minimum: float = 1) -> None:
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum:g}, got {value!r}")


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _log_level(value: str) -> str:
    level = value.lower()
    if level not in _LOG_LEVELS:
        raise ValueError(f"unknown log level {value!r}; use one of {', '.join(_LOG_LEVELS)}")
    return level


def _ensure_logging(log_level: str) -> None:
    # gunicorn configures only its own loggers. Without any handler, the app's records
    # below WARNING would be lost; a caller that set up logging keeps its configuration.
    root = logging.getLogger()
    if root.handlers:
        return
    logformat.configure(log_level)


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """How ``serve`` listens and runs; ``build_options`` checks it.

    HTTPS with ``certfile``/``keyfile`` (mutual TLS when ``cafile`` is given) unless
    ``unsafe``. ``host`` "0.0.0.0" listens on IPv4; "::" (or "[::]") on IPv6, which on
    Linux also accepts IPv4 unless the host disables dual-stack sockets.

    ``timeout``: a worker whose main loop is stuck that long is killed and replaced.
    ``graceful_timeout``: after SIGTERM, in-flight requests get this long to finish.
    ``keepalive``: idle seconds before a kept-alive connection is closed.
    ``max_request_header_bytes``: limit for each header line and the request line.
    ``handshake_timeout``: a client that does not finish the TLS handshake in time is
    dropped, so that stalled handshakes cannot tie up the worker's threads.
    ``http2``: offer HTTP/2 through ALPN (`gas.serving.http2`); HTTP/1.1 is always served.
    ``on_worker_exit``: called in the worker after it stopped serving, to stop background
    threads started by the app factory (non-daemon threads would otherwise keep the worker
    alive until the master kills it at ``graceful_timeout``).
    """

    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    unsafe: bool = False
    threads: int = 8
    timeout: int = 30
    graceful_timeout: int = 20
    keepalive: int = 75
    max_request_header_bytes: int = 8190
    handshake_timeout: float | None = 10.0
    access_log: bool = False
    log_level: str = "info"
    http2: bool = False
    on_worker_exit: Callable[[], None] | None = None


def build_options(settings: ServerSettings) -> dict[str, Any]:
    """The gunicorn settings ``serve`` uses; validates the settings and TLS files.

    Raises ``TLSConfigError`` for TLS problems and ``ValueError`` for other bad settings,
    before anything listens.
    """
    if not 1 <= settings.port <= 65535:
        raise ValueError(f"port must be between 1 and 65535, got {settings.port}")
    _check_positive("threads", settings.threads)
    _check_positive("timeout", settings.timeout)
    _check_positive("graceful_timeout", settings.graceful_timeout, 0)
    _check_positive("keepalive", settings.keepalive, 0)
    _check_positive("max_request_header_bytes", settings.max_request_header_bytes, 256)
    if settings.handshake_timeout is not None:
        _check_positive("handshake_timeout", settings.handshake_timeout, 0.001)
    level = _log_level(settings.log_level)
    header_bytes = settings.max_request_header_bytes

    options: dict[str, Any] = {
        "bind": [_bind_address(settings.host, settings.port)],
        # Exactly one worker: the ledger is per process (see the module docstring).
        "workers": 1,
        "worker_class": f"{__name__}.QuickQuitThreadWorker",
        "threads": settings.threads,
        "preload_app": False,
        # A restarting worker would drop the ledger and its in-flight reservations.
        "max_requests": 0,
        "timeout": settings.timeout,
        "graceful_timeout": settings.graceful_timeout,
        "keepalive": settings.keepalive,
        "limit_request_line": min(header_bytes, _GUNICORN_MAX_REQUEST_LINE),
        "limit_request_field_size": header_bytes,
        "accesslog": "-" if settings.access_log else None,
        "errorlog": "-",
        "loglevel": level,
        "proc_name": "gas",
        # gunicorn >= 25 opens a control socket under $HOME or $XDG_RUNTIME_DIR by default:
        # nothing uses it here, it fails on read-only filesystems, and two servers for the
        # same user would fight over the same path.
        "control_socket_disable": True,
        "worker_tmp_dir": _worker_tmp_dir(),
        "worker_abort": _on_worker_abort,
        "worker_exit": _make_worker_exit_hook(settings.on_worker_exit),
    }
    if settings.unsafe:
        if settings.certfile or settings.keyfile or settings.cafile:
            log.warning("--unsafe given: serving plain HTTP, the TLS files are ignored")
        return options
    options.update(_tls_options(settings))
    return options


def _tls_options(settings: ServerSettings) -> dict[str, Any]:
    certfile, keyfile, cafile = settings.certfile, settings.keyfile, settings.cafile
    missing = [name for name, value in (("certfile", certfile), ("keyfile", keyfile)) if not value]
    if missing or certfile is None or keyfile is None:
        raise TLSConfigError(
            "HTTPS needs a certificate and a key but "
            + " and ".join(missing)
            + (" is" if len(missing) == 1 else " are")
            + " not set; give both, or choose plain HTTP explicitly with unsafe=True (--unsafe)"
        )
    # Built here, in the calling process, so that a bad file fails before gunicorn starts
    # (gunicorn would only log it and exit); the worker inherits this context.
    alpn = ("h2", *ALPN_PROTOCOLS) if settings.http2 else ALPN_PROTOCOLS
    hook = _ReloadingContext(certfile, keyfile, cafile, settings.handshake_timeout, alpn)
    return {
        # gunicorn decides "is this HTTPS" from certfile/keyfile and checks that they
        # exist; the context itself comes from the hook.
        "certfile": certfile,
        "keyfile": keyfile,
        "ca_certs": cafile,
        "cert_reqs": ssl.CERT_REQUIRED if cafile else ssl.CERT_NONE,
        "ciphers": TLS12_CIPHERS,
        # The handshake runs inside wrap_socket, where ServerSSLContext bounds it in
        # time; gunicorn's own later do_handshake() call is then skipped.
        "do_handshake_on_connect": True,
        "ssl_context": hook,
    }


def serve(app_factory: Callable[[], flask.Flask], settings: ServerSettings) -> NoReturn:
    """Run the app under gunicorn until SIGTERM/SIGINT, as ``settings`` say; never returns.

    The calling process becomes the gunicorn master: call this from the main thread,
    before starting any thread or client (they would not survive the fork). The master
    forks one worker, which calls ``app_factory()``; build everything stateful there. If
    the worker dies, the master starts a new one, which calls ``app_factory()`` again.

    Exits through ``SystemExit``: 0 after a clean shutdown, 3 if the worker failed to boot
    (``app_factory`` raised), 1 if the address cannot be bound. In the worker process,
    ``SystemExit`` also ends the process; do not catch it around this call.
    Raises ``TLSConfigError`` or ``ValueError`` for a bad configuration before listening.
    """
    _ensure_logging(_log_level(settings.log_level))
    options = build_options(settings)
    if settings.unsafe:
        log.warning(
            "serving plain HTTP on %s: no TLS, no client authentication", options["bind"][0]
        )
    _GasApplication(app_factory, options).run()
    # Arbiter.run() always leaves through sys.exit(); this is for the type checker.
    raise SystemExit(0)  # pragma: no cover
