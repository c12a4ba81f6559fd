"""Patches: JSON merge (RFC 7386), strategic merge and JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from tests.support.apiserver.errors import JSONDict

# Patch content types, as accepted by the real server (apply-patch is not modelled).
JSON_PATCH: Final = "application/json-patch+json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
PATCH_TYPES: Final = frozenset({JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH})


class PatchError(Exception):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value, never mutates its inputs."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: JSONDict = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
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
            result[index] = strategic_merge(result[index], item)
        else:
            result.append(strategic_merge({}, item))
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
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
                result[key] = strategic_merge(result.get(key), value)
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
        raise PatchError("path is not a string")
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f'invalid JSON pointer: "{path}"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _list_index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if allow_end and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index: {token}")
    index = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if index > limit:
        raise PatchError(f"index out of bounds: {index}")
    return index


def _resolve_parent(doc: Any, tokens: list[str], op: str, path: Any) -> Any:
    cur = doc
    for token in tokens[:-1]:
        if isinstance(cur, dict) and token in cur:
            cur = cur[token]
        elif isinstance(cur, list):
            try:
                cur = cur[_list_index(cur, token, allow_end=False)]
            except PatchError:
                raise PatchError(
                    f'{op} operation does not apply: doc is missing path: "{path}": missing value'
                ) from None
        else:
            raise PatchError(
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
        except PatchError:
            pass
    raise PatchError(f'{op} operation does not apply: doc is missing path: "{path}": missing value')


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
        raise PatchError(
            f'{op} operation does not apply: doc is missing path: "{path}": missing value'
        )
    return doc


def _pointer_remove(doc: Any, path: Any, op: str = "remove") -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError(f"{op} operation does not apply: cannot remove the whole document")
    parent = _resolve_parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        try:
            return parent.pop(_list_index(parent, last, allow_end=False))
        except PatchError:
            pass
    raise PatchError(f'{op} operation does not apply: doc is missing path: "{path}": missing value')


def json_patch(doc: Any, operations: list[Any]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test) on a deep copy of ``doc``."""
    result = copy.deepcopy(doc)
    for operation in operations:
        if not isinstance(operation, dict):
            raise PatchError("invalid operation: not an object")
        op = operation.get("op")
        path = operation.get("path")
        if op == "add":
            if "value" not in operation:
                raise PatchError("add operation does not apply: missing value")
            result = _pointer_add(result, path, copy.deepcopy(operation["value"]))
        elif op == "remove":
            _pointer_remove(result, path)
        elif op == "replace":
            if "value" not in operation:
                raise PatchError("replace operation does not apply: missing value")
            try:
                _pointer_get(result, path, "replace")
            except PatchError:
                raise PatchError(
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
            except PatchError:
                raise PatchError(f"testing value {path} failed: test failed") from None
            if not _json_equal(actual, operation.get("value")):
                raise PatchError(f"testing value {path} failed: test failed")
        elif op in {"move", "copy"}:
            source = operation.get("from")
            value = _pointer_get(result, source, op)
            if op == "move":
                if (
                    isinstance(source, str)
                    and isinstance(path, str)
                    and (path.startswith(source + "/"))
                ):
                    raise PatchError("move operation does not apply: from is a prefix of path")
                _pointer_remove(result, source, op)
            result = _pointer_add(result, path, copy.deepcopy(value), op)
        else:
            raise PatchError(f"Unexpected kind: {op}")
    return result
