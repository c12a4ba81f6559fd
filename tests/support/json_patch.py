"""A JSON Patch (RFC 6902) applier for the operations gas's webhook may send: `add` and
`replace`, with RFC 6901 pointers. Strict: a patch the API server would refuse raises
`PatchError` rather than being applied loosely."""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    pass


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"pointer {pointer!r} does not start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def _index(container: list[Any], token: str, adding: bool) -> int:
    if token == "-" and adding:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"array index {token!r} is not a number")
    index = int(token)
    if index > len(container) or (index == len(container) and not adding):
        raise PatchError(f"array index {index} is out of range")
    return index


def apply_patch(document: Any, patch: list[dict[str, Any]]) -> Any:
    """`document` with `patch` applied (the document itself is left unchanged)."""
    result = copy.deepcopy(document)
    for operation in patch:
        op, path = operation.get("op"), operation.get("path")
        if op not in ("add", "replace") or not isinstance(path, str) or "value" not in operation:
            raise PatchError(f"unsupported or malformed operation {operation!r}")
        tokens = _tokens(path)
        if not tokens:
            result = copy.deepcopy(operation["value"])
            continue
        parent = result
        for token in tokens[:-1]:
            if isinstance(parent, dict):
                if token not in parent:
                    raise PatchError(f"{path}: {token!r} does not exist")
                parent = parent[token]
            elif isinstance(parent, list):
                parent = parent[_index(parent, token, adding=False)]
            else:
                raise PatchError(f"{path}: {token!r} is inside a scalar")
        last, value = tokens[-1], copy.deepcopy(operation["value"])
        if isinstance(parent, dict):
            if op == "replace" and last not in parent:
                raise PatchError(f"replace {path}: the member does not exist")
            parent[last] = value
        elif isinstance(parent, list):
            index = _index(parent, last, adding=op == "add")
            if op == "add":
                parent.insert(index, value)
            else:
                parent[index] = value
        else:
            raise PatchError(f"{path}: the parent is a scalar")
    return result
