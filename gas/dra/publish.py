"""The node's ResourceSlice on the API server: written on every start (the kubelet deletes
a node's slices when it starts, and a driver's when it stays away), and again whenever the
cards change.

The pool's generation moves only when the devices do: a start that finds the slice as it
should be leaves it alone, so consumers never see the pool incomplete for nothing. Slices
of this driver and node under another name (left by an older version, or a rename) are
deleted first, then the one slice is replaced with one generation more than the highest
seen, or created.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gas.core.model import SpecError, xe_link_groups
from gas.dra.driver import DRIVER
from gas.dra.slices import PciFacts, devices_differ, dropped_fields, resource_slice, slice_name
from gas.kubeapi.core import RawCoreV1Api
from gas.kubeapi.dra import RawResourceV1Api
from gas.node.cards import Card
from gas.node.kubeapi import API_TIMEOUT, read_node

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


class SlicePublisher:
    def __init__(self, core: RawCoreV1Api, resources: RawResourceV1Api, node: str) -> None:
        self.core = core
        self.resources = resources
        self.node = node
        self.generation = 0
        """The generation last published."""
        self._xe_link_problem = ""

    def _mine(self) -> list[dict[str, Any]]:
        selector = f"spec.driver={DRIVER},spec.nodeName={self.node}"
        listing = _read(
            self.resources.list_resource_slice(
                field_selector=selector, _request_timeout=API_TIMEOUT
            )
        )
        return [item for item in listing.get("items") or [] if isinstance(item, dict)]

    def publish(self, cards: Sequence[Card], facts: Mapping[str, PciFacts]) -> bool:
        """Bring the node's slice to `cards`; True when it is. API errors propagate (the
        card watcher retries with backoff)."""
        node = read_node(self.core, self.node)
        uid = str((node.get("metadata") or {}).get("uid") or "")
        groups = self._xe_link_groups(node, cards)
        existing = self._mine()
        highest = max((_generation(s) for s in existing), default=0)
        name = slice_name(self.node)
        for obsolete in existing:
            other = obsolete["metadata"]["name"]
            if other != name:
                log.info("deleting the obsolete ResourceSlice %s", other)
                self._drain(self.resources.delete_resource_slice(other))
        current = next((s for s in existing if s["metadata"]["name"] == name), None)
        desired = resource_slice(self.node, uid, cards, facts, highest, groups)
        if (
            current is not None
            and _generation(current) == highest
            and not devices_differ(current.get("spec") or {}, desired["spec"])
        ):
            self.generation = highest
            log.debug("ResourceSlice %s is up to date (generation %d)", name, highest)
            return True
        desired = resource_slice(self.node, uid, cards, facts, highest + 1, groups)
        if current is None:
            stored = _read(
                self.resources.create_resource_slice(desired, _request_timeout=API_TIMEOUT)
            )
            verb = "created"
        else:
            desired["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            stored = _read(
                self.resources.replace_resource_slice(name, desired, _request_timeout=API_TIMEOUT)
            )
            verb = "updated"
        dropped = dropped_fields(desired["spec"], stored.get("spec") or {})
        if dropped:
            log.error(
                "the API server dropped fields of ResourceSlice %s (%s): its feature gate "
                "DRAConsumableCapacity is probably off, and every card is exclusive until "
                "it is on (kube-apiserver, kube-scheduler and kubelet)",
                name,
                "; ".join(dropped),
            )
        self.generation = highest + 1
        log.info(
            "ResourceSlice %s %s: generation %d, %d device(s)",
            name,
            verb,
            self.generation,
            len(desired["spec"]["devices"]),
        )
        return True

    def _xe_link_groups(self, node: Mapping[str, Any], cards: Sequence[Card]) -> dict[str, int]:
        """The cards' Xe Link groups, from the node's label (written by the GPU labelling
        tools); none when the label is malformed, which is logged."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        try:
            return xe_link_groups(labels, [card.name for card in cards])
        except SpecError as exc:
            if str(exc) != self._xe_link_problem:
                log.warning("no Xe Link groups published for node %s: %s", self.node, exc)
            self._xe_link_problem = str(exc)
            return {}

    @staticmethod
    def _drain(response: Any) -> None:
        response.drain_conn()
        response.release_conn()
