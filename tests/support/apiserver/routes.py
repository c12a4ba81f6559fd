"""The routes the double serves, and the answer to each request that is not a watch."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tests.support.apiserver.errors import ApiError, JSONDict, bad_request
from tests.support.apiserver.faults import fault_error
from tests.support.apiserver.kinds import EVENTS, KINDS, LEASES, Kind
from tests.support.apiserver.patches import PATCH_TYPES
from tests.support.apiserver.store import Store


@dataclass
class Response:
    code: int
    body: JSONDict
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    # "collection", "item", "status", "binding", "eviction", "proxy", "version", "health"
    target: str
    kind: Kind | None
    namespace: str | None
    name: str | None
    methods: frozenset[str]
    api_version: str = "v1"
    subpath: str = ""
    """What a proxy request asks of the pod (after `/proxy/`)."""


_SEG = r"([^/]+)"
_ROUTES: Final[tuple[tuple[re.Pattern[str], str, str | None, frozenset[str], str], ...]] = (
    (re.compile(r"^/api/v1/nodes$"), "collection", "nodes", frozenset({"GET", "POST"}), "v1"),
    (
        re.compile(rf"^/api/v1/nodes/{_SEG}$"),
        "item",
        "nodes",
        frozenset({"GET", "PUT", "PATCH", "DELETE"}),
        "v1",
    ),
    (
        re.compile(rf"^/api/v1/nodes/{_SEG}/status$"),
        "status",
        "nodes",
        frozenset({"GET", "PUT", "PATCH"}),
        "v1",
    ),
    (re.compile(r"^/api/v1/pods$"), "collection", "pods", frozenset({"GET"}), "v1"),
    (
        re.compile(rf"^/api/v1/namespaces/{_SEG}/pods$"),
        "collection",
        "pods",
        frozenset({"GET", "POST"}),
        "v1",
    ),
    (
        re.compile(rf"^/api/v1/namespaces/{_SEG}/pods/{_SEG}$"),
        "item",
        "pods",
        frozenset({"GET", "PUT", "PATCH", "DELETE"}),
        "v1",
    ),
    (
        re.compile(rf"^/api/v1/namespaces/{_SEG}/pods/{_SEG}/status$"),
        "status",
        "pods",
        frozenset({"GET", "PUT", "PATCH"}),
        "v1",
    ),
    (
        re.compile(rf"^/api/v1/namespaces/{_SEG}/pods/{_SEG}/binding$"),
        "binding",
        "pods",
        frozenset({"POST"}),
        "v1",
    ),
    (
        re.compile(rf"^/api/v1/namespaces/{_SEG}/pods/{_SEG}/eviction$"),
        "eviction",
        "pods",
        frozenset({"POST"}),
        "v1",
    ),
    (
        re.compile(rf"^/api/v1/namespaces/{_SEG}/pods/{_SEG}/proxy/(.*)$"),
        "proxy",
        "pods",
        frozenset({"GET"}),
        "v1",
    ),
    (re.compile(r"^/api/v1/events$"), "collection", "events", frozenset({"GET"}), "v1"),
    (
        re.compile(rf"^/api/v1/namespaces/{_SEG}/events$"),
        "collection",
        "events",
        frozenset({"GET", "POST"}),
        "v1",
    ),
    (
        re.compile(rf"^/apis/events\.k8s\.io/v1/namespaces/{_SEG}/events$"),
        "collection",
        "events",
        frozenset({"GET", "POST"}),
        "events.k8s.io/v1",
    ),
    (
        re.compile(rf"^/apis/coordination\.k8s\.io/v1/namespaces/{_SEG}/leases$"),
        "collection",
        "leases",
        frozenset({"GET", "POST"}),
        "coordination.k8s.io/v1",
    ),
    (
        re.compile(rf"^/apis/coordination\.k8s\.io/v1/namespaces/{_SEG}/leases/{_SEG}$"),
        "item",
        "leases",
        frozenset({"GET", "PUT", "DELETE"}),
        "coordination.k8s.io/v1",
    ),
    (
        re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices$"),
        "collection",
        "resourceslices",
        frozenset({"GET", "POST"}),
        "resource.k8s.io/v1",
    ),
    (
        re.compile(rf"^/apis/resource\.k8s\.io/v1/resourceslices/{_SEG}$"),
        "item",
        "resourceslices",
        frozenset({"GET", "PUT", "PATCH", "DELETE"}),
        "resource.k8s.io/v1",
    ),
    (
        re.compile(r"^/apis/resource\.k8s\.io/v1/resourceclaims$"),
        "collection",
        "resourceclaims",
        frozenset({"GET"}),
        "resource.k8s.io/v1",
    ),
    (
        re.compile(rf"^/apis/resource\.k8s\.io/v1/namespaces/{_SEG}/resourceclaims$"),
        "collection",
        "resourceclaims",
        frozenset({"GET", "POST"}),
        "resource.k8s.io/v1",
    ),
    (
        re.compile(rf"^/apis/resource\.k8s\.io/v1/namespaces/{_SEG}/resourceclaims/{_SEG}$"),
        "item",
        "resourceclaims",
        frozenset({"GET", "PUT", "PATCH", "DELETE"}),
        "resource.k8s.io/v1",
    ),
    (
        re.compile(rf"^/apis/resource\.k8s\.io/v1/namespaces/{_SEG}/resourceclaims/{_SEG}/status$"),
        "status",
        "resourceclaims",
        frozenset({"GET", "PUT", "PATCH"}),
        "resource.k8s.io/v1",
    ),
    (re.compile(r"^/version/?$"), "version", None, frozenset({"GET"}), "v1"),
    (re.compile(r"^/(healthz|readyz|livez)$"), "health", None, frozenset({"GET"}), "v1"),
)


def match_route(path: str) -> Route | None:
    for pattern, target, resource, methods, api_version in _ROUTES:
        m = pattern.match(path)
        if not m:
            continue
        groups = m.groups()
        kind = KINDS[resource] if resource else None
        namespace: str | None = None
        name: str | None = None
        if (
            kind is not None
            and kind.namespaced
            and groups  # a list across namespaces names none
            and path.startswith(("/api/v1/namespaces/", "/apis/"))
        ):
            namespace = groups[0]
            name = groups[1] if len(groups) > 1 else None
        elif kind is not None and groups:
            name = groups[0]
        subpath = groups[2] if target == "proxy" else ""
        return Route(target, kind, namespace, name, methods, api_version, subpath)
    return None


def decode_json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8") if body else "null")
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"json parse error: {exc}") from None


def decode_object(body: bytes) -> JSONDict:
    obj = decode_json(body)
    if not isinstance(obj, dict):
        raise bad_request("the body of the request must be a JSON object")
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise bad_request("metadata must be a JSON object")
    return obj


def dispatch(
    store: Store,
    lease_cut_off: set[str],
    route: Route,
    method: str,
    query: Mapping[str, str],
    body: bytes,
    content_type: str,
) -> Response:
    """Answer one non-watch request; an ApiError raised here is the answer instead."""
    if route.target == "version":
        return Response(
            200,
            {
                "major": "1",
                "minor": "31",
                "gitVersion": "v1.31.0-apiserver-double",
                "platform": "linux/amd64",
            },
        )
    if route.target == "health":
        return Response(200, {"status": "ok"})
    kind = route.kind
    assert kind is not None
    namespace = route.namespace or ""
    if kind is LEASES and method in ("POST", "PUT") and lease_cut_off:
        spec = decode_object(body).get("spec")
        if isinstance(spec, dict) and spec.get("holderIdentity") in lease_cut_off:
            raise fault_error(500)
    if route.target == "collection":
        if method == "GET":
            return Response(200, store.list_objects(kind, route.namespace, query))
        obj = decode_object(body)
        if kind is EVENTS:
            obj.setdefault("kind", "Event")
            obj.setdefault("apiVersion", route.api_version)
        with store.lock:
            created = store.create_locked(kind, namespace, obj, from_http=True)
        return Response(201, kind.typed(created))
    name = route.name or ""
    if route.target == "binding":
        store.bind(namespace, name, decode_json(body))
        return Response(
            201,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
        )
    subresource = "status" if route.target == "status" else ""
    if route.target == "eviction":
        return _evict(store, namespace, route.name or "", decode_json(body))
    if route.target == "proxy":
        return _proxy(store, namespace, route.name or "", route.subpath)
    if method == "GET":
        with store.lock:
            return Response(200, kind.typed(store.get_locked(kind, namespace, name)))
    if method == "PUT":
        obj = decode_object(body)
        with store.lock:
            return Response(
                200, kind.typed(store.update_locked(kind, namespace, name, obj, subresource))
            )
    if method == "PATCH":
        media = content_type.split(";", 1)[0].strip().lower()
        if media not in PATCH_TYPES:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
                {},
            )
        patch = decode_json(body)
        with store.lock:
            patched = store.patch_locked(kind, namespace, name, subresource, media, patch)
        return Response(200, kind.typed(patched))
    # DELETE
    options = decode_json(body) if body.strip() else None
    with store.lock:
        deleted = store.delete_locked(
            kind, namespace, name, options if isinstance(options, dict) else None
        )
    return Response(200, kind.typed(deleted))


def _evict(store: Store, namespace: str, name: str, eviction: Any) -> Response:
    """The Eviction API without disruption budgets (the double keeps none): the pod is
    deleted, its UID precondition honoured; 404 when it is not there."""
    from tests.support.apiserver.kinds import PODS

    options = (eviction or {}).get("deleteOptions") if isinstance(eviction, dict) else None
    with store.lock:
        store.delete_locked(PODS, namespace, name, options if isinstance(options, dict) else None)
    return Response(
        201,
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
    )


def _proxy(store: Store, namespace: str, name: str, subpath: str) -> Response:
    """The API server's proxy to a pod's port (`pod:port`): the double's pods listen on
    the loopback, so the GET goes to 127.0.0.1 at that port."""
    import urllib.error
    import urllib.request

    from tests.support.apiserver.kinds import PODS

    pod_name, _, port = name.partition(":")
    with store.lock:
        store.get_locked(PODS, namespace, pod_name)  # 404 when there is no such pod
    if not port.isdigit():
        raise bad_request(f"no port in {name!r}")
    url = f"http://127.0.0.1:{port}/{subpath}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read() or b"null")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ApiError(
            503, "ServiceUnavailable", f"error trying to reach service: {exc}", {}
        ) from None
    return Response(200, body if isinstance(body, dict) else {"value": body})
