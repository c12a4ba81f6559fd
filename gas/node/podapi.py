"""The device plugin's API-server calls: pods on this node, the `gas-node-cards`
annotation, Events.

Every pod and Event call of `gas node` goes through `NodeApi`, so its RBAC (get, list and
watch `pods` on this node, patch `pods`, create `events`) can be read off this module.
Objects are read as plain JSON, the shape the pure code reads (`gas.kubeapi.core`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from gas.kubeapi import events
from gas.kubeapi.core import MERGE_PATCH, RawCoreV1Api
from gas.kubeapi.reflector import Expired

LIST_TIMEOUT = (5.0, 60.0)
CALL_TIMEOUT = (3.0, 10.0)
WATCH_SECONDS = 300
COMPONENT = "gas-node"


class PodGone(Exception):
    """The pod was deleted, or replaced by another with the same name (UID mismatch)."""


class CallFailed(Exception):
    """A call that may succeed when retried."""


class Rejected(Exception):
    """The API server refused the call for good (say 403): retrying would not help."""


def _fail(exc: ApiException, what: str) -> Exception:
    status = exc.status or 0
    message = f"{what}: {status} {exc.reason}"
    if status in (404, 409, 410, 422) and what.startswith("patch"):
        # 409/422: the UID in the patch's metadata no longer matches: a new pod.
        return PodGone(message)
    if 400 <= status < 500 and status not in (408, 429):
        return Rejected(message)
    return CallFailed(message)


class NodeApi:
    """The calls of one `gas node`, all about pods on `node`."""

    def __init__(self, core: RawCoreV1Api, node: str) -> None:
        """`core`: the client (`gas.host.kubeapi.core_api`)."""
        self.node = node
        self._core = core
        self._selector = f"spec.nodeName={node}"

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        """Every pod bound to this node, and the list's resourceVersion."""
        try:
            response = self._core.list_pod_for_all_namespaces(
                field_selector=self._selector, _request_timeout=LIST_TIMEOUT
            )
        except ApiException as exc:
            raise _fail(exc, "list pods") from exc
        body = json.loads(response.data)
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    def watch_pods(self, version: str) -> Iterator[dict[str, Any]]:
        """Watch events (`type`, `object`) of this node's pods from `version`."""
        try:
            response = self._core.list_pod_for_all_namespaces(
                field_selector=self._selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=(5, WATCH_SECONDS + 30),
            )
        except ApiException as exc:
            if exc.status == 410:  # the version is compacted away: list again
                raise Expired() from None
            raise _fail(exc, "watch pods") from exc
        try:
            for line in response:
                line = line.strip()
                if line:
                    yield json.loads(line)
        finally:
            response.release_conn()

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = self._core.read_namespaced_pod(
                name, namespace, _request_timeout=CALL_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _fail(exc, "get pod") from exc
        pod: dict[str, Any] = json.loads(response.data)
        return pod

    def patch_pod_annotation(
        self, namespace: str, name: str, uid: str, key: str, value: str
    ) -> None:
        """A JSON merge patch of one annotation, guarded by the pod's UID."""
        patch = {"metadata": {"uid": uid, "annotations": {key: value}}}
        try:
            response = self._core.patch_namespaced_pod(
                name, namespace, patch, _content_type=MERGE_PATCH, _request_timeout=CALL_TIMEOUT
            )
        except ApiException as exc:
            raise _fail(exc, f"patch pod {namespace}/{name}") from exc
        response.drain_conn()
        response.release_conn()

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        try:
            response = self._core.create_namespaced_event(
                namespace, event, _request_timeout=CALL_TIMEOUT
            )
        except ApiException as exc:
            raise _fail(exc, "create event") from exc
        response.drain_conn()
        response.release_conn()


def event_body(
    involved: Mapping[str, Any], event_type: str, reason: str, message: str, node: str
) -> dict[str, Any]:
    """A core/v1 Event about `involved` (kind, name, namespace, uid), from this node's
    agent."""
    instance = f"{COMPONENT}-{node or socket.gethostname()}"
    return events.event_body(
        involved, event_type, reason, message, component=COMPONENT, instance=instance, host=node
    )
