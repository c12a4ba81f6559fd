"""The pods bound to this node, kept current by a list+watch (field selector
`spec.nodeName=<node>`, `gas.kubeapi.reflector`), as records the identification reads.

`refresh()` and `fetch()` are direct reads for the moments the watch may lag: the kubelet
learns of a pod from its own watch, which can run ahead of this one. Beside each record it
keeps the pod's containers by runtime id, with their shares (`gas.host.containers`), for
the reading of their GPU use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from gas.core.model import as_mapping
from gas.host.containers import Holder, holders
from gas.kubeapi.reflector import Reflector
from gas.node.identify import PodRecord, pod_record
from gas.node.podapi import NodeApi


class PodCache(Reflector):
    def __init__(
        self,
        api: NodeApi,
        stop: threading.Event,
        on_removed: Callable[[str], None] = lambda uid: None,
    ) -> None:
        super().__init__(f"pods on {api.node}", api.list_pods, api.watch_pods, stop)
        self._api = api
        self._on_removed = on_removed
        self._lock = threading.Lock()
        self._pods: dict[str, PodRecord] = {}
        self._holders: dict[str, dict[str, Holder]] = {}

    # ------------------------------------------------------------ reads

    def pods(self) -> list[PodRecord]:
        with self._lock:
            return list(self._pods.values())

    def get(self, uid: str) -> PodRecord | None:
        with self._lock:
            return self._pods.get(uid)

    def holder(self, pod_uid: str, container_id: str) -> Holder | None:
        """The container of this runtime id in the pod of this UID, with its shares."""
        with self._lock:
            return self._holders.get(pod_uid, {}).get(container_id)

    def refresh(self) -> None:
        """List afresh now (the watch goes on from where it was)."""
        items, _ = self._api.list_pods()
        self.replace(items)

    def fetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Read the named pods directly (pods the kubelet lists that the watch has not
        delivered yet); one that is no longer there is skipped."""
        for namespace, name in keys:
            obj = self._api.get_pod(namespace, name)
            if obj is not None and as_mapping(obj.get("spec")).get("nodeName") == self._api.node:
                self._put(obj)

    # ------------------------------------------------------------ what the reflector finds

    def replace(self, items: list[dict[str, Any]]) -> None:
        pairs = [(r, item) for r, item in ((pod_record(item), item) for item in items) if r]
        with self._lock:
            gone = set(self._pods) - {r.uid for r, _ in pairs}
            self._pods = {r.uid: r for r, _ in pairs}
            self._holders = {r.uid: holders(item, extender=True) for r, item in pairs}
        for uid in gone:
            self._on_removed(uid)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            uid = as_mapping(obj.get("metadata")).get("uid")
            if isinstance(uid, str):
                self._remove(uid)
        else:
            self._put(obj)

    def _put(self, obj: dict[str, Any]) -> None:
        record = pod_record(obj)
        if record is not None:
            with self._lock:
                self._pods[record.uid] = record
                self._holders[record.uid] = holders(obj, extender=True)

    def _remove(self, uid: str) -> None:
        with self._lock:
            found = self._pods.pop(uid, None)
            self._holders.pop(uid, None)
        if found is not None:
            self._on_removed(uid)
