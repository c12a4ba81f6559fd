"""Paginated lists (``limit`` and ``continue``) as the real kube-apiserver serves them from etcd.

A list with ``limit`` answers at most that many items, ordered by storage key (namespace,
then name), and a ``metadata.continue`` token when more remain, with
``metadata.remainingItemCount`` when no label or field selector filters the list. Every page
is read at the first page's resourceVersion (the snapshot), which each page carries, so a
paginated list is exactly the list one request would have answered. The token is the real
server's: unpadded URL-safe base64 of ``{"v":"meta.k8s.io/v1","rv":RV,"start":KEY}``, KEY
being the storage key after the last item returned, relative to the list's key prefix. A
token whose resourceVersion was compacted away is answered 410 Expired, with a token that
continues (inconsistently) from the latest state; a token that cannot be decoded, 400.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tests.support.apiserver.errors import ApiError, JSONDict, bad_request
from tests.support.apiserver.selectors import Selector

_TOKEN_VERSION: Final = "meta.k8s.io/v1"
LATEST: Final = -1
"""The resourceVersion of a token that continues from the latest state (after a 410)."""

# storage.errors in k8s.io/apiserver: what a token that cannot be used is answered with.
_INVALID_KEY: Final = "continue key is not valid"
CONTINUE_EXPIRED: Final = (
    "The provided continue parameter is too old to display a consistent list result. You "
    "can start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


def encode_continue(start: str, resource_version: int) -> str:
    token = {"v": _TOKEN_VERSION, "rv": resource_version, "start": start}
    data = json.dumps(token, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode_continue(value: str) -> tuple[str, int]:
    """(start key relative to the list's prefix, resourceVersion); 400 when unusable."""
    try:
        if "=" in value:
            raise ValueError("illegal base64 data: padding")
        data = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
        token = json.loads(data)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"invalid continue token: {_INVALID_KEY}: {exc}") from None
    if not isinstance(token, dict) or token.get("v") != _TOKEN_VERSION:
        version = token.get("v") if isinstance(token, dict) else None
        raise bad_request(
            f"invalid continue token: {_INVALID_KEY}: server does not recognize this encoded "
            f"version {version}"
        )
    rv, start = token.get("rv"), token.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv == 0:
        raise bad_request(
            f"invalid continue token: {_INVALID_KEY}: incorrect encoded start resourceVersion "
            f"(version {_TOKEN_VERSION})"
        )
    if not isinstance(start, str) or not start:
        raise bad_request(
            f"invalid continue token: {_INVALID_KEY}: encoded start key empty "
            f"(version {_TOKEN_VERSION})"
        )
    # As the real server: a start key must not climb out of the list's key prefix.
    rooted = start if start.startswith("/") else "/" + start
    if posixpath.normpath(rooted) != rooted or "//" in rooted:
        raise bad_request(f"invalid continue token: {_INVALID_KEY}: invalid start key: {start}")
    return rooted[1:], rv


@dataclass(frozen=True)
class PageRequest:
    """What a list request asks of paging."""

    limit: int  # 0: every item
    start: str  # the first storage key (relative to the list's prefix) to answer from
    snapshot: int | None  # None: the current state, a first page; LATEST; else a past RV

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> PageRequest:
        raw_limit = query.get("limit", "")
        try:
            limit = int(raw_limit) if raw_limit else 0
        except ValueError:
            raise bad_request(f'strconv.ParseInt: parsing "{raw_limit}": invalid syntax') from None
        token = query.get("continue", "")
        resource_version = query.get("resourceVersion", "")
        if not token:
            # resourceVersion=0 is served from the watch cache, which ignores the limit.
            return cls(0 if resource_version == "0" else max(limit, 0), "", None)
        start, snapshot = decode_continue(token)
        if resource_version not in ("", "0"):
            raise bad_request("specifying resource version is not allowed when using continue")
        return cls(max(limit, 0), start, snapshot)


@dataclass(frozen=True)
class Page:
    items: list[JSONDict]
    continue_token: str | None
    remaining: int | None


def take_page(
    keys: Sequence[str],
    objects: Sequence[JSONDict],
    prefix: str,
    selector: Selector,
    request: PageRequest,
    resource_version: int,
) -> Page:
    """The page `request` asks for, of the (key-ordered) `keys`/`objects` at
    `resource_version`; `prefix` is the list's key prefix (``"ns/"`` for one namespace)."""
    lo = bisect.bisect_left(keys, prefix + request.start)
    # Past every key of the prefix: "ns0" follows every "ns/...".
    hi = bisect.bisect_left(keys, prefix[:-1] + chr(ord(prefix[-1]) + 1)) if prefix else len(keys)
    items: list[JSONDict] = []
    index = lo
    limit = request.limit
    while index < hi and (limit <= 0 or len(items) < limit):
        if selector.matches(objects[index]):
            items.append(objects[index])
        index += 1
    if limit <= 0 or index >= hi:
        return Page(items, None, None)
    # Continue right after the last key read, at the same snapshot.
    token = encode_continue(keys[index - 1][len(prefix) :] + "\x00", resource_version)
    remaining = hi - index if not selector.requirements else None
    return Page(items, token, remaining)


def expired(start: str) -> ApiError:
    """410 for a token whose snapshot was compacted, carrying a token that continues from
    the latest state (the real server's choice: the client may take an inconsistent list)."""
    return ApiError(
        410,
        "Expired",
        CONTINUE_EXPIRED,
        None,
        metadata={"continue": encode_continue(start, LATEST)},
    )
