"""The object store: objects by kind, resource versions, the watch history and its watchers.

Stored objects are never mutated in place (every write stores a new dict), so they can be
shared with watch streams without copying; callers hand out deep copies.
"""

from __future__ import annotations

import copy
import json
import random
import string
import threading
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from tests.support.apiserver.errors import (
    ApiError,
    JSONDict,
    already_exists,
    bad_request,
    conflict,
    error_event,
    invalid,
    modified_conflict,
    not_found,
    precondition_conflict,
    unprocessable,
)
from tests.support.apiserver.kinds import EVENTS, KINDS, PODS, Kind
from tests.support.apiserver.paging import LATEST, PageRequest, expired, take_page
from tests.support.apiserver.patches import (
    JSON_PATCH,
    MERGE_PATCH,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge,
)
from tests.support.apiserver.selectors import Selector

_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"
DEFAULT_HISTORY: Final = 10_000


def now() -> str:
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


@dataclass(frozen=True)
class StoredEvent:
    """One write in the history; ``obj``/``prev`` are immutable snapshots."""

    rv: int
    type: str
    resource: str
    obj: JSONDict
    prev: JSONDict | None


class Watcher:
    def __init__(self, kind: Kind, selector: Selector) -> None:
        self.kind = kind
        self.selector = selector
        self.pending: list[StoredEvent] = []
        self.seen_rv = 0

    def convert(self, event: StoredEvent) -> JSONDict | None:
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


class Store:
    """Every object the double holds, with real-server rules for each write.

    One lock guards it all; a ``*_locked`` method expects its caller to hold ``lock``.
    """

    def __init__(self, history_limit: int = DEFAULT_HISTORY) -> None:
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self.objects: dict[str, dict[tuple[str, str], JSONDict]] = {k: {} for k in KINDS}
        self.rv = 1
        self._floor = 1  # every event with rv > floor is retained
        self._history: deque[StoredEvent] = deque()
        self._history_limit = history_limit
        self.watchers: set[Watcher] = set()
        self.event_log: list[JSONDict] = []
        self._stopping = False
        # Lists are answered in storage-key order: the current order of each kind is kept
        # until its next write, so the pages of a large list do not each sort it again.
        self._ordered: dict[str, tuple[list[str], list[JSONDict]]] = {}
        self._last_write: dict[str, int] = {}

    def set_stopping(self, stopping: bool) -> None:
        """While stopping, every watch stream ends at its next wake-up."""
        with self._cond:
            self._stopping = stopping
            self._cond.notify_all()

    def compact(self) -> int:
        """Forget every retained event: watching from any older RV now yields 410."""
        with self.lock:
            self._history.clear()
            self._floor = self.rv
            return self._floor

    def get_locked(self, kind: Kind, namespace: str, name: str) -> JSONDict:
        found = self.objects[kind.resource].get((namespace if kind.namespaced else "", name))
        if found is None:
            raise not_found(kind.resource, name)
        return found

    def write_locked(
        self, kind: Kind, key: tuple[str, str], new: JSONDict, event_type: str
    ) -> JSONDict:
        """The single write primitive: bump RV, store, record history, wake watchers."""
        self.rv += 1
        store = self.objects[kind.resource]
        prev = store.get(key)
        new.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        if event_type == "DELETED":
            store.pop(key, None)
        else:
            store[key] = new
        event = StoredEvent(self.rv, event_type, kind.resource, new, prev)
        if len(self._history) >= self._history_limit:
            self._floor = self._history.popleft().rv
        self._history.append(event)
        self._ordered.pop(kind.resource, None)
        self._last_write[kind.resource] = self.rv
        for watcher in self.watchers:
            if watcher.kind is kind:
                watcher.pending.append(event)
        self._cond.notify_all()
        return new

    def create_locked(
        self, kind: Kind, namespace: str, obj: JSONDict, *, from_http: bool
    ) -> JSONDict:
        new = copy.deepcopy(obj)
        if kind is not EVENTS:
            new.pop("kind", None)
            new.pop("apiVersion", None)
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        if kind.namespaced:
            given = meta.get("namespace") or ""
            if from_http and given and given != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            namespace = namespace or given or "default"
            meta["namespace"] = namespace
        else:
            namespace = ""
            meta.pop("namespace", None)
        name = meta.get("name") or ""
        store = self.objects[kind.resource]
        if not name:
            prefix = meta.get("generateName") or ""
            if not prefix:
                raise invalid(
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
            raise already_exists(kind.resource, name)
        if from_http:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta.pop("deletionTimestamp", None)
            meta.pop("deletionGracePeriodSeconds", None)
        else:
            meta["uid"] = meta.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = meta.get("creationTimestamp") or now()
        if kind is PODS:
            if from_http:
                new["status"] = {"phase": "Pending"}
            else:
                status = new.get("status")
                if not isinstance(status, dict):
                    status = new["status"] = {}
                status.setdefault("phase", "Pending")
        new = _stored_form(kind.resource, new)
        stored = self.write_locked(kind, (namespace, name), new, "ADDED")
        if kind is EVENTS:
            self.event_log.append(stored)
        return stored

    def modify_locked(self, kind: Kind, key: tuple[str, str], new: JSONDict) -> JSONDict:
        """Store ``new`` as the next state of ``key`` unless it equals the current one."""
        old = self.objects[kind.resource][key]
        new = _stored_form(kind.resource, new)
        new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
        if _canonical(new) == _canonical(old):
            return old
        return self.write_locked(kind, key, new, "MODIFIED")

    def update_locked(
        self, kind: Kind, namespace: str, name: str, body: Any, subresource: str
    ) -> JSONDict:
        """PUT semantics (also the tail of PATCH): real-server update strategy rules."""
        old = self.get_locked(kind, namespace, name)
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        new = copy.deepcopy(body)
        new.pop("kind", None)
        new.pop("apiVersion", None)
        meta = new.get("metadata")
        if meta is None:
            meta = new["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        if meta.get("name", "") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on "
                f"the URL ({name})"
            )
        if kind.namespaced:
            given = meta.get("namespace") or ""
            if given and given != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        old_meta = old["metadata"]
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and str(wanted_rv) != old_meta["resourceVersion"]:
            raise modified_conflict(kind.resource, name)
        uid = meta.get("uid") or old_meta.get("uid")
        if uid != old_meta.get("uid"):
            raise invalid(
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
            if kind is PODS and "ownerReferences" in old_meta:
                meta["ownerReferences"] = old_meta["ownerReferences"]
            elif kind is PODS:
                meta.pop("ownerReferences", None)
        else:
            carried = ["status"]
        for part in carried:
            if part in old:
                new[part] = old[part]
            else:
                new.pop(part, None)
        if (
            kind is PODS
            and subresource == ""
            and _pod_spec_fingerprint(new.get("spec")) != _pod_spec_fingerprint(old.get("spec"))
        ):
            raise invalid(
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
        return self.modify_locked(kind, (namespace if kind.namespaced else "", name), new)

    def patch_locked(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        subresource: str,
        content_type: str,
        patch: Any,
    ) -> JSONDict:
        old = self.get_locked(kind, namespace, name)
        current = kind.typed(old)
        if content_type == JSON_PATCH:
            if not isinstance(patch, list):
                raise bad_request(
                    "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
                )
            try:
                patched = json_patch(current, patch)
            except PatchError as exc:
                raise unprocessable(str(exc)) from None
        else:
            if not isinstance(patch, dict):
                raise bad_request("the body of a merge patch must be a JSON object")
            merge = merge_patch if content_type == MERGE_PATCH else strategic_merge
            patched = merge(current, patch)
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise unprocessable("the patched object is not a valid object")
        return self.update_locked(kind, namespace, name, patched, subresource)

    def delete_locked(
        self, kind: Kind, namespace: str, name: str, options: JSONDict | None
    ) -> JSONDict:
        old = self.get_locked(kind, namespace, name)
        key = (namespace if kind.namespaced else "", name)
        preconditions = (options or {}).get("preconditions") or {}
        if isinstance(preconditions, dict):
            self._check_preconditions(
                kind, key, old, preconditions.get("uid"), preconditions.get("resourceVersion")
            )
        self.write_locked(kind, key, copy.deepcopy(old), "DELETED")
        return old

    @staticmethod
    def _check_preconditions(
        kind: Kind, key: tuple[str, str], obj: JSONDict, uid: Any, resource_version: Any
    ) -> None:
        meta = obj["metadata"]
        storage_key = kind.storage_key(*key)
        if uid and uid != meta.get("uid"):
            raise precondition_conflict(
                kind.resource,
                key[1],
                storage_key,
                f"UID in precondition: {uid}, UID in object meta: {meta.get('uid', '')}",
            )
        if resource_version and str(resource_version) != meta.get("resourceVersion"):
            raise precondition_conflict(
                kind.resource,
                key[1],
                storage_key,
                f"ResourceVersion in precondition: {resource_version}, ResourceVersion in "
                f"object meta: {meta.get('resourceVersion')}",
            )

    def bind(self, namespace: str, name: str, body: Any) -> None:
        """POST pods/{name}/binding, following BindingREST.Create in the real server."""
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        if body.get("kind") not in (None, "", "Binding"):
            raise bad_request(f"not a Binding object: kind {body.get('kind')!r}")
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        if (meta.get("namespace") or namespace) != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        if (meta.get("name") or "") != name:
            raise bad_request("name in URL does not match name in Binding object")
        target = body.get("target") or {}
        if not isinstance(target, dict):
            raise bad_request("target must be a JSON object")
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
        with self.lock:
            pod = self.get_locked(PODS, namespace, name)
            self._check_preconditions(
                PODS, (namespace, name), pod, meta.get("uid"), meta.get("resourceVersion")
            )
            pod_meta = pod["metadata"]
            spec = pod.get("spec") or {}
            if pod_meta.get("deletionTimestamp"):
                raise conflict(
                    "pods/binding",
                    name,
                    f"pod {name} is being deleted, cannot be assigned to a host",
                )
            if spec.get("nodeName"):
                raise conflict(
                    "pods/binding",
                    name,
                    f'pod {name} is already assigned to node "{spec["nodeName"]}"',
                )
            if spec.get("schedulingGates"):
                raise conflict(
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
                "lastTransitionTime": now(),
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
            self.write_locked(PODS, (namespace, name), _stored_form("pods", new), "MODIFIED")

    def list_objects(self, kind: Kind, namespace: str | None, query: Mapping[str, str]) -> JSONDict:
        """A list, or one page of it (``limit``/``continue``: tests/support/apiserver/paging.py)."""
        selector = Selector.parse(kind, namespace, query)
        request = PageRequest.parse(query)
        prefix = f"{namespace}/" if kind.namespaced and namespace else ""
        with self.lock:
            rv, (keys, objects) = self._listing_locked(kind, request)
            page = take_page(keys, objects, prefix, selector, request, rv)
        meta: JSONDict = {"resourceVersion": str(rv)}
        if page.continue_token is not None:
            meta["continue"] = page.continue_token
            if page.remaining is not None:
                meta["remainingItemCount"] = page.remaining
        return {
            "kind": kind.list_kind,
            "apiVersion": kind.api_version,
            "metadata": meta,
            "items": page.items,
        }

    def _listing_locked(
        self, kind: Kind, request: PageRequest
    ) -> tuple[int, tuple[list[str], list[JSONDict]]]:
        """The resourceVersion a page is read at, and the keys and objects of that state."""
        snapshot = request.snapshot
        if snapshot is None or snapshot == LATEST:
            return self.rv, self._ordered_locked(kind)
        if snapshot < self._floor:
            raise expired(request.start)
        if snapshot > self.rv:
            # etcd's own refusal, which the real server passes on as an internal error.
            cause = "etcdserver: mvcc: required revision is a future revision"
            raise ApiError(
                500,
                "InternalError",
                f"Internal error occurred: {cause}",
                {"causes": [{"message": cause}]},
            )
        if self._last_write.get(kind.resource, 0) <= snapshot:
            return snapshot, self._ordered_locked(kind)
        # Written since the snapshot: undo the later writes, newest first, so each object
        # ends as the earliest later write found it.
        state = dict(self.objects[kind.resource])
        for event in reversed(self._history):
            if event.rv <= snapshot:
                break
            if event.resource != kind.resource:
                continue
            meta = event.obj.get("metadata") or {}
            key = (str(meta.get("namespace") or "") if kind.namespaced else "", meta["name"])
            if event.prev is None:
                state.pop(key, None)
            else:
                state[key] = event.prev
        return snapshot, _in_key_order(kind, state)

    def _ordered_locked(self, kind: Kind) -> tuple[list[str], list[JSONDict]]:
        ordered = self._ordered.get(kind.resource)
        if ordered is None:
            ordered = _in_key_order(kind, self.objects[kind.resource])
            self._ordered[kind.resource] = ordered
        return ordered

    # -- watch internals ---------------------------------------------------------------

    def open_watch(
        self,
        kind: Kind,
        selector: Selector,
        resource_version: str,
        send_initial: bool,
    ) -> tuple[Watcher | None, list[JSONDict], JSONDict | None]:
        """Register a watcher; returns (watcher, first events, terminal ERROR event)."""
        watcher = Watcher(kind, selector)
        with self.lock:
            current = self.rv
            first: list[JSONDict] = []
            if resource_version in {"", "0"} or send_initial:
                for _, obj in sorted(self.objects[kind.resource].items()):
                    if selector.matches(obj):
                        first.append({"type": "ADDED", "object": kind.typed(obj)})
            else:
                wanted = int(resource_version)
                if wanted < self._floor:
                    return (
                        None,
                        [],
                        error_event(
                            410, "Expired", f"too old resource version: {wanted} ({self._floor})"
                        ),
                    )
                if wanted > current:
                    return (
                        None,
                        [],
                        error_event(
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
            self.watchers.add(watcher)
        return watcher, first, None

    def next_events(self, watcher: Watcher, wait: float) -> tuple[list[StoredEvent], bool]:
        """Pending events for ``watcher`` (waiting up to ``wait`` s); and the stop flag."""
        with self._cond:
            if not watcher.pending and not self._stopping and wait > 0:
                self._cond.wait(wait)
            events, watcher.pending = watcher.pending, []
            watcher.seen_rv = self.rv
            return events, self._stopping

    def close_watch(self, watcher: Watcher | None) -> None:
        if watcher is None:
            return
        with self.lock:
            self.watchers.discard(watcher)


def _in_key_order(
    kind: Kind, objects: Mapping[tuple[str, str], JSONDict]
) -> tuple[list[str], list[JSONDict]]:
    """Keys (``namespace/name``, or ``name``) and objects, ordered as etcd orders them."""
    pairs = sorted(
        ((f"{ns}/{name}" if kind.namespaced else name), obj) for (ns, name), obj in objects.items()
    )
    return [key for key, _ in pairs], [obj for _, obj in pairs]
