"""The pods bound to this node, kept current by a list+watch (field selector
`spec.nodeName=<node>`), as records the identification reads.

Like client-go's reflector: list, watch from the list's resourceVersion, resume from the
last version seen when a watch ends, relist on 410 Gone, back off on errors. `refresh()`
and `fetch()` are direct reads for the moments the watch may lag: the kubelet learns of a
pod from its own watch, which can run ahead of this one.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable
from typing import Any

from gas.core.model import as_mapping
from gas.node.identify import PodRecord, pod_record
from gas.node.podapi import NodeApi

log = logging.getLogger(__name__)


class _Expired(Exception):
    pass


class PodCache(threading.Thread):
    BASE_DELAY = 0.2
    MAX_DELAY = 8.0

    def __init__(
        self,
        api: NodeApi,
        stop: threading.Event,
        on_removed: Callable[[str], None] = lambda uid: None,
    ) -> None:
        super().__init__(name="pod-cache", daemon=True)
        self._api = api
        self._stop_event = stop
        self._on_removed = on_removed
        self._lock = threading.Lock()
        self._pods: dict[str, PodRecord] = {}
        self._synced = threading.Event()
        self._version: str | None = None
        self.lists = 0

    # ------------------------------------------------------------ reads

    def pods(self) -> list[PodRecord]:
        with self._lock:
            return list(self._pods.values())

    def get(self, uid: str) -> PodRecord | None:
        with self._lock:
            return self._pods.get(uid)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def refresh(self) -> None:
        """List afresh now (the watch goes on from where it was)."""
        items, _ = self._api.list_pods()
        self._replace(items)

    def fetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Read the named pods directly (pods the kubelet lists that the watch has not
        delivered yet); one that is no longer there is skipped."""
        for namespace, name in keys:
            obj = self._api.get_pod(namespace, name)
            if obj is not None and as_mapping(obj.get("spec")).get("nodeName") == self._api.node:
                self._put(obj)

    # ------------------------------------------------------------ the reflector

    def run(self) -> None:
        delay = self.BASE_DELAY
        while not self._stop_event.is_set():
            try:
                if self._version is None:
                    items, self._version = self._api.list_pods()
                    self._replace(items)
                    self.lists += 1
                    self._synced.set()
                    log.info("listed %d pods on %s", len(items), self._api.node)
                self._watch()
                delay = self.BASE_DELAY
            except _Expired:
                self._version = None
                continue
            except Exception as exc:
                if self._stop_event.is_set():
                    break
                log.warning("pod sync failed (%s); retrying in %.1fs", exc, delay)
                self._stop_event.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.MAX_DELAY)
                continue
            self._stop_event.wait(self.BASE_DELAY * random.uniform(0.5, 1.0))

    def _watch(self) -> None:
        assert self._version is not None
        for event in self._api.watch_pods(self._version):
            if self._stop_event.is_set():
                return
            kind = event.get("type")
            obj = as_mapping(event.get("object"))
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Expired()
                raise RuntimeError(f"watch error: {obj.get('message')}")
            if kind in ("ADDED", "MODIFIED"):
                self._put(dict(obj))
            elif kind == "DELETED":
                uid = as_mapping(obj.get("metadata")).get("uid")
                if isinstance(uid, str):
                    self._remove(uid)
            version = as_mapping(obj.get("metadata")).get("resourceVersion")
            if version:
                self._version = str(version)

    def _put(self, obj: dict[str, Any]) -> None:
        record = pod_record(obj)
        if record is not None:
            with self._lock:
                self._pods[record.uid] = record

    def _remove(self, uid: str) -> None:
        with self._lock:
            found = self._pods.pop(uid, None)
        if found is not None:
            self._on_removed(uid)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        records = [r for r in (pod_record(item) for item in items) if r is not None]
        with self._lock:
            gone = set(self._pods) - {r.uid for r in records}
            self._pods = {r.uid: r for r in records}
        for uid in gone:
            self._on_removed(uid)
