"""Objects kept current by list and watch, as client-go's reflector keeps them: list, watch
from the list's resourceVersion, resume from the last version seen when a watch ends,
list again on 410 Gone, back off on errors. For the few objects a node agent follows
about its own node (its pods, its Node, its ResourceSlices), each list read in one
request.

`Reflector` is the loop; what is kept of the objects is its subclass's (`replace` after a
list, `apply` for each event). `Objects` keeps them as the API server sends them, by
name. `on_change()` is called after every list and every event, from the reflector's
thread, outside any lock.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException
from urllib3 import BaseHTTPResponse

from gas.kubeapi.core import ListOptions, Timeout, status_message

log = logging.getLogger(__name__)

WATCH_SECONDS = (300, 600)
"""Each watch asks the API server to end it after a time drawn from this range, as
client-go's do, so that the watches of many agents do not all end at once."""
LIST_TIMEOUT: Timeout = (5.0, 60.0)
BASE_DELAY = 0.2
MAX_DELAY = 8.0

Listing = tuple[list[dict[str, Any]], str]
"""The objects of a list and its resourceVersion."""
ListCall = Callable[..., BaseHTTPResponse]
"""A client method that lists (`list_node`, `list_resource_slice`), taking ListOptions."""


class Expired(Exception):
    """The version to watch from is gone (410): list again."""


def list_and_watch(
    call: ListCall, options: ListOptions
) -> tuple[Callable[[], Listing], Callable[[str], Iterator[dict[str, Any]]]]:
    """The two calls of a reflector, made with one client list method and its options."""

    def listing() -> Listing:
        response = call(**options, _request_timeout=LIST_TIMEOUT)
        body = orjson.loads(response.data)
        items = [item for item in body.get("items") or [] if isinstance(item, dict)]
        return items, str((body.get("metadata") or {}).get("resourceVersion") or "")

    def watch(version: str) -> Iterator[dict[str, Any]]:
        seconds = random.randint(*WATCH_SECONDS)
        try:
            response = call(
                **options,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _request_timeout=(5.0, seconds + 30.0),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise Expired() from None
            raise
        try:
            for line in response:
                line = line.strip()
                if line:
                    yield orjson.loads(line)
        finally:
            response.release_conn()

    return listing, watch


class Reflector(threading.Thread):
    def __init__(
        self,
        name: str,
        listing: Callable[[], Listing],
        watch: Callable[[str], Iterator[Mapping[str, Any]]],
        stop: threading.Event,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name=f"follow-{name}", daemon=True)
        self.what = name
        self._listing = listing
        self._watch_from = watch
        self._stop_event = stop
        self._on_change = on_change
        self._version: str | None = None
        self._synced = threading.Event()
        self.lists = 0

    # ------------------------------------------------------------ kept by the subclass

    def replace(self, items: list[dict[str, Any]]) -> None:
        """What a list found: everything there is."""

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (`ADDED`, `MODIFIED`, `DELETED`)."""

    # ------------------------------------------------------------ the loop

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def run(self) -> None:
        delay = BASE_DELAY
        while not self._stop_event.is_set():
            try:
                if self._version is None:
                    items, version = self._listing()
                    self._version = version or None
                    self.replace(items)
                    self.lists += 1
                    self._synced.set()
                    log.info("listed %d %s", len(items), self.what)
                    self._on_change()
                self._follow()
                delay = BASE_DELAY
            except Expired:
                self._version = None
                continue
            except Exception as exc:
                if self._stop_event.is_set():
                    break
                why = (
                    status_message(exc.status, exc.reason, exc.body)
                    if isinstance(exc, ApiException)
                    else str(exc)
                )
                log.warning("following %s failed (%s); retrying in %.1fs", self.what, why, delay)
                self._stop_event.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, MAX_DELAY)
                continue
            # A watch ended as the API server meant it to: resume soon, not all at once.
            self._stop_event.wait(BASE_DELAY * random.uniform(0.5, 1.0))

    def _follow(self) -> None:
        assert self._version is not None
        for event in self._watch_from(self._version):
            if self._stop_event.is_set():
                return
            kind = str(event.get("type"))
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired()
                raise RuntimeError(f"watch error: {obj.get('message')}")
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self._version = str(version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.apply(kind, obj)
                self._on_change()


class Objects(Reflector):
    """The objects as the API server sends them, by name."""

    def __init__(
        self,
        name: str,
        call: ListCall,
        options: ListOptions,
        stop: threading.Event,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        listing, watch = list_and_watch(call, options)
        super().__init__(name, listing, watch, stop, on_change)
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}

    def objects(self) -> dict[str, dict[str, Any]]:
        """Name -> object, as last listed or watched."""
        with self._lock:
            return dict(self._objects)

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._objects = {_name(item): item for item in items}

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(_name(obj), None)
            else:
                self._objects[_name(obj)] = obj


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
