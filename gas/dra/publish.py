"""The node's ResourceSlice on the API server: written on every start (the kubelet deletes
a node's slices when it starts, and a driver's when it stays away), and again whenever the
cards, their health, the claims sharing them or the node's labels change.

The pool's generation moves only when the devices do: a start that finds the slice as it
should be leaves it alone, so consumers never see the pool incomplete for nothing. Slices
of this driver and node under another name (left by an older version, or a rename) are
deleted first, then the one slice is replaced with one generation more than the highest
seen, or created.

What the API server has is read from the agent's watches of its Node and its slices
(`View`); before they have listed, or when a check must not trust them, it is read
directly (one node GET, one slice LIST).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gas.dra.driver import DRIVER
from gas.dra.slices import (
    CardState,
    PciFacts,
    devices_differ,
    dropped_fields,
    keep_taint_times,
    published,
    resource_slice,
    slice_name,
)
from gas.host.kubeapi import API_TIMEOUT, read_node
from gas.kubeapi.core import RawCoreV1Api
from gas.kubeapi.dra import RawResourceV1Api

log = logging.getLogger(__name__)


def _read(response: Any) -> dict[str, Any]:
    obj = json.loads(response.data)
    if not isinstance(obj, dict):
        raise ValueError("the API server sent no object")
    return obj


def _generation(obj: Mapping[str, Any]) -> int:
    pool = (obj.get("spec") or {}).get("pool") or {}
    value = pool.get("generation")
    return value if isinstance(value, int) else 0


@dataclass(frozen=True)
class View:
    """The Node and this driver's slices of it, as the API server has them."""

    node: Mapping[str, Any]
    slices: Sequence[Mapping[str, Any]]


ViewSource = Callable[[], View | None]
"""What the watches know (None until both have listed)."""


class SlicePublisher:
    def __init__(
        self,
        core: RawCoreV1Api,
        resources: RawResourceV1Api,
        node: str,
        effect: str = "NoExecute",
        watched: ViewSource = lambda: None,
    ) -> None:
        self.core = core
        self.resources = resources
        self.node = node
        self.effect = effect
        self.watched = watched
        self.generation = 0
        """The generation last published."""
        self.writes = 0
        self._notes: list[str] = []

    def read_view(self) -> View:
        """The Node and the slices, read directly."""
        node = read_node(self.core, self.node)
        selector = f"spec.driver={DRIVER},spec.nodeName={self.node}"
        listing = _read(
            self.resources.list_resource_slice(
                field_selector=selector, _request_timeout=API_TIMEOUT
            )
        )
        slices = [item for item in listing.get("items") or [] if isinstance(item, dict)]
        return View(node, slices)

    def publish(
        self,
        states: Sequence[CardState],
        facts: Mapping[str, PciFacts],
        direct: bool = False,
    ) -> bool:
        """Bring the node's slice to `states`; True when it is. The watches' view is used
        unless `direct` (or they have not listed yet). API errors propagate."""
        view = None if direct else self.watched()
        if view is None:
            view = self.read_view()
        metadata = view.node.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        devices, notes = published(states, facts, metadata.get("labels") or {})
        self._log_notes(notes)
        existing = [s for s in view.slices if isinstance(s.get("metadata"), Mapping)]
        highest = max((_generation(s) for s in existing), default=0)
        name = slice_name(self.node)
        for obsolete in existing:
            other = obsolete["metadata"]["name"]
            if other != name:
                log.info("deleting the obsolete ResourceSlice %s", other)
                self._drain(self.resources.delete_resource_slice(other))
        current = next((s for s in existing if s["metadata"]["name"] == name), None)
        desired = resource_slice(self.node, uid, devices, highest, self.effect)
        if (
            current is not None
            and _generation(current) == highest
            and not devices_differ(current.get("spec") or {}, desired["spec"])
            and _owner_uid(current) == uid
        ):
            self.generation = highest
            log.debug("ResourceSlice %s is up to date (generation %d)", name, highest)
            return True
        desired = resource_slice(self.node, uid, devices, highest + 1, self.effect)
        if current is None:
            stored = _read(
                self.resources.create_resource_slice(desired, _request_timeout=API_TIMEOUT)
            )
            verb = "created"
        else:
            keep_taint_times(desired["spec"], current.get("spec") or {})
            desired["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            stored = _read(
                self.resources.replace_resource_slice(name, desired, _request_timeout=API_TIMEOUT)
            )
            verb = "updated"
        self.writes += 1
        dropped = dropped_fields(desired["spec"], stored.get("spec") or {})
        if dropped:
            log.error(
                "the API server dropped fields of ResourceSlice %s (%s): its feature gates "
                "DRAConsumableCapacity (sharing) or DRADeviceTaints (taints) are probably "
                "off; every card is exclusive, or untainted, until they are on "
                "(kube-apiserver, kube-scheduler and kubelet)",
                name,
                "; ".join(dropped),
            )
        self.generation = highest + 1
        tainted = [d["name"] for d in desired["spec"]["devices"] if d.get("taints")]
        log.info(
            "ResourceSlice %s %s: generation %d, %d device(s)%s",
            name,
            verb,
            self.generation,
            len(desired["spec"]["devices"]),
            f", tainted: {', '.join(tainted)}" if tainted else "",
        )
        return True

    def _log_notes(self, notes: list[str]) -> None:
        """Each note once, until it changes."""
        if notes != self._notes:
            for note in notes:
                log.warning("node %s: %s", self.node, note)
        self._notes = notes

    @staticmethod
    def _drain(response: Any) -> None:
        response.drain_conn()
        response.release_conn()


def _owner_uid(obj: Mapping[str, Any]) -> str:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return str(owners[0].get("uid") or "") if owners else ""
