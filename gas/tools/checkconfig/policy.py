"""The legacy Policy (Kubernetes <= 1.22), the ConfigMap that carries it, and the RBAC that
lets kube-scheduler read that ConfigMap."""

from __future__ import annotations

from typing import Any

from gas.tools.checkconfig.checker import Checker
from gas.tools.checkconfig.extenders import check_extenders
from gas.tools.checkconfig.load import (
    LocatedMap,
    ParseError,
    line_of,
    parse_documents,
    text_offset,
)
from gas.tools.checkconfig.values import POLICY

POLICY_KEY = "policy.cfg"
POLICY_CONFIGMAP = "scheduler-extender-policy"
SCHEDULER_USER = "system:kube-scheduler"
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
POLICY_FIELDS = (
    "kind",
    "apiVersion",
    "predicates",
    "priorities",
    "extenders",
    "hardPodAffinitySymmetricWeight",
    "alwaysCheckAllPredicates",
)


def check_policy(checker: Checker, doc: LocatedMap) -> None:
    """A Policy object, from a file or from the ConfigMap's ``policy.cfg``."""
    checker.duplicates(doc, policy=True)
    checker.versions(POLICY, "kind", line_of(doc, "kind"))
    if doc.get("apiVersion") != "v1":
        checker.error(
            "apiVersion",
            f'a Policy has apiVersion "v1", not {doc.get("apiVersion")!r}',
            line_of(doc, "apiVersion"),
        )
    checker.unknown_fields(doc, "", POLICY_FIELDS, "a Policy", POLICY, strict=False)
    predicates = doc.get("predicates")
    if isinstance(predicates, list) and not predicates:
        checker.warning(
            "predicates",
            "an empty list turns off every default predicate (resources, taints, "
            "affinity...): leave predicates out to keep the defaults",
            line_of(doc, "predicates"),
        )
    check_extenders(checker, doc, POLICY)


def check_policy_configmap(
    checker: Checker, doc: LocatedMap, text: str | None, offset: int, rbac: list[LocatedMap] | None
) -> None:
    """A ConfigMap holding a Policy: where kube-scheduler looks for it, whether ``rbac`` (when
    given) lets it read it, and the Policy ``text`` itself (``offset``: its first line)."""
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), LocatedMap) else LocatedMap()
    assert isinstance(metadata, LocatedMap)
    namespace = metadata.get("namespace")
    name = metadata.get("name")
    if namespace is None:
        checker.warning(
            "metadata.namespace",
            "missing: the ConfigMap lands in the current namespace, but kube-scheduler "
            "reads kube-system (unless --policy-configmap-namespace says otherwise)",
            metadata.line or doc.line,
        )
    elif namespace != "kube-system":
        checker.warning(
            "metadata.namespace",
            f"{namespace!r}: kube-scheduler reads the policy ConfigMap from kube-system "
            "unless started with --policy-configmap-namespace",
            line_of(metadata, "namespace"),
        )
    if rbac is not None and isinstance(name, str):
        ns = namespace if isinstance(namespace, str) else "kube-system"
        if not can_get_configmap(rbac, SCHEDULER_USER, ns, name):
            checker.error(
                "metadata.name",
                f"none of the RBAC objects given lets user {SCHEDULER_USER} get "
                f"ConfigMap {ns}/{name}, so kube-scheduler cannot load the policy",
                line_of(metadata, "name"),
            )
    if text is None:
        return
    inner = Checker(checker.report, checker.version, f"{checker.prefix}data[{POLICY_KEY}].")
    try:
        documents = [d for d in parse_documents(text, offset) if d is not None]
    except ParseError as exc:
        checker.error(f"data[{POLICY_KEY}]", str(exc), exc.line)
        return
    if len(documents) != 1 or not isinstance(documents[0], LocatedMap):
        checker.error(f"data[{POLICY_KEY}]", "must hold one JSON Policy object", doc.line)
        return
    policy = documents[0]
    if policy.get("kind") != "Policy":
        inner.error(
            "kind", f'must be "Policy", not {policy.get("kind")!r}', line_of(policy, "kind")
        )
    check_policy(inner, policy)


def can_get_configmap(rbac: list[LocatedMap], user: str, namespace: str, name: str) -> bool:
    """Whether the Roles and bindings in ``rbac`` let ``user`` get ConfigMap namespace/name."""

    def grants(role: LocatedMap) -> bool:
        rules = role.get("rules")
        if not isinstance(rules, list):
            return False
        for rule in rules:
            if not isinstance(rule, dict):
                continue
            groups = rule.get("apiGroups") or []
            resources = rule.get("resources") or []
            verbs = rule.get("verbs") or []
            names = rule.get("resourceNames") or []
            if (
                ("" in groups or "*" in groups)
                and ("configmaps" in resources or "*" in resources)
                and ("get" in verbs or "*" in verbs)
                and (not names or name in names)
            ):
                return True
        return False

    def meta(obj: LocatedMap) -> dict[str, Any]:
        value = obj.get("metadata")
        return value if isinstance(value, dict) else {}

    roles = {
        (obj.get("kind"), meta(obj).get("namespace"), meta(obj).get("name")): obj
        for obj in rbac
        if obj.get("kind") in ("Role", "ClusterRole")
    }
    for binding in rbac:
        kind = binding.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        binding_ns = meta(binding).get("namespace")
        if kind == "RoleBinding" and binding_ns != namespace:
            continue
        subjects = binding.get("subjects") or []
        if not any(
            isinstance(s, dict) and s.get("kind") == "User" and s.get("name") == user
            for s in subjects
        ):
            continue
        ref = binding.get("roleRef")
        if not isinstance(ref, dict):
            continue
        if ref.get("kind") == "ClusterRole":
            role = roles.get(("ClusterRole", None, ref.get("name")))
        elif ref.get("kind") == "Role" and kind == "RoleBinding":
            role = roles.get(("Role", binding_ns, ref.get("name")))
        else:
            role = None
        if role is not None and grants(role):
            return True
    return False


def policy_text(doc: LocatedMap) -> tuple[str | None, int, str | None]:
    """(policy text, line offset, key problem) for a ConfigMap."""
    data = doc.get("data")
    if not isinstance(data, LocatedMap):
        return None, 0, None
    if POLICY_KEY in data:
        value = data[POLICY_KEY]
        if not isinstance(value, str):
            return None, 0, f"data[{POLICY_KEY}] must be a string holding the Policy JSON"
        return value, text_offset(data, POLICY_KEY), None
    for key, value in data.items():
        if isinstance(value, str) and ('"Policy"' in value or "kind: Policy" in value):
            return (
                None,
                0,
                f"the Policy is under data[{key}], but kube-scheduler reads only the key "
                f"{POLICY_KEY}",
            )
    return None, 0, None
