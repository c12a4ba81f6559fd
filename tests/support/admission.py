"""AdmissionReview requests as kube-apiserver v1.28 sends them to a webhook, and what the
tests read from the answers."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

from tests.support.json_patch import apply_patch

_OPTIONS = {
    "CREATE": "CreateOptions",
    "UPDATE": "UpdateOptions",
    "DELETE": "DeleteOptions",
}


def review_request(
    pod: dict[str, Any] | None,
    operation: str = "CREATE",
    *,
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
    uid: str | None = None,
    resource: str = "pods",
    kind: str = "Pod",
    sub_resource: str | None = None,
) -> dict[str, Any]:
    """The AdmissionReview for `operation` on `pod` (for DELETE, `old` is the pod)."""
    meta = (pod or old or {}).get("metadata", {})
    gvk = {"group": "", "version": "v1", "kind": kind}
    gvr = {"group": "", "version": "v1", "resource": resource}
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "namespace": meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": copy.deepcopy(pod),
        "oldObject": copy.deepcopy(old),
        "dryRun": dry_run,
        "options": {"kind": _OPTIONS[operation], "apiVersion": "meta.k8s.io/v1"},
    }
    if meta.get("name"):
        request["name"] = meta["name"]
    if sub_resource is not None:
        request["subResource"] = sub_resource
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def patched(pod: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the API server stores it after `answer` (an AdmissionReview response)."""
    response = answer["response"]
    if "patch" not in response:
        assert "patchType" not in response
        return pod
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"], validate=True))
    result: dict[str, Any] = apply_patch(pod, operations)
    return result
