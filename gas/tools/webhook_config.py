"""The webhook configuration that registers `gas webhook` with the API server.

One object, built here, is what `gas certs` prints with its caBundle and what deploy/
ships without one (a test holds them equal). docs/webhook.md explains the choices:

- only pod CREATEs, and of those only the pods with a `gpu.intel.com/` resource in any
  container's or init container's limits or requests (`matchConditions`, evaluated by the
  API server): an outage of gas never blocks a pod that asks for no GPU;
- `failurePolicy: Fail`: while the webhook cannot answer, GPU pods are refused rather than
  admitted unchecked and scheduled by the default scheduler on the node's totals alone,
  the failure gas exists to prevent;
- kube-system and gas's own namespace excluded, so gas's own pods and the control plane
  are never waiting on gas;
- no side effects (dry runs are answered the same), a short timeout, no reinvocation;
  with `dra_claims` (`gas webhook --draClaims`) side effects on real requests only
  (`NoneOnDryRun`): the webhook makes the pod's ResourceClaimTemplate, never on a dry run.
"""

from __future__ import annotations

import base64
from typing import Any

CONFIGURATION_NAME = "gas-webhook"
WEBHOOK_NAME = "gpu-pods.gas.intel.com"
NAMESPACE = "gas-system"
SERVICE = "gas-webhook"
PATH = "/admission/pods"
SERVICE_PORT = 443
TIMEOUT_SECONDS = 5
NAMESPACE_LABEL = "kubernetes.io/metadata.name"

# True for a pod (the admitted `object`) whose containers or init containers name a
# gpu.intel.com/ resource in their limits or requests; `has` guards the optional fields,
# since a matchCondition that errs counts under failurePolicy (here: refused).
_ASKS = (
    "has(c.resources) && ("
    "(has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('gpu.intel.com/')))"
    " || "
    "(has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('gpu.intel.com/')))"
    ")"
)
GPU_POD_EXPRESSION = (
    f"object.spec.containers.exists(c, {_ASKS}) || "
    f"(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {_ASKS}))"
)


def webhook_configuration(
    ca_bundle: bytes | None,
    *,
    namespace: str = NAMESPACE,
    service: str = SERVICE,
    url: str | None = None,
    validate_only: bool = False,
    dra_claims: bool = False,
) -> dict[str, Any]:
    """The admissionregistration.k8s.io/v1 object: a MutatingWebhookConfiguration, or
    with `validate_only` a ValidatingWebhookConfiguration (kubeadm installs: `gas webhook
    --validateOnly` returns no patch, and a validating webhook sees the pod after every
    mutation). `ca_bundle`: the PEM of the CA that signed the webhook's certificate (None:
    left out, for cert-manager's injection to fill in). `url` replaces the Service
    reference (a webhook outside the cluster, or on loopback in tests)."""
    client: dict[str, Any]
    if url is not None:
        client = {"url": url}
    else:
        client = {
            "service": {"namespace": namespace, "name": service, "path": PATH, "port": SERVICE_PORT}
        }
    if ca_bundle is not None:
        client["caBundle"] = base64.b64encode(ca_bundle).decode("ascii")
    webhook: dict[str, Any] = {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client,
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": NAMESPACE_LABEL,
                    "operator": "NotIn",
                    "values": sorted({"kube-system", namespace}),
                }
            ]
        },
        "matchConditions": [{"name": "asks-for-intel-gpu", "expression": GPU_POD_EXPRESSION}],
        "sideEffects": "NoneOnDryRun" if dra_claims else "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
    }
    kind = "ValidatingWebhookConfiguration"
    if not validate_only:
        kind = "MutatingWebhookConfiguration"
        webhook["reinvocationPolicy"] = "Never"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": CONFIGURATION_NAME},
        "webhooks": [webhook],
    }
