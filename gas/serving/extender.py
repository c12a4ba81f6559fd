"""The HTTP face of gas: the scheduler-extender routes, health, metrics and error mapping.

Thin by design: a verb's route reads the body, has `gas.serving.wire` decode it, calls the
`gas.serving.service.Extender` and answers what it replies. Here live only what is HTTP:
request latency and outcome metrics, the decision log, and the statuses. A malformed
request is a 400 with a JSON body naming the problem, an unknown route 404, a wrong method
405, an oversized body 413, a request while gas is not synced with the cluster 503; every
error body is JSON with `Error`.
"""

from __future__ import annotations

import json
import logging
import time

from flask import Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from gas.cluster.protocol import Cluster
from gas.core.ledger import Ledger
from gas.serving import routes, wire
from gas.serving.metrics import Metrics
from gas.serving.service import NOT_SYNCED, Extender, Options, Reply
from gas.serving.wire import BadRequest

__all__ = ["Options", "create_app"]

log = logging.getLogger(__name__)
decisions = logging.getLogger("gas.decisions")

# Outcomes of the requests that never reached a verb, by status.
_STATUS_OUTCOMES = {400: "bad_request", 413: "bad_request", 503: "not_synced"}


def create_app(
    ledger: Ledger,
    cluster: Cluster,
    options: Options | None = None,
    metrics: Metrics | None = None,
) -> Flask:
    options = options or Options()
    metrics = metrics or Metrics()
    metrics.watch_ledger(ledger)
    app = Flask("gas")
    app.config["MAX_CONTENT_LENGTH"] = options.max_request_bytes
    face = _Face(Extender(ledger, cluster, options), ledger, metrics)
    app.before_request(_start_clock)
    app.after_request(face.count)
    for rule, view in (
        (routes.FILTER, face.filter),
        (routes.PRIORITIZE, face.prioritize),
        (routes.PREEMPT, face.preempt),
        (routes.BIND, face.bind),
    ):
        app.add_url_rule(rule, view_func=view, methods=["POST"])
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
    return app


class _VerbResponse(Response):
    """A verb's answer, carrying the outcome the request is counted under."""

    outcome: str = ""


class _Face:
    def __init__(self, extender: Extender, ledger: Ledger, metrics: Metrics) -> None:
        self._extender = extender
        self._ledger = ledger
        self._metrics = metrics

    def filter(self) -> Response:
        return self._answer(self._extender.filter(wire.decode_extender_args(_read_body())))

    def prioritize(self) -> Response:
        return self._answer(self._extender.prioritize(wire.decode_extender_args(_read_body())))

    def preempt(self) -> Response:
        return self._answer(self._extender.preempt(wire.decode_preemption_args(_read_body())))

    def bind(self) -> Response:
        return self._answer(self._extender.bind(wire.decode_binding_args(_read_body())))

    def _answer(self, reply: Reply) -> Response:
        outcome = reply.outcome
        for reason, count in outcome.rejections.items():
            self._metrics.rejections.labels(reason).inc(count)
        for verdict, count in outcome.verdicts.items():
            self._metrics.preempt_nodes.labels(verdict).inc(count)
        if outcome.decision is not None:
            decisions.info(json.dumps(outcome.decision, separators=(",", ":"), sort_keys=False))
        status = 503 if outcome.label == NOT_SYNCED else 200
        response = _VerbResponse(wire.encode(reply.body), status, mimetype="application/json")
        response.outcome = outcome.label
        return response

    def count(self, response: Response) -> Response:
        verb = routes.VERBS.get(request.path)
        if verb is not None:
            self._metrics.latency.labels(verb).observe(time.perf_counter() - g.started)
            outcome = response.outcome if isinstance(response, _VerbResponse) else ""
            outcome = outcome or _STATUS_OUTCOMES.get(response.status_code, "error")
            self._metrics.requests.labels(verb, outcome).inc()
        return response

    def metrics(self) -> Response:
        return Response(self._metrics.exposition(), mimetype="text/plain; version=0.0.4")

    def readyz(self) -> Response:
        if self._extender.synced():
            return _json({"status": "ready"})
        return _json({"status": "not synced with the cluster"}, 503)

    def ledger(self) -> Response:
        return _json(self._ledger.snapshot())


def _start_clock() -> None:
    g.started = time.perf_counter()


def _healthz() -> Response:
    return _json({"status": "ok"})


def _read_body() -> bytes:
    """The whole body; 413 when it is larger than the limit, even without Content-Length.

    werkzeug enforces the limit only through the declared Content-Length: a chunked body
    is silently cut at the limit, and the cut could even parse as JSON."""
    limit = current_app.config.get("MAX_CONTENT_LENGTH")
    try:
        if limit is None or request.content_length is not None:
            return request.get_data(cache=False)  # werkzeug refuses a large declared size
        # Chunked: read the server's own (terminated) stream, one byte past the limit.
        data = request.environ["wsgi.input"].read(limit + 1)
    except OSError as exc:  # the client stalled past the server's read deadline
        raise RequestTimeout(f"the request body did not arrive in time: {exc}") from None
    if len(data) > limit:
        raise RequestEntityTooLarge()
    return bytes(data)


def _bad_request(exc: BadRequest) -> Response:
    log.info("bad request to %s: %s", request.path, exc)
    return _json(wire.error_result(f"bad request: {exc}"), 400)


def _http_error(exc: HTTPException) -> Response:
    code = exc.code or 500
    if code >= 400:
        log.info("%s %s -> %d", request.method, request.path, code)
    return _json(wire.error_result(f"{code} {exc.name}: {exc.description}"), code)


def _internal_error(exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.path)
    return _json(wire.error_result(f"internal error: {type(exc).__name__}: {exc}"), 500)


def _json(body: object, status: int = 200) -> Response:
    return Response(wire.encode(body), status, mimetype="application/json")
