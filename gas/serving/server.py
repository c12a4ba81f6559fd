"""Serve a Flask app with gunicorn, in-process, over HTTPS: one worker process whose
asyncio loop serves every connection (`gas.httpserver.front`) and a pool of threads that
answers requests.

One worker process: the ledger lives in process memory, and a second worker would hold a
second, diverging ledger. The app is built inside the worker (``preload_app`` off) because
it starts background threads (list+watch), and threads do not survive the fork from the
gunicorn master. gunicorn keeps what it is good at: the master, which binds the ports,
starts the worker, replaces it when it dies or hangs, and passes the signals on.

TLS is gas's own policy (``gas.serving.tls.server_ssl_context``: TLS >= 1.2, ECDHE+AEAD,
optional mTLS). The context is asked for on every new connection; it is one cached context,
rebuilt when the certificate files change, so a renewed certificate (cert-manager, a
rotated Secret) is picked up without a restart.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import os
import signal
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from gunicorn.app.base import BaseApplication  # type: ignore[import-untyped]
from gunicorn.arbiter import Arbiter  # type: ignore[import-untyped]
from gunicorn.workers.base import Worker  # type: ignore[import-untyped]

from gas.httpserver import hooks
from gas.httpserver.answering import App
from gas.httpserver.connection import Listener
from gas.httpserver.front import Front, new_loop
from gas.httpserver.limits import DEFAULT_LIMITS, Limits
from gas.httpserver.stats import ServingStats
from gas.serving import health, logformat, routes
from gas.serving.tls import ALPN_PROTOCOLS, TLSConfigError, server_ssl_context

if TYPE_CHECKING:
    import flask

__all__ = ["DEFAULT_PORT", "ServerSettings", "build_options", "serve"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 9001

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
    """The TLS context of each new connection: one shared context, rebuilt when its files
    change.

    A failed rebuild (files caught half-rotated, key not matching the new certificate yet)
    keeps the previous context and is retried when the files change again.
    """

    def __init__(
        self,
        certfile: str,
        keyfile: str,
        cafile: str | None,
        alpn_protocols: tuple[str, ...] = ALPN_PROTOCOLS,
    ) -> None:
        self._alpn_protocols = alpn_protocols
        self._certfile = certfile
        self._keyfile = keyfile
        self._cafile = cafile
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
            alpn_protocols=self._alpn_protocols,
        )

    def __call__(self) -> ssl.SSLContext:
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


_NO_IO_VERBS = frozenset(routes.VERBS) - {routes.BIND}
"""The verbs answered from the ledger alone: answered on the serving loop's thread; a bind,
which waits on the API server, on the pool."""
_HEARTBEAT_INTERVAL = 1.0


@dataclass(frozen=True)
class ServingPlan:
    """What the worker serves besides gunicorn's settings: TLS (None: plain HTTP), whether
    HTTP/2 is offered, the limits, the line limit, and the health port's socket."""

    tls: Callable[[], ssl.SSLContext] | None
    http2: bool
    limits: Limits
    max_line: int
    health_socket: socket.socket | None = None


class LoopWorker(Worker):  # type: ignore[misc]
    """gunicorn's worker for gas: one asyncio loop serving every listener
    (`gas.httpserver.front`), a pool of `threads` threads answering requests, and a quick
    shutdown (SIGQUIT, sent on the master's SIGINT) that drops in-flight requests at
    once. SIGTERM stops accepting and lets the requests taken finish within the graceful
    timeout."""

    alive: bool
    _notified_at = -math.inf

    def run(self) -> None:
        plan: ServingPlan = self.app.plan
        loop = new_loop()
        asyncio.set_event_loop(loop)
        pool = ThreadPoolExecutor(self.cfg.threads, "gas-request")
        stats = ServingStats()
        register = getattr(self.wsgi, hooks.SERVING_STATS, None)
        if register is not None:
            register(stats)
        front = Front(loop, plan.limits, pool, stats, inline=_NO_IO_VERBS)
        scheme = "https" if plan.tls is not None else "http"
        for listener in self.sockets:
            sock = listener.sock
            app = App.of(self.wsgi, scheme, _address(sock))
            served = Listener(app, plan.tls, http2=plan.http2, max_line=plan.max_line)
            loop.run_until_complete(front.listen(sock, served))
        if plan.health_socket is not None:
            sock = plan.health_socket
            app = App.of(health.only_health(self.wsgi), "http", _address(sock))
            loop.run_until_complete(front.listen(sock, Listener(app, None, max_line=plan.max_line)))
        try:
            loop.run_until_complete(
                front.run(lambda: bool(self.alive), self._heartbeat, self.cfg.graceful_timeout)
            )
        finally:
            pool.shutdown(wait=False)
            loop.close()

    def _heartbeat(self) -> None:
        # The master needs a sign of life once per timeout; each is a system call.
        now = time.monotonic()
        if now - self._notified_at >= min(_HEARTBEAT_INTERVAL, self.timeout / 4):
            self._notified_at = now
            self.notify()
            if not self.is_parent_alive():
                self.alive = False

    def is_parent_alive(self) -> bool:
        if self.ppid != os.getppid():
            self.log.info("Parent changed, shutting down: %s", self)
            return False
        return True

    def handle_quit(self, sig: int, frame: Any) -> None:
        self.alive = False
        self.cfg.worker_int(self)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _address(sock: socket.socket) -> tuple[str, int]:
    try:
        name = sock.getsockname()
    except OSError:
        return ("", 0)
    if isinstance(name, tuple):
        return (str(name[0]), int(name[1]))
    return (str(name), 0)


class _GasApplication(BaseApplication):  # type: ignore[misc]
    """A gunicorn application configured from a dict, loading the app lazily."""

    def __init__(
        self,
        app_factory: Callable[[], flask.Flask],
        options: dict[str, Any],
        plan: ServingPlan,
    ) -> None:
        self._app_factory = app_factory
        self._options = options
        self.plan = plan
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


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """How ``serve`` listens and runs; ``build_options`` checks it.

    HTTPS with ``certfile``/``keyfile`` (mutual TLS when ``cafile`` is given) unless
    ``unsafe``. ``host`` "0.0.0.0" listens on IPv4; "::" (or "[::]") on IPv6, which on
    Linux also accepts IPv4 unless the host disables dual-stack sockets.

    ``threads``: the pool that answers requests (connections cost no thread of their own).
    ``timeout``: a worker whose loop is stuck that long is killed and replaced.
    ``graceful_timeout``: after SIGTERM, in-flight requests get this long to finish.
    ``max_request_header_bytes``: limit for each header line and the request line, and
    for an HTTP/2 header list.
    ``limits``: what a peer may cost (`gas.httpserver.limits.Limits`: connections, timeouts,
    buffered bytes, HTTP/2 rates).
    ``http2``: offer HTTP/2 through ALPN (`gas.httpserver.http2`); HTTP/1.1 is always served.
    ``health_socket``: a listening socket also served, in plain HTTP, for the probe paths
    only (`gas.serving.health`).
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
    max_request_header_bytes: int = 8190
    limits: Limits = DEFAULT_LIMITS
    log_level: str = "info"
    http2: bool = False
    health_socket: socket.socket | None = field(default=None, compare=False)
    on_worker_exit: Callable[[], None] | None = None


def build_options(settings: ServerSettings) -> dict[str, Any]:
    """The gunicorn settings ``serve`` uses; validates the settings and TLS files.

    Raises ``TLSConfigError`` for TLS problems and ``ValueError`` for other bad settings,
    before anything listens.
    """
    return _build(settings)[0]


def _build(settings: ServerSettings) -> tuple[dict[str, Any], ServingPlan]:
    if not 1 <= settings.port <= 65535:
        raise ValueError(f"port must be between 1 and 65535, got {settings.port}")
    _check_positive("threads", settings.threads)
    _check_positive("timeout", settings.timeout)
    _check_positive("graceful_timeout", settings.graceful_timeout, 0)
    _check_positive("max_request_header_bytes", settings.max_request_header_bytes, 256)
    settings.limits.check()
    level = _log_level(settings.log_level)

    options: dict[str, Any] = {
        "bind": [_bind_address(settings.host, settings.port)],
        # Exactly one worker: the ledger is per process (see the module docstring).
        "workers": 1,
        "worker_class": f"{__name__}.LoopWorker",
        "threads": settings.threads,
        "preload_app": False,
        # A restarting worker would drop the ledger and its in-flight reservations.
        "max_requests": 0,
        "timeout": settings.timeout,
        "graceful_timeout": settings.graceful_timeout,
        "backlog": 2048,
        "accesslog": None,
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
    tls: Callable[[], ssl.SSLContext] | None = None
    if settings.unsafe:
        if settings.certfile or settings.keyfile or settings.cafile:
            log.warning("--unsafe given: serving plain HTTP, the TLS files are ignored")
    else:
        tls = _tls_context(settings)
        # Only for gunicorn's "Listening at: https://" line: the worker does TLS itself.
        options["certfile"] = settings.certfile
        options["keyfile"] = settings.keyfile
    plan = ServingPlan(
        tls=tls,
        http2=settings.http2,
        limits=settings.limits,
        max_line=settings.max_request_header_bytes,
        health_socket=settings.health_socket,
    )
    return options, plan


def _tls_context(settings: ServerSettings) -> _ReloadingContext:
    certfile, keyfile, cafile = settings.certfile, settings.keyfile, settings.cafile
    missing = [name for name, value in (("certfile", certfile), ("keyfile", keyfile)) if not value]
    if missing or certfile is None or keyfile is None:
        raise TLSConfigError(
            "HTTPS needs a certificate and a key but "
            + " and ".join(missing)
            + (" is" if len(missing) == 1 else " are")
            + " not set; give both, or choose plain HTTP explicitly with unsafe=True (--unsafe)"
        )
    # Built here, in the calling process, so that a bad file fails before gunicorn starts;
    # the worker inherits this context.
    alpn = ("h2", *ALPN_PROTOCOLS) if settings.http2 else ALPN_PROTOCOLS
    return _ReloadingContext(certfile, keyfile, cafile, alpn)


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
    # gunicorn configures only its own loggers: without a handler the app's records below
    # WARNING would be lost.
    logformat.ensure(_log_level(settings.log_level))
    options, plan = _build(settings)
    if settings.unsafe:
        log.warning(
            "serving plain HTTP on %s: no TLS, no client authentication", options["bind"][0]
        )
    _GasApplication(app_factory, options, plan).run()
    # Arbiter.run() always leaves through sys.exit(); this is for the type checker.
    raise SystemExit(0)  # pragma: no cover
