"""The core/v1 and coordination/v1 calls of `gas serve`, `gas node` and `gas inspect`:
`RawCoreV1Api` and `RawCoordinationV1Api`, each method named and called as its namesake in
the generated client (`CoreV1Api`, `CoordinationV1Api`), with only the arguments gas uses.

They are made as the generated methods make them with `_preload_content=False`: the same
request (path, query, headers, JSON body) through the same `ApiClient.param_serialize` and
`call_api`, the response returned unread, and a status outside 2xx raised as the client's
`ApiException` once its body is read. What they skip is the generated module itself and
its models (see the package's docstring). Because the names are the generated ones, the
RBAC check of the manifests (tests/integration/test_manifests.py) reads a call here as the
generated call it stands for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypedDict, Unpack

from kubernetes.client.exceptions import ApiException
from urllib3 import BaseHTTPResponse

MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"

Timeout = float | tuple[float, float] | None

NODE_PATH = "/api/v1/nodes/{name}"
POD_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"
PODS_PATH = "/api/v1/namespaces/{namespace}/pods"
POD_PROXY_PATH = POD_PATH + "/proxy/{path}"
EVENTS_PATH = "/api/v1/namespaces/{namespace}/events"
LEASES_PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def status_message(status: int | None, reason: str | None, body: str | bytes | None) -> str:
    """The API server's own words for a failed request: its Status message when the body
    holds one, else the HTTP status and reason."""
    try:
        decoded = json.loads(body or "")
        if isinstance(decoded, dict) and decoded.get("message"):
            return f"{status} {decoded['message']}"
    except ValueError:
        pass
    return f"{status} {reason}"


class _Calls:
    def __init__(self, api_client: Any) -> None:
        """`api_client`: a `kubernetes.client.ApiClient`."""
        self.api_client = api_client

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
        headers = {"Accept": JSON}
        if content_type is not None:
            headers["Content-Type"] = content_type
        params = [(key, value) for key, value in (query or {}).items() if value is not None]
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            path_params=dict(path_params),
            query_params=params,
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

    def _list(self, path: str, options: ListOptions) -> BaseHTTPResponse:
        unknown = options.keys() - ListOptions.__annotations__.keys()
        if unknown:
            raise TypeError(f"unexpected list arguments: {sorted(unknown)}")
        query = {wire: options.get(name) for name, wire in _LIST_QUERY.items()}
        return self._call("GET", path, {}, query=query, timeout=options.get("_request_timeout"))


class ListOptions(TypedDict, total=False):
    """The arguments of a list or watch that gas uses, named as the generated client names
    them (`watch=True` makes a list a watch, its response a stream of JSON lines)."""

    allow_watch_bookmarks: bool | None
    _continue: str | None
    field_selector: str | None
    label_selector: str | None
    limit: int | None
    resource_version: str | None
    timeout_seconds: int | None
    watch: bool | None
    _request_timeout: Timeout


# Each list argument's query parameter, in the generated client's order, so the query
# string reads the same.
_LIST_QUERY = {
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "_continue": "continue",
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "limit": "limit",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


class PatchOptions(TypedDict, total=False):
    """The arguments of a patch that gas uses: a JSON merge patch unless `_content_type`
    says otherwise."""

    _content_type: str
    _request_timeout: Timeout


class RawCoreV1Api(_Calls):
    """The core/v1 calls."""

    def list_node(self, **options: Unpack[ListOptions]) -> BaseHTTPResponse:
        return self._list("/api/v1/nodes", options)

    def list_pod_for_all_namespaces(self, **options: Unpack[ListOptions]) -> BaseHTTPResponse:
        return self._list("/api/v1/pods", options)

    def list_namespaced_pod(
        self, namespace: str, **options: Unpack[ListOptions]
    ) -> BaseHTTPResponse:
        return self._list(PODS_PATH.format(namespace=namespace), options)

    def connect_get_namespaced_pod_proxy_with_path(
        self, name: str, namespace: str, path: str, *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        """GET `path` of the pod's port `name` (`pod:port`) through the API server's proxy."""
        where = {"name": name, "namespace": namespace, "path": path}
        return self._call("GET", POD_PROXY_PATH, where, timeout=_request_timeout)

    def read_node(self, name: str, *, _request_timeout: Timeout = None) -> BaseHTTPResponse:
        return self._call("GET", NODE_PATH, {"name": name}, timeout=_request_timeout)

    def patch_node(
        self, name: str, body: Mapping[str, Any], **options: Unpack[PatchOptions]
    ) -> BaseHTTPResponse:
        return self._patch(NODE_PATH, {"name": name}, body, options)

    def patch_node_status(
        self, name: str, body: Mapping[str, Any], **options: Unpack[PatchOptions]
    ) -> BaseHTTPResponse:
        return self._patch(NODE_PATH + "/status", {"name": name}, body, options)

    def read_namespaced_pod(
        self, name: str, namespace: str, *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        where = {"name": name, "namespace": namespace}
        return self._call("GET", POD_PATH, where, timeout=_request_timeout)

    def patch_namespaced_pod(
        self, name: str, namespace: str, body: Mapping[str, Any], **options: Unpack[PatchOptions]
    ) -> BaseHTTPResponse:
        return self._patch(POD_PATH, {"name": name, "namespace": namespace}, body, options)

    def create_namespaced_pod_eviction(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any],
        *,
        _request_timeout: Timeout = None,
    ) -> BaseHTTPResponse:
        return self._call(
            "POST",
            POD_PATH + "/eviction",
            {"name": name, "namespace": namespace},
            body=body,
            content_type=JSON,
            timeout=_request_timeout,
        )

    def create_namespaced_event(
        self, namespace: str, body: Mapping[str, Any], *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        return self._call(
            "POST",
            EVENTS_PATH,
            {"namespace": namespace},
            body=body,
            content_type=JSON,
            timeout=_request_timeout,
        )

    def _patch(
        self,
        path: str,
        path_params: Mapping[str, str],
        body: Mapping[str, Any],
        options: PatchOptions,
    ) -> BaseHTTPResponse:
        unknown = options.keys() - PatchOptions.__annotations__.keys()
        if unknown:
            raise TypeError(f"unexpected patch arguments: {sorted(unknown)}")
        return self._call(
            "PATCH",
            path,
            path_params,
            body=body,
            content_type=options.get("_content_type", MERGE_PATCH),
            timeout=options.get("_request_timeout"),
        )


class RawCoordinationV1Api(_Calls):
    """The Lease calls of leader election (coordination.k8s.io/v1)."""

    def read_namespaced_lease(
        self, name: str, namespace: str, *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        where = {"name": name, "namespace": namespace}
        return self._call("GET", LEASES_PATH + "/{name}", where, timeout=_request_timeout)

    def create_namespaced_lease(
        self, namespace: str, body: Mapping[str, Any], *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        where = {"namespace": namespace}
        return self._call(
            "POST", LEASES_PATH, where, body=body, content_type=JSON, timeout=_request_timeout
        )

    def replace_namespaced_lease(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any],
        *,
        _request_timeout: Timeout = None,
    ) -> BaseHTTPResponse:
        where = {"name": name, "namespace": namespace}
        path = LEASES_PATH + "/{name}"
        return self._call(
            "PUT", path, where, body=body, content_type=JSON, timeout=_request_timeout
        )
