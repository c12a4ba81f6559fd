"""A stateful, in-process double of the Kubernetes API server for integration tests.

The double speaks real HTTP/1.1 on 127.0.0.1 so that the real ``kubernetes`` Python
client (possibly in another process) can talk to it.  It models the parts of core/v1
the extender uses: nodes, pods (incl. ``/status`` and ``/binding``), events, list and
watch with resourceVersion semantics, selectors, patches and ``kind: Status`` errors,
following the real kube-apiserver's rules and messages.

Typical pytest fixture::

    @pytest.fixture
    def apiserver(tmp_path):
        with ApiServerDouble() as double:
            double.kubeconfig_path = double.write_kubeconfig(tmp_path / "kubeconfig")
            yield double

    def test_something(apiserver):
        api = kubernetes.client.CoreV1Api(
            kubernetes.config.new_client_from_config(config_file=apiserver.kubeconfig_path)
        )
        apiserver.add_node({"metadata": {"name": "n1"}})
        assert api.list_node().items[0].metadata.name == "n1"

Everything the tests read back (``get_pod``, ``list_nodes``, ``events`` ...) is a deep
copy; stored objects are never mutated in place (every write stores a new dict), so
they can be shared with watch streams without copying.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import re
import select
import socket
import socketserver
import string
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final, cast
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "ApiError",
    "ApiServerDouble",
    "FaultInjector",
    "FaultRule",
    "JSONDict",
    "RbacGrant",
    "RbacRequest",
    "rbac_grants_from_manifests",
    "rbac_request",
]

JSONDict = dict[str, Any]

_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"
_DEFAULT_HISTORY: Final = 10_000
_POLL_SECONDS: Final = 0.25

# Patch content types, as accepted by the real server (apply-patch is not modelled).
_JSON_PATCH: Final = "application/json-patch+json"
_MERGE_PATCH: Final = "application/merge-patch+json"
_STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
_PATCH_TYPES: Final = frozenset({_JSON_PATCH, _MERGE_PATCH, _STRATEGIC_PATCH})

_REASONS: Final[Mapping[int, str]] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_FAULT_MESSAGES: Final[Mapping[int, str]] = {
    429: "the server has received too many requests and has asked us to try again later",
    500: "Internal error occurred: injected fault",
    503: "the server is currently unable to handle the request",
    504: (
        "the server was unable to return a response in the time allotted, "
        "but may still be processing the request"
    ),
}


def _now() -> str:
    return datetime.now(UTC).strftime(_TIME_FORMAT)


# metav1.Time fields of the objects served here (rendered as RFC 3339, seconds, UTC "Z").
_TIME_KEYS: Final = frozenset(
    {
        "creationTimestamp",
        "deletionTimestamp",
        "lastTransitionTime",
        "lastProbeTime",
        "lastHeartbeatTime",
        "lastUpdateTime",
        "startTime",
        "startedAt",
        "finishedAt",
        "firstTimestamp",
        "lastTimestamp",
    }
)


def _normalize_time(value: str) -> str:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime(_TIME_FORMAT)


def _normalize(value: Any, key: str = "") -> Any:
    """What a decode/encode round trip through the Go types does to a JSON object.

    ``null`` fields disappear and times are re-rendered, so e.g. an object read with the
    Python client and written back unchanged (which renders times as ``+00:00`` and
    drops ``null`` fields) is recognised as unchanged.
    """
    if isinstance(value, dict):
        return {k: _normalize(v, k) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if key in _TIME_KEYS and isinstance(value, str):
        return _normalize_time(value)
    return value


def _stored_form(kind_resource: str, obj: JSONDict) -> JSONDict:
    normalized: JSONDict = _normalize(obj)
    if kind_resource == "pods":
        # PodCondition's zero metav1.Time fields are rendered as null by the real server.
        status = normalized.get("status")
        conditions = status.get("conditions") if isinstance(status, dict) else None
        for condition in conditions if isinstance(conditions, list) else []:
            if isinstance(condition, dict):
                condition.setdefault("lastProbeTime", None)
                condition.setdefault("lastTransitionTime", None)
    return normalized


def _canonical(obj: Any) -> str:
    """A JSON rendering that distinguishes ``true`` from ``1`` (used for no-op detection)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _parse_bool(value: str | None) -> bool:
    """Go's strconv.ParseBool truthy spellings (anything else is false)."""
    return value in {"1", "t", "T", "true", "TRUE", "True"}


# ---------------------------------------------------------------------------------------
# Errors


class ApiError(Exception):
    """An API failure rendered as a ``kind: Status`` body, exactly like the real server.

    ``reason`` may be ``""`` (real server's StatusReasonUnknown: the key is omitted) and
    ``details`` may be ``None`` (omitted, as for BadRequest).
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JSONDict | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers: dict[str, str] = dict(headers or {})

    def status(self) -> JSONDict:
        body: JSONDict = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def _not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}
    )


def _already_exists(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{resource} "{name}" already exists',
        {"name": name, "kind": resource},
    )


def _conflict(resource: str, name: str, cause: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": {cause}',
        {"name": name, "kind": resource},
    )


def _modified_conflict(resource: str, name: str) -> ApiError:
    return _conflict(
        resource,
        name,
        "the object has been modified; please apply your changes to the latest version "
        "and try again",
    )


def _precondition_conflict(resource: str, name: str, storage_key: str, detail: str) -> ApiError:
    # storage.NewInvalidObjError(...) wrapped by storeerr.InterpretUpdateError.
    cause = (
        f"StorageError: invalid object, Code: 4, Key: {storage_key}, ResourceVersion: 0, "
        f"AdditionalErrorMsg: Precondition failed: {detail}"
    )
    return _conflict(resource, name, cause)


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _invalid(kind: str, name: str, field_path: str, cause_reason: str, detail: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {field_path}: {detail}',
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": cause_reason, "message": detail, "field": field_path}],
        },
    )


def _unprocessable(message: str) -> ApiError:
    # apierrors.NewGenericServerResponse(422, ...) as used for failed JSON patches.
    return ApiError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": message}]},
    )


def _route_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _method_not_allowed() -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


def _fault_error(code: int) -> ApiError:
    reason = _REASONS.get(code, "")
    message = _FAULT_MESSAGES.get(code, f"injected fault: HTTP {code}")
    details: JSONDict = {}
    headers: dict[str, str] = {}
    if code == 429:
        details["retryAfterSeconds"] = 1
        headers["Retry-After"] = "1"
    return ApiError(code, reason, message, details, headers)


# ---------------------------------------------------------------------------------------
# Resource kinds and selectors


def _field_str(obj: JSONDict, *path: str, default: str = "") -> str:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    if cur is None:
        return default
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _field_getter(*path: str, default: str = "") -> Callable[[JSONDict], str]:
    return lambda obj: _field_str(obj, *path, default=default)


@dataclass(frozen=True)
class _Kind:
    resource: str
    kind: str
    list_kind: str
    namespaced: bool
    storage_prefix: str
    fields: Mapping[str, Callable[[JSONDict], str]]
    api_version: str = "v1"

    def storage_key(self, namespace: str, name: str) -> str:
        if self.namespaced:
            return f"{self.storage_prefix}/{namespace}/{name}"
        return f"{self.storage_prefix}/{name}"

    def typed(self, obj: JSONDict) -> JSONDict:
        """The object with ``kind``/``apiVersion`` first, as returned by GET/watch."""
        if "kind" in obj:
            return obj
        return {"kind": self.kind, "apiVersion": self.api_version, **obj}


_PODS: Final = _Kind(
    "pods",
    "Pod",
    "PodList",
    True,
    "/registry/pods",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "metadata.namespace": _field_getter("metadata", "namespace"),
        "spec.nodeName": _field_getter("spec", "nodeName"),
        "spec.restartPolicy": _field_getter("spec", "restartPolicy"),
        "spec.schedulerName": _field_getter("spec", "schedulerName"),
        "spec.serviceAccountName": _field_getter("spec", "serviceAccountName"),
        "spec.hostNetwork": _field_getter("spec", "hostNetwork", default="false"),
        "status.phase": _field_getter("status", "phase"),
        "status.podIP": _field_getter("status", "podIP"),
        "status.nominatedNodeName": _field_getter("status", "nominatedNodeName"),
    },
)
_NODES: Final = _Kind(
    "nodes",
    "Node",
    "NodeList",
    False,
    "/registry/minions",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "spec.unschedulable": _field_getter("spec", "unschedulable", default="false"),
    },
)
_EVENTS: Final = _Kind(
    "events",
    "Event",
    "EventList",
    True,
    "/registry/events",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "metadata.namespace": _field_getter("metadata", "namespace"),
    },
)
# Leader election: create/get/update with resourceVersion optimistic concurrency (409).
_LEASES: Final = _Kind(
    "leases",
    "Lease",
    "LeaseList",
    True,
    "/registry/leases",
    {
        "metadata.name": _field_getter("metadata", "name"),
        "metadata.namespace": _field_getter("metadata", "namespace"),
    },
    "coordination.k8s.io/v1",
)
_KINDS: Final[Mapping[str, _Kind]] = {k.resource: k for k in (_PODS, _NODES, _EVENTS, _LEASES)}

_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_VALUE = r"[-A-Za-z0-9_.]*"
_SET_TERM = re.compile(rf"^({_LABEL_KEY})\s+(in|notin)\s+\(([^)]*)\)$")
_EQ_TERM = re.compile(rf"^({_LABEL_KEY})\s*(==|!=|=)\s*({_LABEL_VALUE})$")
_EXISTS_TERM = re.compile(rf"^(!?)\s*({_LABEL_KEY})$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    terms.append("".join(current).strip())
    return [t for t in terms if t]


_Predicate = Callable[[JSONDict], bool]


def _label_requirement(term: str) -> _Predicate:
    def labels(obj: JSONDict) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        found = meta.get("labels") or {}
        return found if isinstance(found, dict) else {}

    m = _SET_TERM.match(term)
    if m:
        key, op, raw = m.group(1), m.group(2), m.group(3)
        values = frozenset(v.strip() for v in raw.split(",") if v.strip())
        if op == "in":
            return lambda obj: key in labels(obj) and labels(obj)[key] in values
        return lambda obj: key not in labels(obj) or labels(obj)[key] not in values
    m = _EQ_TERM.match(term)
    if m:
        key, op, value = m.group(1), m.group(2), m.group(3)
        if op == "!=":
            return lambda obj: labels(obj).get(key) != value
        return lambda obj: key in labels(obj) and labels(obj)[key] == value
    m = _EXISTS_TERM.match(term)
    if m:
        negate, key = m.group(1) == "!", m.group(2)
        if negate:
            return lambda obj: key not in labels(obj)
        return lambda obj: key in labels(obj)
    raise _bad_request(f"unable to parse requirement: found '{term}', expected: selector term")


def _field_requirement(kind: _Kind, term: str) -> _Predicate:
    for op in ("!=", "==", "="):
        if op in term:
            name, value = term.split(op, 1)
            break
    else:
        raise _bad_request(f"invalid selector: '{term}'; can't understand '{term}'")
    name = name.strip()
    getter = kind.fields.get(name)
    if getter is None:
        raise _bad_request(f"field label not supported: {name}")
    if op == "!=":
        return lambda obj: getter(obj) != value
    return lambda obj: getter(obj) == value


@dataclass(frozen=True)
class _Selector:
    namespace: str | None
    requirements: tuple[_Predicate, ...]

    @classmethod
    def parse(cls, kind: _Kind, namespace: str | None, query: Mapping[str, str]) -> _Selector:
        reqs: list[_Predicate] = []
        for term in _split_terms(query.get("labelSelector", "")):
            reqs.append(_label_requirement(term))
        for term in _split_terms(query.get("fieldSelector", "")):
            reqs.append(_field_requirement(kind, term))
        return cls(namespace, tuple(reqs))

    def matches(self, obj: JSONDict) -> bool:
        if self.namespace is not None and _field_str(obj, "metadata", "namespace") != (
            self.namespace
        ):
            return False
        return all(req(obj) for req in self.requirements)


# ---------------------------------------------------------------------------------------
# Patches


class _PatchError(Exception):
    pass


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value, never mutates its inputs."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: JSONDict = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


# patchMergeKey of the list fields of Pod/Node that use patchStrategy=merge.
_SMP_MERGE_KEYS: Final[Mapping[str, str]] = {
    "conditions": "type",
    "addresses": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "resourceClaims": "name",
    "hostAliases": "ip",
}
_SMP_PRIMITIVE_SETS: Final = frozenset({"finalizers"})


def _smp_list(current: list[Any], items: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in items):
        return [
            copy.deepcopy(i)
            for i in items
            if not (isinstance(i, dict) and i.get("$patch") == "replace")
        ]
    result = copy.deepcopy(current)
    for item in items:
        if not isinstance(item, dict) or merge_key not in item:
            result.append(copy.deepcopy(item))
            continue
        index = next(
            (
                i
                for i, existing in enumerate(result)
                if isinstance(existing, dict) and existing.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is not None:
            result[index] = _strategic_merge(result[index], item)
        else:
            result.append(_strategic_merge({}, item))
    return result


def _strategic_merge(target: Any, patch: Any) -> Any:
    """A strategic merge patch for the Pod/Node fields that matter.

    Like a merge patch, except that the well-known ``patchStrategy: merge`` lists
    (conditions, containers, volumes, ownerReferences, finalizers ...) are merged by
    their merge key, and the ``$patch`` / ``$deleteFromPrimitiveList`` /
    ``$retainKeys`` / ``$setElementOrder`` directives are honoured or dropped.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result: JSONDict = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in {"$patch", "$retainKeys"} or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list) and isinstance(value, list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = _strategic_merge(result.get(key), value)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            if key in _SMP_MERGE_KEYS:
                result[key] = _smp_list(result[key], value, _SMP_MERGE_KEYS[key])
            elif key in _SMP_PRIMITIVE_SETS:
                merged = list(result[key])
                merged.extend(v for v in value if v not in merged)
                result[key] = merged
            else:
                result[key] = copy.deepcopy(value)
        else:
            result[key] = copy.deepcopy(value)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain or k in patch}
    return result


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise _PatchError("path is not a string")
    if path == "":
        return []
    if not path.startswith("/"):
        raise _PatchError(f'invalid JSON pointer: "{path}"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _list_index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if allow_end and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise _PatchError(f"invalid array index: {token}")
    index = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if index > limit:
        raise _PatchError(f"index out of bounds: {index}")
    return index


def _resolve_parent(doc: Any, tokens: list[str], op: str, path: Any) -> Any:
    cur = doc
    for token in tokens[:-1]:
        if isinstance(cur, dict) and token in cur:
            cur = cur[token]
        elif isinstance(cur, list):
            try:
                cur = cur[_list_index(cur, token, allow_end=False)]
            except _PatchError:
                raise _PatchError(
                    f'{op} operation does not apply: doc is missing path: "{path}": missing value'
                ) from None
        else:
            raise _PatchError(
                f'{op} operation does not apply: doc is missing path: "{path}": missing value'
            )
    return cur


def _pointer_get(doc: Any, path: Any, op: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _resolve_parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        try:
            return parent[_list_index(parent, last, allow_end=False)]
        except _PatchError:
            pass
    raise _PatchError(
        f'{op} operation does not apply: doc is missing path: "{path}": missing value'
    )


def _pointer_add(doc: Any, path: Any, value: Any, op: str = "add") -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _resolve_parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, last, allow_end=True), value)
    else:
        raise _PatchError(
            f'{op} operation does not apply: doc is missing path: "{path}": missing value'
        )
    return doc


def _pointer_remove(doc: Any, path: Any, op: str = "remove") -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise _PatchError(f"{op} operation does not apply: cannot remove the whole document")
    parent = _resolve_parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        try:
            return parent.pop(_list_index(parent, last, allow_end=False))
        except _PatchError:
            pass
    raise _PatchError(
        f'{op} operation does not apply: doc is missing path: "{path}": missing value'
    )


def _json_patch(doc: Any, operations: list[Any]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test) on a deep copy of ``doc``."""
    result = copy.deepcopy(doc)
    for operation in operations:
        if not isinstance(operation, dict):
            raise _PatchError("invalid operation: not an object")
        op = operation.get("op")
        path = operation.get("path")
        if op == "add":
            if "value" not in operation:
                raise _PatchError("add operation does not apply: missing value")
            result = _pointer_add(result, path, copy.deepcopy(operation["value"]))
        elif op == "remove":
            _pointer_remove(result, path)
        elif op == "replace":
            if "value" not in operation:
                raise _PatchError("replace operation does not apply: missing value")
            try:
                _pointer_get(result, path, "replace")
            except _PatchError:
                raise _PatchError(
                    f"replace operation does not apply: doc is missing key: {path}: missing value"
                ) from None
            tokens = _pointer(path)
            if not tokens:
                result = copy.deepcopy(operation["value"])
            else:
                parent = _resolve_parent(result, tokens, "replace", path)
                if isinstance(parent, list):
                    parent[_list_index(parent, tokens[-1], allow_end=False)] = copy.deepcopy(
                        operation["value"]
                    )
                else:
                    parent[tokens[-1]] = copy.deepcopy(operation["value"])
        elif op == "test":
            try:
                actual = _pointer_get(result, path, "test")
            except _PatchError:
                raise _PatchError(f"testing value {path} failed: test failed") from None
            if not _json_equal(actual, operation.get("value")):
                raise _PatchError(f"testing value {path} failed: test failed")
        elif op in {"move", "copy"}:
            source = operation.get("from")
            value = _pointer_get(result, source, op)
            if op == "move":
                if (
                    isinstance(source, str)
                    and isinstance(path, str)
                    and (path.startswith(source + "/"))
                ):
                    raise _PatchError("move operation does not apply: from is a prefix of path")
                _pointer_remove(result, source, op)
            result = _pointer_add(result, path, copy.deepcopy(value), op)
        else:
            raise _PatchError(f"Unexpected kind: {op}")
    return result


# ---------------------------------------------------------------------------------------
# Store records


@dataclass(frozen=True)
class _StoredEvent:
    """One write in the history; ``obj``/``prev`` are immutable snapshots."""

    rv: int
    type: str
    resource: str
    obj: JSONDict
    prev: JSONDict | None


class _Watcher:
    def __init__(self, kind: _Kind, selector: _Selector) -> None:
        self.kind = kind
        self.selector = selector
        self.pending: list[_StoredEvent] = []
        self.seen_rv = 0

    def convert(self, event: _StoredEvent) -> JSONDict | None:
        """The watch event this watcher sees for a stored event (cacher semantics)."""
        cur_passes = event.type != "DELETED" and self.selector.matches(event.obj)
        old_passes = event.prev is not None and self.selector.matches(event.prev)
        if cur_passes and not old_passes:
            return {"type": "ADDED", "object": self.kind.typed(event.obj)}
        if cur_passes and old_passes:
            return {"type": "MODIFIED", "object": self.kind.typed(event.obj)}
        if old_passes and event.prev is not None:
            # A DELETED event carries the previous content with the event's RV.
            gone = copy.deepcopy(event.prev)
            gone.setdefault("metadata", {})["resourceVersion"] = str(event.rv)
            return {"type": "DELETED", "object": self.kind.typed(gone)}
        return None

    def bookmark(self, annotations: Mapping[str, str] | None = None) -> JSONDict:
        meta: JSONDict = {"resourceVersion": str(self.seen_rv)}
        if annotations:
            meta["annotations"] = dict(annotations)
        return {
            "type": "BOOKMARK",
            "object": {"kind": self.kind.kind, "apiVersion": "v1", "metadata": meta},
        }


@dataclass
class _Response:
    code: int
    body: JSONDict
    headers: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Fault injection

_ACTIONS: Final = frozenset(
    {"status", "delay", "after_write_status", "after_write_delay", "drop_watch", "close"}
)


@dataclass
class FaultRule:
    """One registered fault.  ``remaining`` is ``None`` for an unlimited rule."""

    method: str
    path_regex: re.Pattern[str]
    action: str
    arg: float | None
    remaining: int | None
    hits: int = 0

    def applies(self, method: str, path: str, is_watch: bool) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        if self.method not in {"*", method}:
            return False
        if self.action == "drop_watch" and not is_watch:
            return False
        if self.action in {"after_write_status", "after_write_delay"} and is_watch:
            return False
        return self.path_regex.search(path) is not None


class FaultInjector:
    """Registry of fault rules consulted for every HTTP request (first match wins).

    Actions:

    * ``("status", code)`` answer ``code`` with a Status body; the store is untouched.
    * ``("delay", seconds)`` sleep, then handle normally.
    * ``("after_write_status", code)`` handle normally (the write happens), then answer
      ``code`` instead of the real response.
    * ``("after_write_delay", seconds)`` handle normally (the write happens), then sleep
      before answering: a client timeout after the write.
    * ``("drop_watch", None)`` close a watch stream abruptly after its first event.
    * ``("close", None)`` close the connection without answering.

    ``path_regex`` is searched in the request path (query string excluded); ``method``
    may be ``"*"``.  ``times=None`` keeps the rule forever.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def add(
        self,
        method: str,
        path_regex: str,
        action: tuple[str, float | None],
        times: int | None = 1,
    ) -> FaultRule:
        name, arg = action
        if name not in _ACTIONS:
            raise ValueError(f"unknown fault action {name!r}; expected one of {sorted(_ACTIONS)}")
        if name in {"status", "after_write_status", "after_write_delay", "delay"} and arg is None:
            raise ValueError(f"fault action {name!r} needs an argument")
        rule = FaultRule(method.upper(), re.compile(path_regex), name, arg, times)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def take(self, method: str, path: str, is_watch: bool) -> FaultRule | None:
        """Consume and return the first rule matching this request, if any."""
        with self._lock:
            for rule in self._rules:
                if rule.applies(method, path, is_watch):
                    rule.hits += 1
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    return rule
        return None


# ---------------------------------------------------------------------------------------
# Routing


@dataclass(frozen=True)
class _Route:
    target: str  # "collection", "item", "status", "binding", "version", "health"
    kind: _Kind | None
    namespace: str | None
    name: str | None
    methods: frozenset[str]
    api_version: str = "v1"


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
    (re.compile(r"^/version/?$"), "version", None, frozenset({"GET"}), "v1"),
    (re.compile(r"^/(healthz|readyz|livez)$"), "health", None, frozenset({"GET"}), "v1"),
)


def _match_route(path: str) -> _Route | None:
    for pattern, target, resource, methods, api_version in _ROUTES:
        m = pattern.match(path)
        if not m:
            continue
        groups = m.groups()
        kind = _KINDS[resource] if resource else None
        namespace: str | None = None
        name: str | None = None
        if kind is not None and path.startswith(("/api/v1/namespaces/", "/apis/")):
            namespace = groups[0]
            name = groups[1] if len(groups) > 1 else None
        elif kind is not None and groups:
            name = groups[0]
        return _Route(target, kind, namespace, name, methods, api_version)
    return None


def _decode_json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8") if body else "null")
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad_request(f"json parse error: {exc}") from None


def _decode_object(body: bytes) -> JSONDict:
    obj = _decode_json(body)
    if not isinstance(obj, dict):
        raise _bad_request("the body of the request must be a JSON object")
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise _bad_request("metadata must be a JSON object")
    return obj


def _random_suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


# Pod spec fields that a (non-status) update may change on the real server.
_POD_MUTABLE_SPEC: Final = (
    "activeDeadlineSeconds",
    "tolerations",
    "terminationGracePeriodSeconds",
    "schedulingGates",
)


def _pod_spec_fingerprint(spec: Any) -> str:
    if not isinstance(spec, dict):
        return _canonical(spec)
    trimmed = {k: v for k, v in spec.items() if k not in _POD_MUTABLE_SPEC}
    for group in ("containers", "initContainers"):
        if isinstance(trimmed.get(group), list):
            trimmed[group] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                for c in trimmed[group]
            ]
    return _canonical(trimmed)


# ---------------------------------------------------------------------------------------
# The double


class ApiServerDouble:
    """A stateful fake kube-apiserver (core/v1 nodes, pods, bindings, events)."""

    def __init__(
        self,
        *,
        history_limit: int = _DEFAULT_HISTORY,
        bookmark_interval: float = 1.0,
        rbac: Iterable[RbacGrant] | None = None,
    ) -> None:
        # None: every request is allowed (the default). Otherwise only what a grant allows;
        # the rest is answered 403 Forbidden and recorded in ``denied``.
        self.rbac: list[RbacGrant] | None = None if rbac is None else list(rbac)
        self.rbac_user = "system:serviceaccount:gas-system:gas"
        self._denied: list[RbacRequest] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._store: dict[str, dict[tuple[str, str], JSONDict]] = {k: {} for k in _KINDS}
        self._rv = 1
        self._floor = 1  # every event with rv > floor is retained
        self._history: deque[_StoredEvent] = deque()
        self._history_limit = history_limit
        self._watchers: set[_Watcher] = set()
        self._event_log: list[JSONDict] = []
        self._stopping = False
        self.bookmark_interval = bookmark_interval
        self.faults = FaultInjector()
        # Holder identities whose Lease writes fail with 500: one replica cut off from the
        # lease while the others still reach it (a path fault would hit them all).
        self.lease_cut_off: set[str] = set()
        self.kubeconfig_path: str | None = None
        self._requests_lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []
        self._targets: list[tuple[str, str]] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> ApiServerDouble:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.double = self
        self._server = server
        self._stopping = False
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"apiserver-double-{server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server = self._server
        if server is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        server.shutdown()
        server.server_close()
        server.close_all_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> ApiServerDouble:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("ApiServerDouble is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> str:
        """Write a kubeconfig for this server (dummy bearer token) and return its path."""
        text = (
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            "- name: apiserver-double\n"
            "  cluster:\n"
            f"    server: {self.url}\n"
            "users:\n"
            "- name: apiserver-double-user\n"
            "  user:\n"
            "    token: dummy-token\n"
            "contexts:\n"
            "- name: apiserver-double\n"
            "  context:\n"
            "    cluster: apiserver-double\n"
            "    user: apiserver-double-user\n"
            "    namespace: default\n"
            "current-context: apiserver-double\n"
            "preferences: {}\n"
        )
        target = os.fspath(path)
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)
        return target

    # -- observation -----------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    @property
    def requests(self) -> list[tuple[str, str]]:
        """``(method, path)`` of every HTTP request received (query string excluded)."""
        with self._requests_lock:
            return list(self._requests)

    @property
    def request_targets(self) -> list[tuple[str, str]]:
        """``(method, path?query)`` of every HTTP request received."""
        with self._requests_lock:
            return list(self._targets)

    def count_requests(self, method: str, path_regex: str) -> int:
        pattern = re.compile(path_regex)
        return sum(1 for m, p in self.requests if m == method and pattern.search(p))

    def clear_requests(self) -> None:
        with self._requests_lock:
            self._requests.clear()
            self._targets.clear()

    @property
    def events(self) -> list[JSONDict]:
        """Every Event object POSTed (core/v1 or events.k8s.io/v1), oldest first."""
        with self._lock:
            return copy.deepcopy(self._event_log)

    @property
    def open_watch_count(self) -> int:
        with self._lock:
            return len(self._watchers)

    # -- in-process helpers (same store, same RV/event rules) --------------------------

    def add_node(self, obj: Mapping[str, Any]) -> JSONDict:
        with self._lock:
            return copy.deepcopy(self._create_locked(_NODES, "", dict(obj), from_http=False))

    def put_node(self, obj: Mapping[str, Any]) -> JSONDict:
        """Create the node or replace it wholesale (spec and status); no-op if equal."""
        new = copy.deepcopy(dict(obj))
        name = _field_str(new, "metadata", "name")
        with self._lock:
            old = self._store["nodes"].get(("", name))
            if old is None:
                return copy.deepcopy(self._create_locked(_NODES, "", new, from_http=False))
            new.pop("kind", None)
            new.pop("apiVersion", None)
            meta = new.setdefault("metadata", {})
            meta.setdefault("uid", old["metadata"].get("uid"))
            meta.setdefault("creationTimestamp", old["metadata"].get("creationTimestamp"))
            return copy.deepcopy(self._modify_locked(_NODES, ("", name), new))

    def delete_node(self, name: str) -> JSONDict:
        with self._lock:
            return copy.deepcopy(self._delete_locked(_NODES, "", name, None))

    def get_node(self, name: str) -> JSONDict | None:
        with self._lock:
            found = self._store["nodes"].get(("", name))
            return copy.deepcopy(found) if found is not None else None

    def list_nodes(self) -> list[JSONDict]:
        with self._lock:
            return [copy.deepcopy(v) for _, v in sorted(self._store["nodes"].items())]

    def add_pod(self, obj: Mapping[str, Any]) -> JSONDict:
        """Create a pod (namespace defaults to ``default``); returns the stored copy."""
        with self._lock:
            obj_dict = dict(obj)
            ns = _field_str(obj_dict, "metadata", "namespace") or "default"
            return copy.deepcopy(self._create_locked(_PODS, ns, obj_dict, from_http=False))

    def get_lease(self, namespace: str, name: str) -> JSONDict | None:
        """A coordination.k8s.io/v1 Lease as stored, or None."""
        with self._lock:
            found = self._store[_LEASES.resource].get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def get_pod(self, namespace: str, name: str) -> JSONDict | None:
        with self._lock:
            found = self._store["pods"].get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def list_pods(self) -> list[JSONDict]:
        with self._lock:
            return [copy.deepcopy(v) for _, v in sorted(self._store["pods"].items())]

    def patch_pod(self, namespace: str, name: str, merge_patch: Mapping[str, Any]) -> JSONDict:
        """Apply an RFC 7386 merge patch to the whole pod (spec, status and metadata)."""
        with self._lock:
            old = self._get_locked(_PODS, namespace, name)
            new = _merge_patch(old, dict(merge_patch))
            meta = new.setdefault("metadata", {})
            meta["name"], meta["namespace"] = name, namespace
            return copy.deepcopy(self._modify_locked(_PODS, (namespace, name), new))

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> JSONDict:
        return self.patch_pod(namespace, name, {"status": {"phase": phase}})

    def mark_pod_terminating(
        self, namespace: str, name: str, grace_period_seconds: int = 30
    ) -> JSONDict:
        """Set ``metadata.deletionTimestamp`` as a graceful delete would (one write)."""
        return self.patch_pod(
            namespace,
            name,
            {
                "metadata": {
                    "deletionTimestamp": _now(),
                    "deletionGracePeriodSeconds": grace_period_seconds,
                }
            },
        )

    def delete_pod(self, namespace: str, name: str) -> JSONDict:
        with self._lock:
            return copy.deepcopy(self._delete_locked(_PODS, namespace, name, None))

    def compact(self) -> int:
        """Forget every retained event: watching from any older RV now yields 410."""
        with self._lock:
            self._history.clear()
            self._floor = self._rv
            return self._floor

    # -- store internals (caller holds self._lock) -------------------------------------

    def _get_locked(self, kind: _Kind, namespace: str, name: str) -> JSONDict:
        found = self._store[kind.resource].get((namespace if kind.namespaced else "", name))
        if found is None:
            raise _not_found(kind.resource, name)
        return found

    def _write_locked(
        self, kind: _Kind, key: tuple[str, str], new: JSONDict, event_type: str
    ) -> JSONDict:
        """The single write primitive: bump RV, store, record history, wake watchers."""
        self._rv += 1
        store = self._store[kind.resource]
        prev = store.get(key)
        new.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        if event_type == "DELETED":
            store.pop(key, None)
        else:
            store[key] = new
        event = _StoredEvent(self._rv, event_type, kind.resource, new, prev)
        if len(self._history) >= self._history_limit:
            self._floor = self._history.popleft().rv
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.kind is kind:
                watcher.pending.append(event)
        self._cond.notify_all()
        return new

    def _create_locked(
        self, kind: _Kind, namespace: str, obj: JSONDict, *, from_http: bool
    ) -> JSONDict:
        new = copy.deepcopy(obj)
        if kind is not _EVENTS:
            new.pop("kind", None)
            new.pop("apiVersion", None)
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _bad_request("metadata must be a JSON object")
        if kind.namespaced:
            given = meta.get("namespace") or ""
            if from_http and given and given != namespace:
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            namespace = namespace or given or "default"
            meta["namespace"] = namespace
        else:
            namespace = ""
            meta.pop("namespace", None)
        name = meta.get("name") or ""
        store = self._store[kind.resource]
        if not name:
            prefix = meta.get("generateName") or ""
            if not prefix:
                raise _invalid(
                    kind.kind,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            name = prefix + _random_suffix()
            while (namespace, name) in store:
                name = prefix + _random_suffix()
            meta["name"] = name
        if from_http and meta.get("resourceVersion"):
            # etcd3 store.Create returns a plain error for this: 500 with no reason.
            raise ApiError(500, "", "resourceVersion should not be set on objects to be created")
        meta.pop("resourceVersion", None)
        if (namespace, name) in store:
            raise _already_exists(kind.resource, name)
        if from_http:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta.pop("deletionTimestamp", None)
            meta.pop("deletionGracePeriodSeconds", None)
        else:
            meta["uid"] = meta.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = meta.get("creationTimestamp") or _now()
        if kind is _PODS:
            if from_http:
                new["status"] = {"phase": "Pending"}
            else:
                status = new.get("status")
                if not isinstance(status, dict):
                    status = new["status"] = {}
                status.setdefault("phase", "Pending")
        new = _stored_form(kind.resource, new)
        stored = self._write_locked(kind, (namespace, name), new, "ADDED")
        if kind is _EVENTS:
            self._event_log.append(stored)
        return stored

    def _modify_locked(self, kind: _Kind, key: tuple[str, str], new: JSONDict) -> JSONDict:
        """Store ``new`` as the next state of ``key`` unless it equals the current one."""
        old = self._store[kind.resource][key]
        new = _stored_form(kind.resource, new)
        new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
        if _canonical(new) == _canonical(old):
            return old
        return self._write_locked(kind, key, new, "MODIFIED")

    def _update_locked(
        self, kind: _Kind, namespace: str, name: str, body: Any, subresource: str
    ) -> JSONDict:
        """PUT semantics (also the tail of PATCH): real-server update strategy rules."""
        old = self._get_locked(kind, namespace, name)
        if not isinstance(body, dict):
            raise _bad_request("the body of the request must be a JSON object")
        new = copy.deepcopy(body)
        new.pop("kind", None)
        new.pop("apiVersion", None)
        meta = new.get("metadata")
        if meta is None:
            meta = new["metadata"] = {}
        if not isinstance(meta, dict):
            raise _bad_request("metadata must be a JSON object")
        if meta.get("name", "") != name:
            raise _bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on "
                f"the URL ({name})"
            )
        if kind.namespaced:
            given = meta.get("namespace") or ""
            if given and given != namespace:
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        old_meta = old["metadata"]
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and str(wanted_rv) != old_meta["resourceVersion"]:
            raise _modified_conflict(kind.resource, name)
        uid = meta.get("uid") or old_meta.get("uid")
        if uid != old_meta.get("uid"):
            raise _invalid(
                kind.kind,
                name,
                "metadata.uid",
                "FieldValueInvalid",
                f'Invalid value: "{uid}": field is immutable',
            )
        meta["uid"] = uid
        for system_field in (
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if system_field in old_meta:
                meta[system_field] = old_meta[system_field]
            else:
                meta.pop(system_field, None)
        if subresource == "status":
            carried = ["spec"]
            if kind is _PODS and "ownerReferences" in old_meta:
                meta["ownerReferences"] = old_meta["ownerReferences"]
            elif kind is _PODS:
                meta.pop("ownerReferences", None)
        else:
            carried = ["status"]
        for part in carried:
            if part in old:
                new[part] = old[part]
            else:
                new.pop(part, None)
        if (
            kind is _PODS
            and subresource == ""
            and _pod_spec_fingerprint(new.get("spec")) != _pod_spec_fingerprint(old.get("spec"))
        ):
            raise _invalid(
                "Pod",
                name,
                "spec",
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than "
                "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
                "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if "
                "it was previously negative)",
            )
        return self._modify_locked(kind, (namespace if kind.namespaced else "", name), new)

    def _patch_locked(
        self,
        kind: _Kind,
        namespace: str,
        name: str,
        subresource: str,
        content_type: str,
        patch: Any,
    ) -> JSONDict:
        old = self._get_locked(kind, namespace, name)
        current = kind.typed(old)
        if content_type == _JSON_PATCH:
            if not isinstance(patch, list):
                raise _bad_request(
                    "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
                )
            try:
                patched = _json_patch(current, patch)
            except _PatchError as exc:
                raise _unprocessable(str(exc)) from None
        else:
            if not isinstance(patch, dict):
                raise _bad_request("the body of a merge patch must be a JSON object")
            merge = _merge_patch if content_type == _MERGE_PATCH else _strategic_merge
            patched = merge(current, patch)
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise _unprocessable("the patched object is not a valid object")
        return self._update_locked(kind, namespace, name, patched, subresource)

    def _delete_locked(
        self, kind: _Kind, namespace: str, name: str, options: JSONDict | None
    ) -> JSONDict:
        old = self._get_locked(kind, namespace, name)
        key = (namespace if kind.namespaced else "", name)
        preconditions = (options or {}).get("preconditions") or {}
        if isinstance(preconditions, dict):
            self._check_preconditions(
                kind, key, old, preconditions.get("uid"), preconditions.get("resourceVersion")
            )
        self._write_locked(kind, key, copy.deepcopy(old), "DELETED")
        return old

    @staticmethod
    def _check_preconditions(
        kind: _Kind, key: tuple[str, str], obj: JSONDict, uid: Any, resource_version: Any
    ) -> None:
        meta = obj["metadata"]
        storage_key = kind.storage_key(*key)
        if uid and uid != meta.get("uid"):
            raise _precondition_conflict(
                kind.resource,
                key[1],
                storage_key,
                f"UID in precondition: {uid}, UID in object meta: {meta.get('uid', '')}",
            )
        if resource_version and str(resource_version) != meta.get("resourceVersion"):
            raise _precondition_conflict(
                kind.resource,
                key[1],
                storage_key,
                f"ResourceVersion in precondition: {resource_version}, ResourceVersion in "
                f"object meta: {meta.get('resourceVersion')}",
            )

    def _bind(self, namespace: str, name: str, body: Any) -> _Response:
        """POST pods/{name}/binding, following BindingREST.Create in the real server."""
        if not isinstance(body, dict):
            raise _bad_request("the body of the request must be a JSON object")
        if body.get("kind") not in (None, "", "Binding"):
            raise _bad_request(f"not a Binding object: kind {body.get('kind')!r}")
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise _bad_request("metadata must be a JSON object")
        if (meta.get("namespace") or namespace) != namespace:
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        if (meta.get("name") or "") != name:
            raise _bad_request("name in URL does not match name in Binding object")
        target = body.get("target") or {}
        if not isinstance(target, dict):
            raise _bad_request("target must be a JSON object")
        problems: list[str] = []
        target_kind = target.get("kind") or ""
        if target_kind and target_kind != "Node":
            problems.append(
                f'target.kind: Unsupported value: "{target_kind}": supported values: '
                '"Node", "<empty>"'
            )
        node_name = target.get("name") or ""
        if not node_name:
            problems.append("target.name: Required value")
        if problems:
            # ValidatePodBinding's aggregate is not a StatusError: the real server answers
            # 500 with no reason.
            message = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
            raise ApiError(500, "", message)
        annotations = meta.get("annotations") or {}
        with self._lock:
            pod = self._get_locked(_PODS, namespace, name)
            self._check_preconditions(
                _PODS, (namespace, name), pod, meta.get("uid"), meta.get("resourceVersion")
            )
            pod_meta = pod["metadata"]
            spec = pod.get("spec") or {}
            if pod_meta.get("deletionTimestamp"):
                raise _conflict(
                    "pods/binding",
                    name,
                    f"pod {name} is being deleted, cannot be assigned to a host",
                )
            if spec.get("nodeName"):
                raise _conflict(
                    "pods/binding",
                    name,
                    f'pod {name} is already assigned to node "{spec["nodeName"]}"',
                )
            if spec.get("schedulingGates"):
                raise _conflict(
                    "pods/binding", name, f"pod {name} has non-empty .spec.schedulingGates"
                )
            new = copy.deepcopy(pod)
            new_meta = new["metadata"]
            merged = dict(new_meta.get("annotations") or {})
            merged.update(annotations)
            new_meta["annotations"] = merged
            new.setdefault("spec", {})["nodeName"] = node_name
            status = new.get("status")
            if not isinstance(status, dict):
                status = new["status"] = {}
            conditions = list(status.get("conditions") or [])
            condition: JSONDict = {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": _now(),
            }
            for index, existing in enumerate(conditions):
                if isinstance(existing, dict) and existing.get("type") == "PodScheduled":
                    if existing.get("status") == "True" and existing.get("lastTransitionTime"):
                        condition["lastTransitionTime"] = existing["lastTransitionTime"]
                    conditions[index] = condition
                    break
            else:
                conditions.append(condition)
            status["conditions"] = conditions
            self._write_locked(_PODS, (namespace, name), _stored_form("pods", new), "MODIFIED")
        return _Response(
            201,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
        )

    def _list(self, kind: _Kind, namespace: str | None, query: Mapping[str, str]) -> JSONDict:
        selector = _Selector.parse(kind, namespace, query)
        with self._lock:
            items = [
                obj
                for _, obj in sorted(self._store[kind.resource].items())
                if selector.matches(obj)
            ]
            rv = self._rv
        return {
            "kind": kind.list_kind,
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    # -- watch internals ---------------------------------------------------------------

    def _open_watch(
        self,
        kind: _Kind,
        selector: _Selector,
        resource_version: str,
        send_initial: bool,
    ) -> tuple[_Watcher | None, list[JSONDict], JSONDict | None]:
        """Register a watcher; returns (watcher, first events, terminal ERROR event)."""
        watcher = _Watcher(kind, selector)
        with self._lock:
            current = self._rv
            first: list[JSONDict] = []
            if resource_version in {"", "0"} or send_initial:
                for _, obj in sorted(self._store[kind.resource].items()):
                    if selector.matches(obj):
                        first.append({"type": "ADDED", "object": kind.typed(obj)})
            else:
                wanted = int(resource_version)
                if wanted < self._floor:
                    return (
                        None,
                        [],
                        _error_event(
                            410, "Expired", f"too old resource version: {wanted} ({self._floor})"
                        ),
                    )
                if wanted > current:
                    return (
                        None,
                        [],
                        _error_event(
                            504,
                            "Timeout",
                            f"Too large resource version: {wanted}, current: {current}",
                            {
                                "causes": [
                                    {
                                        "reason": "ResourceVersionTooLarge",
                                        "message": "Too large resource version",
                                    }
                                ],
                                "retryAfterSeconds": 1,
                            },
                        ),
                    )
                for event in self._history:
                    if event.rv > wanted and event.resource == kind.resource:
                        converted = watcher.convert(event)
                        if converted is not None:
                            first.append(converted)
            watcher.seen_rv = current
            self._watchers.add(watcher)
        return watcher, first, None

    def _next_events(self, watcher: _Watcher, wait: float) -> tuple[list[_StoredEvent], bool]:
        """Pending events for ``watcher`` (waiting up to ``wait`` s); and the stop flag."""
        with self._cond:
            if not watcher.pending and not self._stopping and wait > 0:
                self._cond.wait(wait)
            events, watcher.pending = watcher.pending, []
            watcher.seen_rv = self._rv
            return events, self._stopping

    def _close_watch(self, watcher: _Watcher | None) -> None:
        if watcher is None:
            return
        with self._lock:
            self._watchers.discard(watcher)

    @property
    def denied(self) -> list[RbacRequest]:
        """Every request refused with 403 by the RBAC check, oldest first."""
        with self._requests_lock:
            return list(self._denied)

    def _authorize(
        self, route: _Route, method: str, query: Mapping[str, str], is_watch: bool
    ) -> ApiError | None:
        grants = self.rbac
        if grants is None or route.kind is None:
            # /version and the health endpoints: granted to every authenticated user by
            # the default system:public-info-viewer and system:discovery roles.
            return None
        attributes = rbac_request(route, method, query, is_watch)
        if any(grant.allows(attributes) for grant in grants):
            return None
        with self._requests_lock:
            self._denied.append(attributes)
        return attributes.forbidden(self.rbac_user)

    def _log_request(self, method: str, path: str, target: str) -> None:
        with self._requests_lock:
            self._requests.append((method, path))
            self._targets.append((method, target))

    # -- HTTP dispatch (non-streaming) -------------------------------------------------

    def _dispatch(
        self,
        route: _Route,
        method: str,
        query: Mapping[str, str],
        body: bytes,
        content_type: str,
    ) -> _Response:
        if route.target == "version":
            return _Response(
                200,
                {
                    "major": "1",
                    "minor": "31",
                    "gitVersion": "v1.31.0-apiserver-double",
                    "platform": "linux/amd64",
                },
            )
        if route.target == "health":
            return _Response(200, {"status": "ok"})
        kind = route.kind
        assert kind is not None
        namespace = route.namespace or ""
        if kind is _LEASES and method in ("POST", "PUT") and self.lease_cut_off:
            spec = _decode_object(body).get("spec")
            if isinstance(spec, dict) and spec.get("holderIdentity") in self.lease_cut_off:
                raise _fault_error(500)
        if route.target == "collection":
            if method == "GET":
                return _Response(200, self._list(kind, route.namespace, query))
            obj = _decode_object(body)
            if kind is _EVENTS:
                obj.setdefault("kind", "Event")
                obj.setdefault("apiVersion", route.api_version)
            with self._lock:
                created = self._create_locked(kind, namespace, obj, from_http=True)
            return _Response(201, kind.typed(created))
        name = route.name or ""
        if route.target == "binding":
            return self._bind(namespace, name, _decode_json(body))
        subresource = "status" if route.target == "status" else ""
        if method == "GET":
            with self._lock:
                return _Response(200, kind.typed(self._get_locked(kind, namespace, name)))
        if method == "PUT":
            obj = _decode_object(body)
            with self._lock:
                return _Response(
                    200, kind.typed(self._update_locked(kind, namespace, name, obj, subresource))
                )
        if method == "PATCH":
            media = content_type.split(";", 1)[0].strip().lower()
            if media not in _PATCH_TYPES:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types "
                    "include: application/json-patch+json, application/merge-patch+json, "
                    "application/apply-patch+yaml",
                    {},
                )
            patch = _decode_json(body)
            with self._lock:
                patched = self._patch_locked(kind, namespace, name, subresource, media, patch)
            return _Response(200, kind.typed(patched))
        # DELETE
        options = _decode_json(body) if body.strip() else None
        with self._lock:
            deleted = self._delete_locked(
                kind, namespace, name, options if isinstance(options, dict) else None
            )
        return _Response(200, kind.typed(deleted))


def _error_event(code: int, reason: str, message: str, details: JSONDict | None = None) -> JSONDict:
    return {"type": "ERROR", "object": ApiError(code, reason, message, details).status()}


# ---------------------------------------------------------------------------------------
# HTTP plumbing


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.double: ApiServerDouble | None = None
        self._conn_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn(), which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name = "127.0.0.1"
        self.server_port = int(self.server_address[1])

    def track(self, conn: socket.socket) -> None:
        with self._conn_lock:
            self._connections.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._conn_lock:
            self._connections.discard(conn)

    def close_all_connections(self) -> None:
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Dropped/reset connections are expected in tests; keep stderr quiet.
        return


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "apiserver-double/1.0"
    sys_version = ""

    @property
    def _srv(self) -> _Server:
        return cast(_Server, self.server)

    @property
    def _double(self) -> ApiServerDouble:
        double = self._srv.double
        assert double is not None
        return double

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self._srv.track(self.connection)

    def finish(self) -> None:
        self._srv.untrack(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_OPTIONS(self) -> None:
        self._handle()

    # -- request handling --------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _handle(self) -> None:
        double = self._double
        method = self.command
        split = urlsplit(self.path)
        path = split.path
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        double._log_request(method, path, self.path)
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            self._send(_bad_request("malformed request body"))
            return
        route = _match_route(path)
        is_watch = (
            route is not None
            and route.target == "collection"
            and method == "GET"
            and _parse_bool(query.get("watch"))
        )
        denial = double._authorize(route, method, query, is_watch) if route is not None else None
        if denial is not None:
            self._send(denial)
            return
        rule = double.faults.take(method, path, is_watch)
        action = rule.action if rule is not None else ""
        if rule is not None and action == "close":
            self._abort()
            return
        if rule is not None and action == "status":
            self._send(_fault_error(int(rule.arg or 500)))
            return
        if rule is not None and action == "delay":
            time.sleep(float(rule.arg or 0))
        response: _Response | ApiError
        try:
            if route is None:
                raise _route_not_found()
            if method not in route.methods:
                raise _method_not_allowed()
            if is_watch:
                self._serve_watch(route, query, drop_after_first=action == "drop_watch")
                return
            response = double._dispatch(
                route, method, query, body, self.headers.get("Content-Type") or ""
            )
        except ApiError as exc:
            response = exc
        except Exception as exc:  # a bug in the double: surface it to the client
            response = ApiError(500, "InternalError", f"Internal error occurred: {exc!r}", {})
        if rule is not None and action == "after_write_status":
            response = _fault_error(int(rule.arg or 500))
        if rule is not None and action == "after_write_delay":
            time.sleep(float(rule.arg or 0))
        self._send(response)

    def _send(self, response: _Response | ApiError) -> None:
        if isinstance(response, ApiError):
            code, body, headers = response.code, response.status(), response.headers
        else:
            code, body, headers = response.code, response.body, response.headers
        payload = (json.dumps(body, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-cache, private")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True

    def _abort(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # -- watch streaming ---------------------------------------------------------------

    def _write_chunk(self, data: bytes) -> bool:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n")
            return True
        except OSError:
            return False

    def _emit(self, event: JSONDict) -> bool:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        return self._write_chunk(line.encode("utf-8"))

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):
            return True

    def _serve_watch(
        self, route: _Route, query: Mapping[str, str], *, drop_after_first: bool
    ) -> None:
        double = self._double
        kind = route.kind
        assert kind is not None
        selector = _Selector.parse(kind, route.namespace, query)
        raw_timeout = query.get("timeoutSeconds", "")
        try:
            timeout = float(int(raw_timeout)) if raw_timeout else None
        except ValueError:
            raise _bad_request(f"invalid timeoutSeconds: {raw_timeout!r}") from None
        resource_version = query.get("resourceVersion", "")
        if resource_version and not resource_version.isdigit():
            raise _bad_request(f"invalid resource version: {resource_version}")
        bookmarks = _parse_bool(query.get("allowWatchBookmarks"))
        send_initial = _parse_bool(query.get("sendInitialEvents"))
        watcher, first, error = double._open_watch(kind, selector, resource_version, send_initial)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-cache, private")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(
                double, watcher, first, error, timeout, bookmarks, send_initial, drop_after_first
            )
        except Exception:
            # Headers are out: the only honest way to report a failure is to cut the stream.
            self._abort()
        finally:
            double._close_watch(watcher)

    def _stream(
        self,
        double: ApiServerDouble,
        watcher: _Watcher | None,
        first: list[JSONDict],
        error: JSONDict | None,
        timeout: float | None,
        bookmarks: bool,
        send_initial: bool,
        drop_after_first: bool,
    ) -> None:
        if error is not None or watcher is None:
            if error is not None:
                self._emit(error)
            self._write_chunk(b"")
            return
        deadline = time.monotonic() + timeout if timeout is not None else None

        def send_all(events: Iterable[JSONDict]) -> bool:
            for event in events:
                if not self._emit(event):
                    return False
                if drop_after_first:
                    self._abort()
                    return False
            return True

        if not send_all(first):
            self.close_connection = True
            return
        if send_initial and bookmarks:
            end = watcher.bookmark({"k8s.io/initial-events-end": "true"})
            if not self._emit(end):
                self.close_connection = True
                return
        last_write = time.monotonic()
        while True:
            now = time.monotonic()
            wait = _POLL_SECONDS
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            if bookmarks:
                wait = min(wait, max(0.0, last_write + double.bookmark_interval - now))
            stored, stopping = double._next_events(watcher, wait)
            if stopping:
                self.close_connection = True
                return
            converted = [e for e in (watcher.convert(s) for s in stored) if e is not None]
            if converted:
                if not send_all(converted):
                    self.close_connection = True
                    return
                last_write = time.monotonic()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if bookmarks and not self._emit(watcher.bookmark()):
                    self.close_connection = True
                    return
                # Deregister before the final chunk: once a client sees the end of the
                # stream, the watcher is gone (open_watch_count is then exact).
                double._close_watch(watcher)
                self._write_chunk(b"")
                return
            if bookmarks and now - last_write >= double.bookmark_interval:
                if not self._emit(watcher.bookmark()):
                    self.close_connection = True
                    return
                last_write = now
            if not converted and self._client_gone():
                self.close_connection = True
                return


# ---------------------------------------------------------------------------------------
# RBAC: an optional authorizer, as kube-apiserver's RBAC authorizer decides for one user.


@dataclass(frozen=True)
class RbacRequest:
    """The attributes the real authorizer sees for one resource request."""

    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str

    @property
    def resource_path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def forbidden(self, user: str) -> ApiError:
        # The real message and details (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters).
        qualified = f"{self.resource}.{self.api_group}" if self.api_group else self.resource
        subject = f'{qualified} "{self.name}"' if self.name else qualified
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        message = (
            f'{subject} is forbidden: User "{user}" cannot {self.verb} resource '
            f'"{self.resource_path}" in API group "{self.api_group}" {scope}'
        )
        details: JSONDict = {"kind": self.resource}
        if self.name:
            details = {"name": self.name, **details}
        if self.api_group:
            details["group"] = self.api_group
        return ApiError(403, "Forbidden", message, details)


@dataclass(frozen=True)
class RbacGrant:
    """One PolicyRule, valid cluster-wide (ClusterRoleBinding) or in one namespace."""

    verbs: frozenset[str]
    api_groups: frozenset[str]
    resources: frozenset[str]
    resource_names: frozenset[str] = frozenset()
    namespace: str | None = None

    def allows(self, request: RbacRequest) -> bool:
        if self.namespace is not None and request.namespace != self.namespace:
            return False
        if not ({"*", request.verb} & self.verbs):
            return False
        if not ({"*", request.api_group} & self.api_groups):
            return False
        wanted = {request.resource_path, "*"}
        if request.subresource:
            wanted.add(f"*/{request.subresource}")
        else:
            wanted.add(request.resource)
        if not (wanted & self.resources):
            return False
        return not self.resource_names or request.name in self.resource_names


def rbac_request(
    route: _Route, method: str, query: Mapping[str, str], is_watch: bool
) -> RbacRequest:
    """Map one HTTP request to RBAC attributes (verb, group, resource, ...)."""
    assert route.kind is not None
    group = route.api_version.rpartition("/")[0]
    subresource = route.target if route.target in ("status", "binding") else ""
    if route.target == "collection":
        verb = {"GET": "watch" if is_watch else "list", "POST": "create"}.get(
            method, "deletecollection" if method == "DELETE" else method.lower()
        )
    else:
        verb = {
            "GET": "get",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }.get(method, method.lower())
    return RbacRequest(
        verb=verb,
        api_group=group,
        resource=route.kind.resource,
        subresource=subresource,
        namespace=route.namespace or "",
        name=route.name or "",
    )


def rbac_grants_from_manifests(
    documents: Iterable[Any], service_account: tuple[str, str]
) -> list[RbacGrant]:
    """The rules that (Cluster)RoleBindings give the ServiceAccount ``(namespace, name)``.

    A ClusterRoleBinding grants its ClusterRole everywhere; a RoleBinding grants its Role
    or ClusterRole in the binding's namespace only. Unknown role names grant nothing.
    """
    docs = [d for d in documents if isinstance(d, dict)]
    roles: dict[tuple[str, str, str], list[Any]] = {}
    for doc in docs:
        if doc.get("kind") in ("Role", "ClusterRole"):
            meta = doc.get("metadata") or {}
            namespace = meta.get("namespace", "") if doc["kind"] == "Role" else ""
            roles[(doc["kind"], namespace, meta.get("name", ""))] = doc.get("rules") or []
    sa_namespace, sa_name = service_account
    grants: list[RbacGrant] = []
    for doc in docs:
        if doc.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = doc.get("subjects") or []
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == sa_name
            and s.get("namespace", sa_namespace) == sa_namespace
            for s in subjects
        ):
            continue
        binding_namespace = (doc.get("metadata") or {}).get("namespace")
        scope = binding_namespace if doc["kind"] == "RoleBinding" else None
        ref = doc.get("roleRef") or {}
        key = (
            ref.get("kind", ""),
            (binding_namespace or "") if ref.get("kind") == "Role" else "",
            ref.get("name", ""),
        )
        for rule in roles.get(key, []):
            if rule.get("nonResourceURLs"):
                continue
            grants.append(
                RbacGrant(
                    verbs=frozenset(rule.get("verbs") or ()),
                    api_groups=frozenset(rule.get("apiGroups") or ()),
                    resources=frozenset(rule.get("resources") or ()),
                    resource_names=frozenset(rule.get("resourceNames") or ()),
                    namespace=scope,
                )
            )
    return grants
