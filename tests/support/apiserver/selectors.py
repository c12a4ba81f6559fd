"""Label and field selectors, parsed as the real server parses them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.apiserver.errors import JSONDict, bad_request
from tests.support.apiserver.kinds import Kind, field_str

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
    raise bad_request(f"unable to parse requirement: found '{term}', expected: selector term")


def _field_requirement(kind: Kind, term: str) -> _Predicate:
    for op in ("!=", "==", "="):
        if op in term:
            name, value = term.split(op, 1)
            break
    else:
        raise bad_request(f"invalid selector: '{term}'; can't understand '{term}'")
    name = name.strip()
    getter = kind.fields.get(name)
    if getter is None:
        raise bad_request(f"field label not supported: {name}")
    if op == "!=":
        return lambda obj: getter(obj) != value
    return lambda obj: getter(obj) == value


@dataclass(frozen=True)
class Selector:
    namespace: str | None
    requirements: tuple[_Predicate, ...]

    @classmethod
    def parse(cls, kind: Kind, namespace: str | None, query: Mapping[str, str]) -> Selector:
        reqs: list[_Predicate] = []
        for term in _split_terms(query.get("labelSelector", "")):
            reqs.append(_label_requirement(term))
        for term in _split_terms(query.get("fieldSelector", "")):
            reqs.append(_field_requirement(kind, term))
        return cls(namespace, tuple(reqs))

    def matches(self, obj: JSONDict) -> bool:
        if self.namespace is not None and field_str(obj, "metadata", "namespace") != (
            self.namespace
        ):
            return False
        return all(req(obj) for req in self.requirements)
