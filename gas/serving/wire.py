"""The extender's wire format: request bodies decoded into typed records, replies encoded.

As kube-scheduler speaks it: top-level keys are Go field names, read case-insensitively and
always written with their exact capitalisation. Decoding is strict, and everything it
refuses raises `BadRequest` with a message naming the problem (answered with 400): JSON
that is not valid (NaN, Infinity, numbers out of range, nesting too deep), a body that is
not an object, or a field of the wrong type.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gas.core.model import as_mapping
from gas.core.preemption import Victim

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_ERROR_LENGTH = 1000


class BadRequest(Exception):
    """The request body is not what the extender protocol says; answered with 400."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A filter or prioritize call: the pod, and the nodes to judge for it."""

    pod: dict[str, Any]
    uid: str | None
    # Unique node names, in the order given.
    names: list[str]
    # The Node objects of `names` when the scheduler sent them (nodeCacheCapable: false),
    # returned as they are for the nodes that pass.
    nodes: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """A preempt call: the pod, and per candidate node the victims the scheduler proposes
    and its count of disruption-budget violations."""

    pod: dict[str, Any]
    uid: str | None
    priority: int
    proposals: dict[str, list[Victim]]
    violations: dict[str, int]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    """A bind call: the pod by name and UID (the pod itself is not sent), and its node."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


# ------------------------------------------------------------------ decoding


def decode_extender_args(body: bytes) -> ExtenderArgs:
    args, pod = _pod_args(body, "ExtenderArgs")
    names, nodes = _candidate_nodes(args)
    return ExtenderArgs(pod, pod_uid(pod), names, nodes)


def decode_preemption_args(body: bytes) -> PreemptionArgs:
    args, pod = _pod_args(body, "ExtenderPreemptionArgs")
    proposals, violations = _preemption_candidates(args)
    return PreemptionArgs(pod, pod_uid(pod), _priority(pod), proposals, violations)


def decode_binding_args(body: bytes) -> BindingArgs:
    args = decode_object(body)
    fields = []
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = args.get(key.lower())
        if not isinstance(value, str) or not value:
            raise BadRequest(f"ExtenderBindingArgs.{key} must be a non-empty string")
        fields.append(value)
    name, namespace, uid, node = fields
    return BindingArgs(name, namespace, uid, node)


def decode_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object with lower-cased top-level keys."""
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_reject_huge_float)
    except RecursionError:
        raise BadRequest("JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("body must be a JSON object")
    return _fold(value)


def pod_uid(pod: Mapping[str, Any]) -> str | None:
    uid = as_mapping(pod.get("metadata")).get("uid")
    return uid if isinstance(uid, str) and uid else None


def node_name(node: Mapping[str, Any]) -> str:
    name = as_mapping(node.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _reject_huge_float(text: str) -> float:
    # 1e400 reads as infinity, which a JSON reply cannot carry back (Go refuses it too).
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _pod_args(body: bytes, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request body and its `Pod` object (400 when it is not one)."""
    args = decode_object(body)
    pod = args.get("pod")
    if not isinstance(pod, dict):
        raise BadRequest(f"{what}.Pod must be a Pod object")
    return args, pod


def _fold(value: Mapping[str, Any]) -> dict[str, Any]:
    """A wire struct's keys lower-cased, as Go matches field names case-insensitively."""
    lowered: dict[str, Any] = {}
    for key, item in value.items():
        # An exact-case key wins over a differently cased duplicate, as in Go.
        if key.lower() not in lowered or key[:1].isupper():
            lowered[key.lower()] = item
    return lowered


def _candidate_nodes(args: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """Names of the nodes to judge, and the Node objects when the scheduler sent them."""
    names = args.get("nodenames")
    if names is not None:
        # set(map(type, ...)) runs in C: NodeNames may list thousands of nodes.
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
        return list(dict.fromkeys(names)), None
    nodes = args.get("nodes")
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise BadRequest("ExtenderArgs.Nodes must be a NodeList with an items list")
        if not all(node_name(item) for item in items):
            raise BadRequest("every node in ExtenderArgs.Nodes needs metadata.name")
        unique = {node_name(item): item for item in items}
        return list(unique), list(unique.values())
    raise BadRequest("ExtenderArgs carries neither NodeNames nor Nodes")


def _preemption_candidates(
    args: Mapping[str, Any],
) -> tuple[dict[str, list[Victim]], dict[str, int]]:
    """The proposed victims per node and each node's NumPDBViolations, from
    `NodeNameToMetaVictims` (UIDs only) when it is given, else `NodeNameToVictims` (whole
    pods, whose `spec.priority` is read). A null node entry proposes no victim."""
    meta = args.get("nodenametometavictims")
    full = args.get("nodenametovictims")
    if meta is not None:
        field, victims_of = "NodeNameToMetaVictims", _meta_victim
    elif full is not None:
        field, victims_of = "NodeNameToVictims", _pod_victim
    else:
        raise BadRequest(
            "ExtenderPreemptionArgs carries neither NodeNameToMetaVictims nor NodeNameToVictims"
        )
    nodes = meta if meta is not None else full
    if not isinstance(nodes, dict):
        raise BadRequest(f"ExtenderPreemptionArgs.{field} must be an object of nodes")
    proposals: dict[str, list[Victim]] = {}
    violations: dict[str, int] = {}
    for name, entry in nodes.items():
        if entry is None:
            proposals[name], violations[name] = [], 0
            continue
        if not isinstance(entry, dict):
            raise BadRequest(f"{field}[{name[:100]!r}] must be an object with Pods")
        entry = _fold(entry)
        pods = entry.get("pods")
        count = entry.get("numpdbviolations", 0)
        if pods is not None and not isinstance(pods, list):
            raise BadRequest(f"{field}[{name[:100]!r}].Pods must be a list")
        if not isinstance(count, int) or isinstance(count, bool):
            raise BadRequest(f"{field}[{name[:100]!r}].NumPDBViolations must be an integer")
        proposals[name] = [victims_of(item, f"{field}[{name[:100]!r}]") for item in pods or []]
        violations[name] = count
    return proposals, violations


def _priority(pod: Mapping[str, Any]) -> int:
    """The pod's `spec.priority`; 0 without one, as kube-scheduler counts it."""
    value = as_mapping(pod.get("spec")).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _meta_victim(item: object, where: str) -> Victim:
    uid = _fold(item).get("uid") if isinstance(item, dict) else None
    if not isinstance(uid, str) or not uid:
        raise BadRequest(f"every pod in {where}.Pods needs a non-empty UID")
    return Victim(uid)


def _pod_victim(item: object, where: str) -> Victim:
    pod = as_mapping(item)
    uid = as_mapping(pod.get("metadata")).get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest(f"every pod in {where}.Pods needs metadata.uid")
    priority = as_mapping(pod.get("spec")).get("priority")
    if isinstance(priority, bool) or not isinstance(priority, int):
        priority = None
    return Victim(uid, priority)


# ------------------------------------------------------------------ replies


def filter_result(
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    nodes: list[dict[str, Any]] | None,
    error: str,
) -> dict[str, Any]:
    """ExtenderFilterResult; `nodes` are the Node objects that passed, in the full-`Nodes`
    mode, else None."""
    return {
        "Nodes": None if nodes is None else {"metadata": {}, "items": nodes},
        "NodeNames": passed,
        "FailedNodes": clean_values(failed),
        "FailedAndUnresolvableNodes": clean_values(unresolvable),
        "Error": clean(error),
    }


def host_priority_list(scores: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"Host": name, "Score": value} for name, value in scores.items()]


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult in the meta form, from each kept node's victim UIDs and
    disruption-budget violations."""
    return {
        "NodeNameToMetaVictims": {
            name: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": count}
            for name, (uids, count) in victims.items()
        }
    }


def error_result(message: str) -> dict[str, Any]:
    """A body with only `Error`: ExtenderBindingResult, and every refusal's body."""
    return {"Error": clean(message)}


def encode(body: Any) -> str:
    return json.dumps(body, separators=(",", ":"))


def clean(message: str) -> str:
    """kube-scheduler uses Error strings as format strings, so `%` must not appear."""
    message = message.replace("%", " percent")
    if len(message) > MAX_ERROR_LENGTH:
        message = message[: MAX_ERROR_LENGTH - 3] + "..."
    return message


def clean_values(reasons: dict[str, str]) -> dict[str, str]:
    """`clean` on every value; thousands of nodes share a few reasons, each cleaned once,
    and the dict is returned as it is when no reason changes."""
    cleaned: dict[str, str] = {}
    for reason in reasons.values():
        if reason not in cleaned:
            cleaned[reason] = clean(reason)
    if all(before is after for before, after in cleaned.items()):
        return reasons
    return {name: cleaned[reason] for name, reason in reasons.items()}
