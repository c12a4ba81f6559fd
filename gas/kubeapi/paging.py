"""A list read in pages (`limit` and `continue`), as client-go's reflector reads it: the one
paging loop of the extender's reflectors and of `gas inspect`.

Every page is answered at the first page's resourceVersion, so the pages make the snapshot
one request would have answered. When that snapshot is compacted away mid-list, the API
server answers the next page 410 Expired; the rest is then only to be had from a later
state, with no resourceVersion telling where the pages stand, so the list starts over from
its first page. After two expiries in a row it is read in one request, which no compaction
can cut short (the memory of the whole list once, rather than no list at all).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from gas.kubeapi.core import Timeout, status_message

PAGE_SIZE = 500
"""Objects per page, client-go's reflector's: 0 reads a list in one request."""
WHOLE_AFTER = 2
"""Expiries in a row after which the list is read in one request."""


@dataclass(slots=True)
class Page:
    """One page of a list: its items, handed over for the caller to keep what it needs of
    them, since the next page is read only once the caller asks for it."""

    items: list[Any]
    version: str | None
    """The list's resourceVersion: its first page's, at which every page was read (None
    when the API server gave none)."""
    first: bool
    """The first page of a list (re)started: whatever came before it is to be dropped."""
    started: float
    """`time.monotonic()` when this list's first request was sent."""


@dataclass(slots=True, frozen=True)
class ListRestart:
    """A list whose continue token expired, about to start over."""

    pages: int
    """Pages read before the expired one."""
    message: str
    """The API server's words for the 410."""
    expired: int
    """Expiries in a row, this one included."""

    @property
    def whole(self) -> bool:
        """The list is read again in one request."""
        return self.expired >= WHOLE_AFTER

    def __str__(self) -> str:
        return (
            f"list expired with {self.pages} of its pages read ({self.message}); listing "
            f"again from the start{' in one request' if self.whole else ''}"
        )


class NotAList(Exception):
    """A page's answer was no JSON object."""


def list_pages(
    call: Callable[..., Any],
    *,
    field_selector: str | None = None,
    page_size: int = PAGE_SIZE,
    timeout: Timeout = None,
    on_restart: Callable[[ListRestart], None] | None = None,
) -> Iterator[Page]:
    """The pages of one list made by `call` (a list method of `RawCoreV1Api`), started over
    whenever a continue token expires (`on_restart` told first) until one list is read to
    its end.

    An error other than an expired continue token is raised as it came (the client's
    `ApiException` among them); an answer that is no object, as `NotAList`.
    """
    expired = 0
    while True:
        try:
            size = 0 if expired >= WHOLE_AFTER else page_size
            yield from _one_list(call, field_selector, size, timeout)
            return
        except _ContinueExpired as exc:
            expired += 1
            if on_restart is not None:
                on_restart(ListRestart(exc.pages, exc.message, expired))


def _one_list(
    call: Callable[..., Any], field_selector: str | None, size: int, timeout: Timeout
) -> Iterator[Page]:
    started = time.monotonic()
    version: str | None = None
    token: str | None = None
    pages = 0
    while True:
        options: dict[str, Any] = {}
        if field_selector is not None:
            options["field_selector"] = field_selector
        if size > 0:
            options["limit"] = size
        if token:
            options["_continue"] = token
        try:
            response = call(_request_timeout=timeout, **options)
        except ApiException as exc:
            if token and exc.status == 410:
                message = status_message(exc.status, exc.reason, exc.body)
                raise _ContinueExpired(message, pages) from exc
            raise
        body = orjson.loads(response.data)
        if not isinstance(body, dict):
            raise NotAList("the API server answered no object")
        metadata = body.get("metadata") or {}
        if not pages and metadata.get("resourceVersion") is not None:
            version = str(metadata["resourceVersion"])
        token = metadata.get("continue")
        # The answer goes before the page is handed over and its items as soon as the
        # caller asks for the next: only what the caller kept of a page stays while the
        # next is read.
        items = body.pop("items", None) or []
        del body, metadata
        yield Page(items, version, not pages, started)
        del items
        pages += 1
        if not token:
            return


class _ContinueExpired(Exception):
    def __init__(self, message: str, pages: int) -> None:
        super().__init__(message)
        self.message = message
        self.pages = pages
