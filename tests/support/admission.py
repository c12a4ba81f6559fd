"""AdmissionReview requests as kube-apiserver v1.28 sends them to a webhook, and what the
tests read from the answers."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

from tests.support.json_patch import apply_patch

I915, MEM = "gpu.intel.com/i915", "gpu.intel.com/memory.max"

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


def gpu_pod(
    name: str = "p",
    limits: dict[str, Any] | None = None,
    *,
    annotations: dict[str, Any] | None = None,
    scheduler: str | None = "default-scheduler",
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod as the API server hands it to admission: defaulted (schedulerName set to
    default-scheduler), extended-resource limits copied into requests."""
    if containers is None:
        limits = {I915: "1", MEM: "1Gi"} if limits is None else limits
        containers = [container("app", limits)]
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def container(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    resources = {"limits": dict(limits), "requests": dict(limits)} if limits else {}
    return {"name": name, "image": "busybox", "resources": resources}
