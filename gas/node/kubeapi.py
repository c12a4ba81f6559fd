"""The node side's Kubernetes client: loading it, the calls it makes, reading this node,
describing failures.

`gas node` makes seven core/v1 calls. It makes them through the official client's
`ApiClient` (its configuration, kubeconfig and in-cluster loaders, credentials, TLS and
connection pool), but not through the generated `CoreV1Api`: importing that class loads
its 63,000-line module and some 130 pydantic models, about 20 MiB of a process whose job
needs none of them, as every answer is read as plain JSON. `NodeCoreApi` has the same
method names and arguments as `CoreV1Api`, so the RBAC check of the manifests reads it as
such, and returns the raw response, as `CoreV1Api` does with `_preload_content=False`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3 import BaseHTTPResponse

from gas.node.errors import NodeError

MERGE_PATCH = "application/merge-patch+json"
API_TIMEOUT = (5.0, 30.0)
"""Connect and read timeouts of each API call."""

Timeout = float | tuple[float, float] | None


class NodeCoreApi:
    """The core/v1 calls of `gas node` and `gas label-node`, each named and called as its
    `CoreV1Api` namesake (only the arguments gas uses). Every call returns the response
    unread, and raises `ApiException` on a status outside 2xx, after reading its body."""

    def __init__(self, api_client: Any) -> None:
        """`api_client`: a `kubernetes.client.ApiClient` (`core_api` makes it)."""
        self.api_client = api_client

    def read_node(self, name: str, *, _request_timeout: Timeout = None) -> BaseHTTPResponse:
        return self._call("GET", "/api/v1/nodes/{name}", {"name": name}, timeout=_request_timeout)

    def patch_node(
        self,
        name: str,
        body: Mapping[str, Any],
        *,
        _content_type: str = MERGE_PATCH,
        _request_timeout: Timeout = None,
    ) -> BaseHTTPResponse:
        return self._patch(
            "/api/v1/nodes/{name}", {"name": name}, body, _content_type, _request_timeout
        )

    def patch_node_status(
        self,
        name: str,
        body: Mapping[str, Any],
        *,
        _content_type: str = MERGE_PATCH,
        _request_timeout: Timeout = None,
    ) -> BaseHTTPResponse:
        return self._patch(
            "/api/v1/nodes/{name}/status", {"name": name}, body, _content_type, _request_timeout
        )

    def list_pod_for_all_namespaces(
        self,
        *,
        field_selector: str | None = None,
        watch: bool | None = None,
        resource_version: str | None = None,
        allow_watch_bookmarks: bool | None = None,
        timeout_seconds: int | None = None,
        _request_timeout: Timeout = None,
    ) -> BaseHTTPResponse:
        query = {
            "allowWatchBookmarks": allow_watch_bookmarks,
            "fieldSelector": field_selector,
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "watch": watch,
        }
        return self._call("GET", "/api/v1/pods", {}, query=query, timeout=_request_timeout)

    def read_namespaced_pod(
        self, name: str, namespace: str, *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        return self._call(
            "GET",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"name": name, "namespace": namespace},
            timeout=_request_timeout,
        )

    def patch_namespaced_pod(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any],
        *,
        _content_type: str = MERGE_PATCH,
        _request_timeout: Timeout = None,
    ) -> BaseHTTPResponse:
        return self._patch(
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"name": name, "namespace": namespace},
            body,
            _content_type,
            _request_timeout,
        )

    def create_namespaced_event(
        self, namespace: str, body: Mapping[str, Any], *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        return self._call(
            "POST",
            "/api/v1/namespaces/{namespace}/events",
            {"namespace": namespace},
            body=body,
            content_type="application/json",
            timeout=_request_timeout,
        )

    def _patch(
        self,
        path: str,
        path_params: Mapping[str, str],
        body: Mapping[str, Any],
        content_type: str,
        timeout: Timeout,
    ) -> BaseHTTPResponse:
        return self._call(
            "PATCH", path, path_params, body=body, content_type=content_type, timeout=timeout
        )

    def _call(
        self,
        method: str,
        path: str,
        path_params: Mapping[str, str],
        *,
        query: Mapping[str, object] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        timeout: Timeout,
    ) -> BaseHTTPResponse:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        params: Sequence[tuple[str, object]] = [
            (key, value) for key, value in (query or {}).items() if value is not None
        ]
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            path_params=dict(path_params),
            query_params=list(params),
            header_params=headers,
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()  # the error's body says why
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        raw: BaseHTTPResponse = response.response
        return raw


def core_api(kubeconfig: str | None) -> NodeCoreApi:
    """The client from the kubeconfig when given, else in-cluster, else $KUBECONFIG or
    ~/.kube/config."""
    from kubernetes import client, config

    # The client's config loaders carry no annotations.
    from_file: Callable[..., Any] = config.new_client_from_config
    in_cluster: Callable[..., None] = config.load_incluster_config
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise NodeError(f"kubeconfig {kubeconfig}: no such file")
    try:
        if kubeconfig:
            return NodeCoreApi(from_file(config_file=kubeconfig))
        configuration = client.Configuration()
        try:
            in_cluster(client_configuration=configuration)
            return NodeCoreApi(client.ApiClient(configuration))
        except config.ConfigException:
            return NodeCoreApi(from_file())
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "not in a cluster, and no --kubeConfig"
        raise NodeError(f"cannot load Kubernetes client configuration ({where}): {exc}") from exc


def read_node(api: NodeCoreApi, node: str) -> dict[str, Any]:
    """The node object as JSON, as the API server sent it."""
    response = api.read_node(node, _request_timeout=API_TIMEOUT)
    obj = json.loads(response.data)
    if not isinstance(obj, dict):
        raise ValueError(f"node {node}: the API server sent no object")
    return obj


def merge_patch(call: Callable[..., BaseHTTPResponse], name: str, body: Mapping[str, Any]) -> None:
    """A JSON merge patch through a client method (`patch_node`, `patch_node_status`).

    The answer is not decoded: only the write matters.
    """
    response = call(name, dict(body), _content_type=MERGE_PATCH, _request_timeout=API_TIMEOUT)
    # Read to the end, so the connection goes back to the pool clean for the next call.
    response.drain_conn()
    response.release_conn()


def describe_api_error(exc: Exception, node: str) -> str:
    status = getattr(exc, "status", None)
    if status == 404:
        return f"node {node} not found"
    if status in (401, 403):
        return f"not allowed to read or patch node {node} (HTTP {status}): check the RBAC rules"
    if status is not None:
        return f"API error on node {node}: HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return f"cannot reach the API server: {exc}"
