"""The admission webhook's wire format: an AdmissionReview (admission.k8s.io/v1) in, its
answer out.

Decoding is strict where the answer depends on it: the body must be an AdmissionReview v1
with a `request` carrying a `uid` (the API server matches the answer by it) and an
`operation`. Everything it refuses raises `BadRequest` (answered with 400). The decision
itself is `gas.core.admission.decide`; a refusal's message is the filter's reason as the
filter writes it (`wire.clean`), and its status code 403: the API server reports it as
"Forbidden", a policy refusal, which is what it is (the pod is valid Kubernetes that gas
will not place).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gas.core.admission import REFUSED, Decision, Settings, decide
from gas.core.model import as_mapping
from gas.serving import wire
from gas.serving.wire import BadRequest

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
REFUSAL_CODE = 403


@dataclass(frozen=True)
class Review:
    """One AdmissionReview answered: the body to send back, the decision, and the pod it
    was about (`namespace/name`, for the log)."""

    body: dict[str, Any]
    decision: Decision
    pod: str
    dry_run: bool
    namespace: str = ""


def review(body: bytes, settings: Settings) -> Review:
    """The AdmissionReview response for the AdmissionReview request in `body`."""
    return respond(wire.decode_object(body), settings)


def respond(document: Mapping[str, Any], settings: Settings) -> Review:
    """The AdmissionReview response for the decoded AdmissionReview `document`: no I/O."""
    # Top-level keys read case-insensitively, as Go's decoder reads them.
    folded = {str(key).lower(): value for key, value in document.items()}
    version, kind = folded.get("apiversion"), folded.get("kind")
    if version != API_VERSION or kind != KIND:
        raise BadRequest(
            f"body must be an {KIND} of {API_VERSION}, not kind {str(kind)[:40]!r} "
            f"of {str(version)[:40]!r}"
        )
    request = folded.get("request")
    if not isinstance(request, dict):
        raise BadRequest(f"{KIND}.request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest(f"{KIND}.request.uid must be a non-empty string")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise BadRequest(f"{KIND}.request.operation must be a non-empty string")
    pod = as_mapping(request.get("object")) if _is_pod(request) else {}
    decision = decide(pod, operation, settings)
    dry_run = request.get("dryRun") is True
    namespace = request.get("namespace")
    namespace = namespace if isinstance(namespace, str) else ""
    return Review(_answer(uid, decision), decision, _pod_name(request, pod), dry_run, namespace)


def failed(answered: Review, message: str) -> dict[str, Any]:
    """`answered` turned into a refusal for a failure of the webhook's own (the claim
    template could not be made): 500, so the user reads it as the webhook's fault and the
    pod's controller retries."""
    uid = answered.body["response"]["uid"]
    response = {
        "uid": uid,
        "allowed": False,
        "status": {
            "status": "Failure",
            "reason": "InternalError",
            "code": 500,
            "message": wire.clean(message),
        },
    }
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _is_pod(request: dict[str, Any]) -> bool:
    """A pod itself (core v1), not one of its subresources."""
    resource = as_mapping(request.get("resource"))
    return (
        resource.get("group") == ""
        and resource.get("resource") == "pods"
        and not request.get("subResource")
    )


def _answer(uid: str, decision: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.outcome != REFUSED}
    if decision.outcome == REFUSED:
        response["status"] = {
            "status": "Failure",
            "reason": "Forbidden",
            "code": REFUSAL_CODE,
            "message": wire.clean(decision.reason),
        }
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(wire.encode(list(decision.patch))).decode("ascii")
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _pod_name(request: dict[str, Any], pod: Any) -> str:
    """`namespace/name` of the pod reviewed; a pod created with generateName has no name
    yet (the API server names it after admission), so its prefix stands in."""
    metadata = as_mapping(as_mapping(pod).get("metadata"))
    namespace = request.get("namespace") or metadata.get("namespace") or ""
    name = request.get("name") or metadata.get("name")
    if not name:
        prefix = metadata.get("generateName")
        name = f"{prefix}*" if isinstance(prefix, str) and prefix else "?"
    return f"{str(namespace)[:253]}/{str(name)[:253]}"
