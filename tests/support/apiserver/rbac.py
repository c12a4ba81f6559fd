"""RBAC: an optional authorizer, as kube-apiserver's RBAC authorizer decides for one user."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.apiserver.errors import ApiError, JSONDict
from tests.support.apiserver.routes import Route


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
    route: Route, method: str, query: Mapping[str, str], is_watch: bool
) -> RbacRequest:
    """Map one HTTP request to RBAC attributes (verb, group, resource, ...)."""
    assert route.kind is not None
    group = route.api_version.rpartition("/")[0]
    subresource = route.target if route.target in ("status", "binding", "eviction", "proxy") else ""
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
