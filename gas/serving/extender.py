"""The HTTP face of gas: the scheduler-extender routes, health, metrics and error mapping.

Thin by design: a verb's route reads the body, has `gas.serving.wire` decode it, calls the
`gas.serving.service.Extender` and answers what it replies. Here live only what is HTTP:
request latency and outcome metrics, the decision log, and the statuses. A malformed
request is a 400 with a JSON body naming the problem, an unknown route 404, a wrong method
405, an oversized body 413, a request while gas is not synced with the cluster 503; every
error body is JSON with `Error`.

kube-scheduler's POSTs to the four verbs are answered by a WSGI layer in front of Flask
(`_SchedulerRoutes`): Flask's request context, routing, hooks and response object cost
more per request than a filter of a hundred nodes does, and these routes need none of
them. Everything else (probes, metrics, the ledger's view, 404, 405) goes through Flask;
the verbs' Flask routes answer the same way, through the same `_Face`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from flask import Flask, Response, g, request
from prometheus_client import Counter, Histogram
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.sansio.utils import get_content_length
from werkzeug.wsgi import get_input_stream

from gas.cluster.protocol import Cluster
from gas.core.ledger import Ledger
from gas.httpserver import hooks
from gas.serving import routes, wire
from gas.serving.metrics import Metrics
from gas.serving.service import INACTIVE, NOT_SYNCED, Extender, Options, Reply
from gas.serving.wire import BadRequest

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["Options", "create_app", "read_body"]

log = logging.getLogger(__name__)
decisions = logging.getLogger("gas.decisions")

# Outcomes of the requests that never reached a verb, by status.
_STATUS_OUTCOMES = {400: "bad_request", 413: "bad_request", 503: "not_synced"}
_JSON = "application/json"
_ROUTES = {verb: rule for rule, verb in routes.VERBS.items()}


def create_app(
    ledger: Ledger,
    cluster: Cluster,
    options: Options | None = None,
    metrics: Metrics | None = None,
    ready: Callable[[], bool] | None = None,
) -> Flask:
    """The extender's app. `ready` answers /readyz (default: the verbs' own question,
    whether the cluster is synced)."""
    options = options or Options()
    metrics = metrics or Metrics()
    metrics.watch_ledger(ledger)
    app = Flask("gas")
    app.config["MAX_CONTENT_LENGTH"] = options.max_request_bytes
    extender = Extender(ledger, cluster, options)
    face = _Face(extender, ledger, metrics, app.config, ready or extender.synced)
    app.before_request(_start_clock)
    app.after_request(face.count)
    for rule, verb in routes.VERBS.items():
        app.add_url_rule(rule, verb, face.view(verb), methods=["POST"])
    for rule, view in (
        (routes.METRICS, face.metrics),
        (routes.HEALTHZ, _healthz),
        (routes.READYZ, face.readyz),
        (routes.LEDGER, face.ledger),
    ):
        app.add_url_rule(rule, view_func=view, methods=["GET"])
    app.register_error_handler(BadRequest, _bad_request)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal_error)
    scheduler = _SchedulerRoutes(app.wsgi_app, face)
    app.wsgi_app = scheduler  # type: ignore[method-assign]
    setattr(app, hooks.DIRECT_POST, scheduler.post)
    connections = Counter(
        "gas_connections",
        "Connections accepted, by the protocol they chose: over h2 kube-scheduler carries "
        "every call on one; over http/1.1 it opens another (a mutual-TLS handshake) "
        "whenever its two idle ones are busy.",
        ["protocol"],
        registry=metrics.registry,
    )
    setattr(app, hooks.CONNECTION_OPENED, lambda protocol: connections.labels(protocol).inc())
    setattr(app, hooks.SERVING_STATS, metrics.registry.register)
    return app


class _SchedulerRoutes:
    """kube-scheduler's POSTs to the verbs, answered without Flask; every other request
    is passed to Flask (`flask`). Answers, metrics and logs are those of Flask's routes."""

    def __init__(self, flask: WSGIApplication, face: _Face) -> None:
        self.flask = flask
        self._face = face

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        verb = routes.VERBS.get(environ.get("PATH_INFO", ""))
        if verb is None or environ.get("REQUEST_METHOD") != "POST":
            return self.flask(environ, start_response)
        started = time.perf_counter()
        status, body, outcome = self._face.answer(verb, environ)
        self._face.count_verb(verb, status, outcome, started)
        start_response(*_head(status, body))
        return [body]

    def post(self, path: str, body: bytes) -> tuple[str, list[tuple[str, str]], bytes] | None:
        """A whole POST the server read itself (`hooks.DIRECT_POST`): the answer
        `__call__` gives, or None for a path that is not a verb's."""
        verb = routes.VERBS.get(path)
        if verb is None:
            return None
        started = time.perf_counter()
        status, data, outcome = self._face.answer_body(verb, body)
        self._face.count_verb(verb, status, outcome, started)
        return (*_head(status, data), data)


def _head(status: int, body: bytes) -> tuple[str, list[tuple[str, str]]]:
    """A verb's status line and headers."""
    status_line = _STATUS_LINES.get(status) or _status_line(status)
    return status_line, [("Content-Type", _JSON), ("Content-Length", str(len(body)))]


def _status_line(status: int) -> str:
    """As werkzeug writes it."""
    return f"{status} {HTTP_STATUS_CODES.get(status, 'unknown').upper()}"


_STATUS_LINES = {status: _status_line(status) for status in (200, 400, 408, 413, 500, 503)}


class _VerbResponse(Response):
    """A verb's answer, carrying the outcome the request is counted under."""

    outcome: str = ""


class _Face:
    def __init__(
        self,
        extender: Extender,
        ledger: Ledger,
        metrics: Metrics,
        config: Mapping[str, Any],
        ready: Callable[[], bool],
    ) -> None:
        self._extender = extender
        self._ready = ready
        self._ledger = ledger
        self._metrics = metrics
        self._config = config
        self._verbs: dict[str, Callable[[bytes], Reply]] = {
            "filter": lambda body: extender.filter(wire.decode_extender_args(body)),
            "prioritize": lambda body: extender.prioritize(wire.decode_extender_args(body)),
            "preempt": lambda body: extender.preempt(wire.decode_preemption_args(body)),
            "bind": lambda body: extender.bind(wire.decode_binding_args(body)),
        }
        # Metric children by label values, made on first use as `labels()` makes them,
        # without its lock on every request.
        self._latency: dict[Any, Histogram] = {}
        self._requests: dict[Any, Counter] = {}
        self._rejections: dict[str, Counter] = {}
        self._verdicts: dict[str, Counter] = {}

    def answer(self, verb: str, environ: WSGIEnvironment) -> tuple[int, bytes, str]:
        """A POST to `verb`, its body read from `environ`: its status, body and outcome
        label ("" when it did not reach the verb, and is counted by its status)."""
        limit = self._config.get("MAX_CONTENT_LENGTH")
        return self._answered(verb, lambda: read_body(environ, limit))

    def answer_body(self, verb: str, body: bytes) -> tuple[int, bytes, str]:
        """`answer` of a POST whose whole `body` the server read."""
        return self._answered(verb, lambda: body)

    def _answered(self, verb: str, read: Callable[[], bytes]) -> tuple[int, bytes, str]:
        # Only POSTs to the verb's own route come here: its path is the route's.
        path = _ROUTES[verb]
        try:
            return self._reply(self._verbs[verb](read()))
        except BadRequest as exc:
            return 400, _bad_request_body(exc, path), ""
        except HTTPException as exc:
            code, body = _http_error_body(exc, "POST", path)
            return code, body, ""
        except Exception as exc:
            return 500, _internal_error_body(exc, "POST", path), ""

    def _reply(self, reply: Reply) -> tuple[int, bytes, str]:
        outcome = reply.outcome
        # Both written first: a request nested too deeply to be written back or logged
        # is refused (`BadRequest`) before it is counted.
        body = wire.encode(reply.body)
        line = None
        if outcome.decision is not None and decisions.isEnabledFor(logging.INFO):
            try:
                line = wire.compact(outcome.decision)
            except RecursionError:
                raise BadRequest("JSON nested too deeply") from None
        for reason, count in outcome.rejections.items():
            _child(self._rejections, self._metrics.rejections, reason).inc(count)
        for verdict, count in outcome.verdicts.items():
            _child(self._verdicts, self._metrics.preempt_nodes, verdict).inc(count)
        if outcome.unscored:
            self._metrics.unscored_binds.labels(outcome.unscored).inc()
        if line is not None:
            decisions.info(line)
        status = 503 if outcome.label in (NOT_SYNCED, INACTIVE) else 200
        return status, body, outcome.label

    def count_verb(self, verb: str, status: int, outcome: str, started: float) -> None:
        latency = _child(self._latency, self._metrics.latency, verb)
        latency.observe(time.perf_counter() - started)
        key = (verb, outcome or _STATUS_OUTCOMES.get(status, "error"))
        _child(self._requests, self._metrics.requests, *key).inc()

    def view(self, verb: str) -> Callable[[], Response]:
        """The Flask route of `verb`: the same answer as `_SchedulerRoutes` gives."""

        def route() -> Response:
            status, body, outcome = self.answer(verb, request.environ)
            response = _VerbResponse(body, status, mimetype=_JSON)
            response.outcome = outcome
            return response

        return route

    def count(self, response: Response) -> Response:
        """Flask's after-request hook: the verbs' requests that Flask answered (another
        method than POST: 405)."""
        verb = routes.VERBS.get(request.path)
        if verb is not None:
            outcome = response.outcome if isinstance(response, _VerbResponse) else ""
            self.count_verb(verb, response.status_code, outcome, g.started)
        return response

    def metrics(self) -> Response:
        return Response(self._metrics.exposition(), mimetype="text/plain; version=0.0.4")

    def readyz(self) -> Response:
        if self._ready():
            return _json({"status": "ready"})
        # A --leaderElect follower is synced but not ready: it says why.
        return _json({"status": self._extender.inactive() or "not synced with the cluster"}, 503)

    def ledger(self) -> Response:
        return _json(self._ledger.snapshot())


_Metric = TypeVar("_Metric", Counter, Histogram)


def _child(children: dict[Any, _Metric], metric: _Metric, *labels: str) -> _Metric:
    """`metric.labels(*labels)`, kept in `children`: as `labels()` makes it, without its
    lock and checks on every request."""
    key = labels[0] if len(labels) == 1 else labels
    child = children.get(key)
    if child is None:
        child = children.setdefault(key, metric.labels(*labels))
    return child


def _start_clock() -> None:
    g.started = time.perf_counter()


def _healthz() -> Response:
    return _json({"status": "ok"})


def read_body(environ: WSGIEnvironment, limit: int | None) -> bytes:
    """The whole body; 413 when it is larger than the limit, even without Content-Length.
    Shared with the admission webhook's app (`gas.serving.webhook_app`).

    werkzeug enforces the limit only through the declared Content-Length: a chunked body
    is silently cut at the limit, and the cut could even parse as JSON."""
    length = get_content_length(
        environ.get("CONTENT_LENGTH"), environ.get("HTTP_TRANSFER_ENCODING")
    )
    try:
        if limit is None or "wsgi.input_terminated" not in environ:
            # As Flask's request.get_data(): refuses a declared size over the limit.
            return get_input_stream(environ, max_content_length=limit).read()
        if length is not None and length > limit:
            raise RequestEntityTooLarge()
        # The server ends the stream (at Content-Length, or after the last chunk): read
        # it whole, one byte past the limit, in one call.
        data = environ["wsgi.input"].read(limit + 1)
    except OSError as exc:  # the client stalled past the server's read deadline
        raise RequestTimeout(f"the request body did not arrive in time: {exc}") from None
    if len(data) > limit:
        raise RequestEntityTooLarge()
    return bytes(data)


def _bad_request_body(exc: BadRequest, path: str) -> bytes:
    log.info("bad request to %s: %s", path, exc)
    return wire.encode(wire.error_result(f"bad request: {exc}"))


def _http_error_body(exc: HTTPException, method: str, path: str) -> tuple[int, bytes]:
    code = exc.code or 500
    if code >= 400:
        log.info("%s %s -> %d", method, path, code)
    return code, wire.encode(wire.error_result(f"{code} {exc.name}: {exc.description}"))


def _internal_error_body(exc: Exception, method: str, path: str) -> bytes:
    log.exception("internal error on %s %s", method, path)
    return wire.encode(wire.error_result(f"internal error: {type(exc).__name__}: {exc}"))


def _bad_request(exc: BadRequest) -> Response:
    return _json_body(_bad_request_body(exc, request.path), 400)


def _http_error(exc: HTTPException) -> Response:
    code, body = _http_error_body(exc, request.method, request.path)
    return _json_body(body, code)


def _internal_error(exc: Exception) -> Response:
    return _json_body(_internal_error_body(exc, request.method, request.path), 500)


def _json(body: object, status: int = 200) -> Response:
    return _json_body(wire.encode(body), status)


def _json_body(body: bytes, status: int) -> Response:
    return Response(body, status, mimetype=_JSON)
