"""The extender's wire format: request bodies decoded into typed records, replies encoded.

As kube-scheduler speaks it: top-level keys are Go field names, read case-insensitively and
always written with their exact capitalisation. Decoding is strict, and everything it
refuses raises `BadRequest` with a message naming the problem (answered with 400): JSON
that is not valid (NaN, Infinity, numbers out of range, nesting too deep, a body that is
not UTF-8, a string holding a lone UTF-16 surrogate), a body that is not an object, or a
field of the wrong type.

Bodies are parsed by orjson, in C, and replies written by it; the stdlib's `json` reads
and writes the few documents orjson cannot hold exactly (integers beyond 64 bits, which
orjson reads as floats; replies nested deeper than its 254 levels), and re-reads every
body orjson refuses, so that a refusal says what it always said.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

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
    value = _parse(body)
    if not isinstance(value, dict):
        raise BadRequest("body must be a JSON object")
    return _fold(value)


_UTF8_BOM = b"\xef\xbb\xbf"


def _parse(body: bytes) -> Any:
    if body.startswith(_UTF8_BOM):
        body = body[3:]  # RFC 8259 lets a parser ignore it, and gas always has
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _parse_refused(body)
    if _may_hold_long_integer(value):
        return _parse_exactly(body.decode("utf-8"))
    return value


# orjson reads an integer literal beyond 64 bits (20 digits, or 19 after a minus sign) as
# a float of at least this magnitude; the stdlib reads it exactly, as Go would refuse it.
_LONG_INTEGER = 1e18
# A list this long is passed over in C when it holds only strings (NodeNames).
_STRINGS_CHECKED_IN_C = 16


def _may_hold_long_integer(value: Any) -> bool:
    """Whether orjson's `value` holds a float that may stand for a long integer literal.

    Pods and nodes hold no float at all: this looks once at each of their values, and
    passes over a long list of strings (NodeNames) in one C-level `str.join`."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            if len(item) > _STRINGS_CHECKED_IN_C and _all_strings(item):
                continue
            stack.extend(item)
        elif kind is float and not -_LONG_INTEGER < item < _LONG_INTEGER:
            return True
    return False


def _all_strings(items: list[Any]) -> bool:
    try:
        "".join(items)
    except TypeError:
        return False
    return True


def _parse_refused(body: bytes) -> Any:
    """A body orjson refused, read again by the stdlib: its refusal, worded as gas always
    worded it, or the document when only orjson refuses it (an integer beyond a double's
    range, which the stdlib reads exactly) and it holds no lone surrogate."""
    try:
        text = body.decode("utf-8")  # strict: no UTF-16 or UTF-32, no encoded surrogates
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    value = _parse_exactly(text)
    if _SURROGATE_ESCAPE.search(text) and _holds_lone_surrogate(value):
        raise BadRequest("body is not valid JSON: a string holds a lone UTF-16 surrogate")
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _parse_exactly(text: str) -> Any:
    """The stdlib's reading: integers of any length (up to Python's 4300 digits)."""
    try:
        return _STDLIB.decode(text)
    except RecursionError:
        raise BadRequest("JSON nested too deeply") from None
    except ValueError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None


def _holds_lone_surrogate(value: Any) -> bool:
    """Whether a string (key or value) holds half a surrogate pair: the stdlib reads
    `"\\ud800"` as one, and such a name could not be written back as UTF-8."""
    strings: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            strings.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            strings.append(item)
    try:
        "".join(strings).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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


_STDLIB = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_reject_huge_float)


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
        # Both checks run in C: NodeNames may list thousands of nodes.
        if not isinstance(names, list) or not _all_strings(names):
            raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
        seen = dict.fromkeys(names)
        return (names if len(seen) == len(names) else list(seen)), None
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
    """HostPriorityList, written, with the nodes that score other than 0.

    kube-scheduler adds an extender's score to the nodes its list names and nothing to the
    others, so a node left out and a node scored 0 end equal, and the node chosen is the
    same. Under first fit, where every node scores 0, the answer is `[]`: the scheduler
    then decodes nothing per node, which cost it more than anything else in the call."""
    return [{"Host": name, "Score": value} for name, value in scores.items() if value]


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


def encode(body: Any) -> bytes:
    """`body` as compact JSON, UTF-8.

    Raises `BadRequest` for a body nested too deeply to be written, which only a request
    can make so (the Node objects a filter returns as they were sent)."""
    try:
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        pass  # beyond orjson: nesting over 254 levels, integers beyond 64 bits
    try:
        return json.dumps(body, separators=(",", ":")).encode()
    except RecursionError:
        raise BadRequest("JSON nested too deeply") from None


def compact(record: Mapping[str, Any]) -> str:
    """`record` exactly as `json.dumps(record, separators=(",", ":"))` writes it (ASCII,
    every other character escaped), for the decision log. orjson writes it when it
    would write the same: its output is ASCII without DEL (which it leaves bare), and the
    one field a request fills with any JSON, the pod's `uid`, holds no number that could
    be written another way (a float); the stdlib writes the rest. Raises RecursionError
    for a record nested too deeply to be written."""
    uid = record.get("uid")
    if uid is None or type(uid) is str:
        try:
            line = orjson.dumps(record)
        except TypeError:  # integers beyond 64 bits, keys not strings, nesting
            pass
        else:
            if line.isascii() and b"\x7f" not in line:
                return line.decode("ascii")
    return _COMPACT(record)


_COMPACT = json.JSONEncoder(separators=(",", ":")).encode


def clean(message: str) -> str:
    """kube-scheduler uses Error strings as format strings, so `%` must not appear."""
    message = message.replace("%", " percent")
    if len(message) > MAX_ERROR_LENGTH:
        message = message[: MAX_ERROR_LENGTH - 3] + "..."
    return message


def clean_values(reasons: dict[str, str]) -> dict[str, str]:
    """`clean` on every value; thousands of nodes share a few reasons, each cleaned once,
    and the dict is returned as it is when no reason changes."""
    cleaned = {reason: clean(reason) for reason in set(reasons.values())}
    if all(before is after for before, after in cleaned.items()):
        return reasons
    return {name: cleaned[reason] for name, reason in reasons.items()}
