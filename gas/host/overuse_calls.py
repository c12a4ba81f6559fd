"""What an agent says and does about over-use on the API server: a Warning Event on the pod
(posted from a queue on its own thread, `gas.kubeapi.events`), and an eviction through
the Eviction API, which keeps PodDisruptionBudgets: a budget that allows no disruption
now makes the API server answer 429, and the pod stays."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gas.host.containers import Holder
from gas.host.kubeapi import API_TIMEOUT
from gas.host.overuse import Eviction
from gas.kubeapi import events
from gas.kubeapi.core import RawCoreV1Api, status_message


def event_sender(core: RawCoreV1Api, stop: threading.Event) -> events.EventSender:
    def post(namespace: str, event: dict[str, Any]) -> None:
        response = core.create_namespaced_event(namespace, event, _request_timeout=API_TIMEOUT)
        response.drain_conn()
        response.release_conn()

    return events.EventSender(post, stop)


def announcer(
    sender: events.EventSender, component: str, node: str
) -> Callable[[Holder, str, str], None]:
    """`announce(holder, reason, message)`: a Warning Event on the holder's pod."""
    instance = f"{component}-{node or socket.gethostname()}"

    def announce(holder: Holder, reason: str, message: str) -> None:
        involved = {
            "kind": "Pod",
            "namespace": holder.namespace,
            "name": holder.pod,
            "uid": holder.pod_uid,
        }
        sender.send(
            events.event_body(
                involved,
                "Warning",
                reason,
                message,
                component=component,
                instance=instance,
                host=node,
            )
        )

    return announce


def evictor(core: RawCoreV1Api) -> Callable[[Eviction], str]:
    """`evict(eviction)`: `evicted`, `refused: <why>` (429, a disruption budget), `gone`
    (404, or another pod under the name now) or `failed: <why>`."""

    def evict(eviction: Eviction) -> str:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": eviction.pod, "namespace": eviction.namespace},
            # Only the pod judged: one made again under its name is not evicted for it.
            "deleteOptions": {"preconditions": {"uid": eviction.pod_uid}},
        }
        try:
            response = core.create_namespaced_pod_eviction(
                eviction.pod, eviction.namespace, body, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            why = status_message(exc.status, exc.reason, exc.body)
            if exc.status == 429:
                return f"refused: {why}"
            if exc.status in (404, 409):
                return "gone"
            return f"failed: {why}"
        except (HTTPError, OSError) as exc:
            return f"failed: cannot reach the API server: {exc}"
        json.loads(response.data or b"{}")
        return "evicted"

    return evict
