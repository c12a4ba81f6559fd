"""The admission webhook's HTTP face: `POST /admission/pods`, probes and metrics.

Thin: the body goes to `gas.serving.admission.review`, its answer back as JSON. A body
that is not an AdmissionReview v1 is a 400 with a JSON body naming the problem and a log
line; every refusal is logged with the pod and the reason, since the API server shows it
only to the one who created the pod. The webhook holds no state: it is ready as soon as
it listens.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, request
from prometheus_client import CollectorRegistry, Counter, generate_latest
from werkzeug.exceptions import HTTPException

from gas.core.admission import MUTATED, REFUSED, Settings
from gas.httpserver import hooks
from gas.serving import admission, routes, wire
from gas.serving.claim_templates import TemplateError, TemplateMaker
from gas.serving.extender import read_body
from gas.serving.wire import BadRequest

log = logging.getLogger("gas.webhook")

ADMISSION_PODS = "/admission/pods"
# gas_admission_reviews{outcome}: the decisions, and "error" for requests not answered
# with one (400, 404, 405, 413, 500).
ERROR = "error"
OUTCOMES = (MUTATED, "allowed", REFUSED, ERROR)
_JSON = "application/json"


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reviews = Counter(
            "gas_admission_reviews",
            "AdmissionReviews answered by outcome: mutated (scheduler set, or turned into "
            "DRA claims), allowed (unchanged), refused (a GPU pod gas can never place), "
            "error (not answered, or its claim template could not be made).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in OUTCOMES:  # every outcome shown from the start, at 0
            self.reviews.labels(outcome)


def create_app(
    settings: Settings,
    metrics: WebhookMetrics | None = None,
    templates: TemplateMaker | None = None,
) -> Flask:
    """`templates`: how the claim templates of `settings.dra_claims` are made (required
    with it)."""
    if settings.dra_claims and templates is None:
        raise ValueError("converting pods to DRA claims needs a TemplateMaker")
    metrics = metrics or WebhookMetrics()
    app = Flask("gas-webhook")
    app.config["MAX_CONTENT_LENGTH"] = wire.DEFAULT_MAX_REQUEST_BYTES

    def pods() -> Response:
        body = read_body(request.environ, app.config["MAX_CONTENT_LENGTH"])
        answered = admission.review(body, settings)
        decision = answered.decision
        dry_run = " (dry run)" if answered.dry_run else ""
        template = decision.template
        if template is not None and templates is not None and not answered.dry_run:
            # Before the answer: the claim is made from the template once the pod is
            # stored. A dry run makes nothing (sideEffects: NoneOnDryRun).
            try:
                templates.ensure(answered.namespace, template)
            except TemplateError as exc:
                log.warning("pod %s not admitted: %s", answered.pod, exc)
                metrics.reviews.labels(ERROR).inc()
                return _json(admission.failed(answered, f"gas webhook: {exc}"))
        if decision.outcome == REFUSED:
            log.info("refused pod %s%s: %s", answered.pod, dry_run, decision.reason)
        elif template is not None:
            name = template["metadata"]["name"]
            log.debug("pod %s%s claims through template %s", answered.pod, dry_run, name)
        elif decision.outcome == MUTATED:
            log.debug("pod %s%s sent to %s", answered.pod, dry_run, settings.scheduler_name)
        metrics.reviews.labels(decision.outcome).inc()
        return _json(answered.body)

    def bad_request(exc: BadRequest) -> Response:
        log.info("bad request to %s: %s", request.path, exc)
        metrics.reviews.labels(ERROR).inc()
        return _json(wire.error_result(f"bad request: {exc}"), 400)

    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        log.info("%s %s -> %d", request.method, request.path, code)
        if request.path == ADMISSION_PODS:
            metrics.reviews.labels(ERROR).inc()
        return _json(wire.error_result(f"{code} {exc.name}: {exc.description}"), code)

    def internal_error(exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.path)
        metrics.reviews.labels(ERROR).inc()
        return _json(wire.error_result(f"internal error: {type(exc).__name__}: {exc}"), 500)

    def exposition() -> Response:
        return Response(generate_latest(metrics.registry), mimetype="text/plain; version=0.0.4")

    app.add_url_rule(ADMISSION_PODS, "pods", pods, methods=["POST"])
    app.add_url_rule(routes.HEALTHZ, "healthz", _ok, methods=["GET"])
    app.add_url_rule(routes.READYZ, "readyz", _ok, methods=["GET"])
    app.add_url_rule(routes.METRICS, "metrics", exposition, methods=["GET"])
    app.register_error_handler(BadRequest, bad_request)
    app.register_error_handler(HTTPException, http_error)
    app.register_error_handler(Exception, internal_error)
    setattr(app, hooks.SERVING_STATS, metrics.registry.register)
    return app


def _ok() -> Response:
    return _json({"status": "ok"})


def _json(body: object, status: int = 200) -> Response:
    return Response(wire.encode(body), status, mimetype=_JSON)
