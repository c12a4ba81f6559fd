"""A few objects kept current by list and watch, as client-go's reflector keeps them: list,
watch from the list's resourceVersion, resume from the last version seen when a watch
ends, list again on 410 Gone, back off on errors. For the handful of objects an agent
follows about its own node (its Node, its ResourceSlices), read in one request each time.

`on_change()` is called after every list and every event, outside the lock, from the
reflector's thread; `objects()` gives what is known now, and `synced` says whether a list
has been read since the start.
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
BASE_DELAY = 0.5
MAX_DELAY = 30.0

ListCall = Callable[..., BaseHTTPResponse]
"""A client method that lists (`list_node`, `list_resource_slice`), taking ListOptions."""


class _Expired(Exception):
    pass


class Reflector(threading.Thread):
    def __init__(
        self,
        name: str,
        call: ListCall,
        options: ListOptions,
        stop: threading.Event,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name=f"follow-{name}", daemon=True)
        self.what = name
        self._call = call
        self._options = options
        self._stop_event = stop
        self._on_change = on_change
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}
        self._version: str | None = None
        self._synced = threading.Event()
        self.lists = 0
        self.watches = 0

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def objects(self) -> dict[str, dict[str, Any]]:
        """Name -> object, as last listed or watched."""
        with self._lock:
            return dict(self._objects)

    def run(self) -> None:
        delay = BASE_DELAY
        while not self._stop_event.is_set():
            try:
                if self._version is None:
                    self._list()
                self._watch()
                delay = BASE_DELAY
            except _Expired:
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

    def _list(self) -> None:
        response = self._call(**self._options, _request_timeout=LIST_TIMEOUT)
        body = orjson.loads(response.data)
        items = [item for item in body.get("items") or [] if isinstance(item, dict)]
        with self._lock:
            self._objects = {_name(item): item for item in items}
        self._version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        self.lists += 1
        self._synced.set()
        self._on_change()

    def _events(self) -> Iterator[Mapping[str, Any]]:
        seconds = random.randint(*WATCH_SECONDS)
        try:
            response = self._call(
                **self._options,
                watch=True,
                resource_version=self._version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _request_timeout=(5.0, seconds + 30.0),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise _Expired() from None
            raise
        self.watches += 1
        try:
            for line in response:
                line = line.strip()
                if line:
                    yield orjson.loads(line)
        finally:
            response.release_conn()

    def _watch(self) -> None:
        for event in self._events():
            if self._stop_event.is_set():
                return
            kind = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Expired()
                raise RuntimeError(f"watch error: {obj.get('message')}")
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self._version = str(version)
            if kind == "BOOKMARK":
                continue
            with self._lock:
                if kind in ("ADDED", "MODIFIED"):
                    self._objects[_name(obj)] = obj
                elif kind == "DELETED":
                    self._objects.pop(_name(obj), None)
            self._on_change()


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
