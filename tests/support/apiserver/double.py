"""The double's face: lifecycle, kubeconfig, what tests observe, and in-process writes."""

from __future__ import annotations

import copy
import os
import re
import threading
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from tests.support.apiserver.errors import ApiError, JSONDict
from tests.support.apiserver.faults import FaultInjector
from tests.support.apiserver.kinds import KINDS, LEASES, NODES, PODS, field_str
from tests.support.apiserver.patches import merge_patch as apply_merge_patch
from tests.support.apiserver.rbac import RbacGrant, RbacRequest, rbac_request
from tests.support.apiserver.routes import Route
from tests.support.apiserver.server import HttpServer, RequestHandler
from tests.support.apiserver.store import DEFAULT_HISTORY, Store, now


class ApiServerDouble:
    """A stateful fake kube-apiserver (core/v1 nodes, pods, bindings, events)."""

    def __init__(
        self,
        *,
        history_limit: int = DEFAULT_HISTORY,
        bookmark_interval: float = 1.0,
        rbac: Iterable[RbacGrant] | None = None,
    ) -> None:
        # None: every request is allowed (the default). Otherwise only what a grant allows;
        # the rest is answered 403 Forbidden and recorded in ``denied``.
        self.rbac: list[RbacGrant] | None = None if rbac is None else list(rbac)
        self.rbac_user = "system:serviceaccount:gas-system:gas"
        self._denied: list[RbacRequest] = []
        self.store = Store(history_limit)
        self.bookmark_interval = bookmark_interval
        self.faults = FaultInjector()
        # Holder identities whose Lease writes fail with 500: one replica cut off from the
        # lease while the others still reach it (a path fault would hit them all).
        self.lease_cut_off: set[str] = set()
        self.kubeconfig_path: str | None = None
        self._requests_lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []
        self._targets: list[tuple[str, str]] = []
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> ApiServerDouble:
        if self._server is not None:
            return self
        server = HttpServer(("127.0.0.1", 0), RequestHandler)
        server.double = self
        self._server = server
        self.store.set_stopping(False)
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
        self.store.set_stopping(True)
        for rule in self.faults.rules:
            rule.release()  # a held request must not outlive the server
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
        with self.store.lock:
            return self.store.rv

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
        with self.store.lock:
            return copy.deepcopy(self.store.event_log)

    @property
    def denied(self) -> list[RbacRequest]:
        """Every request refused with 403 by the RBAC check, oldest first."""
        with self._requests_lock:
            return list(self._denied)

    @property
    def open_watch_count(self) -> int:
        with self.store.lock:
            return len(self.store.watchers)

    # -- in-process helpers (same store, same RV/event rules) --------------------------

    def add_node(self, obj: Mapping[str, Any]) -> JSONDict:
        with self.store.lock:
            return copy.deepcopy(self.store.create_locked(NODES, "", dict(obj), from_http=False))

    def put_node(self, obj: Mapping[str, Any]) -> JSONDict:
        """Create the node or replace it wholesale (spec and status); no-op if equal."""
        new = copy.deepcopy(dict(obj))
        name = field_str(new, "metadata", "name")
        with self.store.lock:
            old = self.store.objects["nodes"].get(("", name))
            if old is None:
                return copy.deepcopy(self.store.create_locked(NODES, "", new, from_http=False))
            new.pop("kind", None)
            new.pop("apiVersion", None)
            meta = new.setdefault("metadata", {})
            meta.setdefault("uid", old["metadata"].get("uid"))
            meta.setdefault("creationTimestamp", old["metadata"].get("creationTimestamp"))
            return copy.deepcopy(self.store.modify_locked(NODES, ("", name), new))

    def delete_node(self, name: str) -> JSONDict:
        with self.store.lock:
            return copy.deepcopy(self.store.delete_locked(NODES, "", name, None))

    def get_node(self, name: str) -> JSONDict | None:
        with self.store.lock:
            found = self.store.objects["nodes"].get(("", name))
            return copy.deepcopy(found) if found is not None else None

    def list_nodes(self) -> list[JSONDict]:
        with self.store.lock:
            return [copy.deepcopy(v) for _, v in sorted(self.store.objects["nodes"].items())]

    def add_pod(self, obj: Mapping[str, Any]) -> JSONDict:
        """Create a pod (namespace defaults to ``default``); returns the stored copy."""
        with self.store.lock:
            obj_dict = dict(obj)
            ns = field_str(obj_dict, "metadata", "namespace") or "default"
            return copy.deepcopy(self.store.create_locked(PODS, ns, obj_dict, from_http=False))

    def get_lease(self, namespace: str, name: str) -> JSONDict | None:
        """A coordination.k8s.io/v1 Lease as stored, or None."""
        with self.store.lock:
            found = self.store.objects[LEASES.resource].get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def get_pod(self, namespace: str, name: str) -> JSONDict | None:
        with self.store.lock:
            found = self.store.objects["pods"].get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def list_pods(self) -> list[JSONDict]:
        with self.store.lock:
            return [copy.deepcopy(v) for _, v in sorted(self.store.objects["pods"].items())]

    def patch_node(self, name: str, merge_patch: Mapping[str, Any]) -> JSONDict:
        """Apply an RFC 7386 merge patch to the whole node (as the kubelet's status sync)."""
        with self.store.lock:
            old = self.store.get_locked(NODES, "", name)
            new = apply_merge_patch(old, dict(merge_patch))
            new.setdefault("metadata", {})["name"] = name
            return copy.deepcopy(self.store.modify_locked(NODES, ("", name), new))

    def patch_object(
        self, resource: str, name: str, merge_patch: Mapping[str, Any], namespace: str = ""
    ) -> JSONDict:
        """Apply an RFC 7386 merge patch to a whole object of `resource` (as its controller
        would write its status); namespaced ones default to ``default``."""
        kind = KINDS[resource]
        space = (namespace or "default") if kind.namespaced else ""
        with self.store.lock:
            old = self.store.get_locked(kind, space, name)
            new = apply_merge_patch(old, dict(merge_patch))
            return copy.deepcopy(self.store.modify_locked(kind, (space, name), new))

    def patch_pod(self, namespace: str, name: str, merge_patch: Mapping[str, Any]) -> JSONDict:
        """Apply an RFC 7386 merge patch to the whole pod (spec, status and metadata)."""
        with self.store.lock:
            old = self.store.get_locked(PODS, namespace, name)
            new = apply_merge_patch(old, dict(merge_patch))
            meta = new.setdefault("metadata", {})
            meta["name"], meta["namespace"] = name, namespace
            return copy.deepcopy(self.store.modify_locked(PODS, (namespace, name), new))

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
                    "deletionTimestamp": now(),
                    "deletionGracePeriodSeconds": grace_period_seconds,
                }
            },
        )

    def delete_pod(self, namespace: str, name: str) -> JSONDict:
        with self.store.lock:
            return copy.deepcopy(self.store.delete_locked(PODS, namespace, name, None))

    def compact(self) -> int:
        """Forget every retained event: watching from any older RV now yields 410."""
        return self.store.compact()

    # -- any other kind (resource.k8s.io/v1 slices and claims) --------------------------

    def add_object(self, resource: str, obj: Mapping[str, Any]) -> JSONDict:
        """Create an object of `resource` (namespaced ones default to ``default``)."""
        kind = KINDS[resource]
        obj_dict = copy.deepcopy(dict(obj))
        namespace = field_str(obj_dict, "metadata", "namespace") or "default"
        with self.store.lock:
            created = self.store.create_locked(
                kind, namespace if kind.namespaced else "", obj_dict, from_http=False
            )
            return copy.deepcopy(created)

    def get_object(self, resource: str, name: str, namespace: str = "") -> JSONDict | None:
        kind = KINDS[resource]
        with self.store.lock:
            found = self.store.objects[resource].get((namespace if kind.namespaced else "", name))
            return copy.deepcopy(found) if found is not None else None

    def list_objects(self, resource: str) -> list[JSONDict]:
        with self.store.lock:
            return [copy.deepcopy(v) for _, v in sorted(self.store.objects[resource].items())]

    def delete_object(self, resource: str, name: str, namespace: str = "") -> JSONDict:
        kind = KINDS[resource]
        with self.store.lock:
            deleted = self.store.delete_locked(kind, namespace, name, None)
            return copy.deepcopy(deleted)

    # -- the HTTP face's hooks ---------------------------------------------------------

    def authorize(
        self, route: Route, method: str, query: Mapping[str, str], is_watch: bool
    ) -> ApiError | None:
        """None when the RBAC grants (if any) allow the request, else the 403 to answer."""
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

    def record_request(self, method: str, path: str, target: str) -> None:
        with self._requests_lock:
            self._requests.append((method, path))
            self._targets.append((method, target))
