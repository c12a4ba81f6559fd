"""The ResourceClaimTemplates `gas webhook --draClaims` points converted pods at.

A pod's claim is made by kube-controller-manager from the template its
`resourceClaimTemplateName` names, after admission; so the template must exist in the
pod's namespace before the webhook answers. Templates are named by the claim they make
(gas.core.dra_claims.template_name), so the pods of one shape share one, and making one is
idempotent: read it, create it when absent, and on a race (409) read it again. A template
of that name that makes another claim (changed by hand) is an error, never silently used:
the pod would get other amounts than it asked for. Each pod costs one read: nothing is
remembered, so a template deleted by hand is made again by the next pod of its shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from gas.core.quantity import QuantityError, parse_quantity
from gas.kubeapi.core import status_message
from gas.kubeapi.dra import RawResourceV1Api

TIMEOUT = (2.0, 3.0)
"""Connect and read timeouts of each call: the API server waits for the webhook at most
timeoutSeconds (5 s), and a pod refused after a slow call is retried by its controller."""


class TemplateError(Exception):
    """The template could not be made or is not the one the pod needs; the message says
    why, for the user who created the pod."""


class TemplateMaker:
    def __init__(self, api: RawResourceV1Api) -> None:
        self.api = api

    def ensure(self, namespace: str, template: Mapping[str, Any]) -> None:
        """Make `template` exist in `namespace`, as it is; TemplateError otherwise."""
        name = template["metadata"]["name"]
        where = f"ResourceClaimTemplate {namespace}/{name}"
        stored = self._read(name, namespace, where)
        if stored is None:
            try:
                self.api.create_namespaced_resource_claim_template(
                    namespace, template, _request_timeout=TIMEOUT
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise TemplateError(f"cannot create {where}: {_message(exc)}") from exc
                stored = self._read(name, namespace, where)  # made meanwhile by another
                if stored is None:
                    raise TemplateError(f"cannot create {where}: it exists and is gone") from exc
        if stored is not None and not _contains(stored.get("spec"), template["spec"]):
            raise TemplateError(
                f"{where} exists but makes another claim than this pod needs; delete it and "
                "create the pod again"
            )

    def _read(self, name: str, namespace: str, where: str) -> dict[str, Any] | None:
        try:
            response = self.api.read_namespaced_resource_claim_template(
                name, namespace, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise TemplateError(f"cannot read {where}: {_message(exc)}") from exc
        stored = json.loads(response.data)
        return stored if isinstance(stored, dict) else {}


def _message(exc: ApiException) -> str:
    return status_message(exc.status, exc.reason, exc.body)


def _contains(stored: object, wanted: object) -> bool:
    """Whether the stored object says all that `wanted` says: the API server adds defaults
    (allocationMode, count) and may write a quantity in another form (`1024Mi` as `1Gi`)."""
    if isinstance(wanted, Mapping):
        return isinstance(stored, Mapping) and all(
            _contains(stored.get(key), value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(wanted)
            and all(_contains(s, w) for s, w in zip(stored, wanted, strict=True))
        )
    if stored == wanted:
        return True
    if isinstance(stored, str) and isinstance(wanted, str):
        try:
            return parse_quantity(stored) == parse_quantity(wanted)
        except QuantityError:
            return False
    return False
