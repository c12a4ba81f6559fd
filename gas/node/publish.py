"""Keeping a node's labels and GPU capacity true to its cards.

`NodePublisher.publish(cards)` reads the node once, then writes what differs: its labels
(`gas.host.labels.labels_for`, one merge patch of the node) and its capacity
(`gas.node.capacity.capacity_for`, one merge patch of `nodes/<name>/status`). It is the
`on_change` of a `gas.host.watch.CardWatcher`, which calls it again after a failure.

gas divides the node's allocatable by the number of cards in its labels, so the two writes
are ordered to never make a card look bigger than it is:

- cards added (or as many as before): labels first, then capacity. Until the kubelet
  copies the new capacity into allocatable, gas sees the old total over more cards.
- cards removed: capacity first, and the labels only once allocatable has come down to the
  new totals (the kubelet's next status update, seconds later), or after `allocatable_wait`
  seconds if it never does. Until then gas sees the smaller total over the old cards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gas.core.model import SpecError, node_cards
from gas.host.cards import Card
from gas.host.kubeapi import describe_api_error, read_node
from gas.host.labels import (
    NODE_EXACT_LABELS,
    label_changes,
    labels_for,
    labels_of,
    managed_bases,
    patch_labels,
)
from gas.node.capacity import (
    CAPACITY_KEYS,
    allocatable_of,
    amount,
    capacity_changes,
    capacity_for,
    capacity_of,
    patch_capacity,
)

log = logging.getLogger(__name__)

ALLOCATABLE_WAIT = 60.0


def _labelled_cards(labels: Mapping[str, str]) -> int:
    try:
        return len(node_cards(labels))
    except SpecError:
        return 0


def allocatable_followed(node: Mapping[str, Any], desired: Mapping[str, str]) -> bool:
    """Whether the node's allocatable is no more than the `desired` capacity in every owned
    key (a key absent from either side counts as 0)."""
    allocatable = allocatable_of(node)
    for key in CAPACITY_KEYS:
        has = amount(allocatable.get(key, "0"))
        want = amount(desired.get(key, "0"))
        if has is None or want is None or has > want:
            return False
    return True


@dataclass
class NodePublisher:
    """Writes one node's labels and capacity (see the module's docstring); `clock` and
    `allocatable_wait` bound the wait for the kubelet after cards are removed."""

    api: Any
    node: str
    numa: bool = False
    allocatable_wait: float = ALLOCATABLE_WAIT
    clock: Callable[[], float] = time.monotonic
    _waiting_since: float | None = field(default=None, init=False, repr=False)

    def publish(self, cards: Sequence[Card]) -> bool:
        """Write the node's labels and capacity for `cards`; False (after logging why) when
        it failed or must wait for the kubelet, so the caller tries again later."""
        labels = labels_for(cards, self.numa)
        capacity = capacity_for(cards)
        try:
            node = read_node(self.api, self.node)
            current = labels_of(node)
            label_patch = label_changes(
                current, labels, managed_bases(self.numa), NODE_EXACT_LABELS
            )
            capacity_patch = capacity_changes(capacity_of(node), capacity)
            if len(cards) >= _labelled_cards(current):
                self._labels(label_patch)
                self._capacity(capacity_patch)
            else:
                self._capacity(capacity_patch)
                if label_patch and not self._may_relabel(node, capacity):
                    return False
                self._labels(label_patch)
        except Exception as exc:  # any client, transport or decoding failure
            log.error("%s", describe_api_error(exc, self.node))
            return False
        self._waiting_since = None
        return True

    def _may_relabel(self, node: Mapping[str, Any], capacity: Mapping[str, str]) -> bool:
        if allocatable_followed(node, capacity):
            return True
        now = self.clock()
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since >= self.allocatable_wait:
            log.warning(
                "node %s: allocatable still above the new capacity after %.0f s (is the "
                "kubelet updating the node's status?): relabelling anyway",
                self.node,
                self.allocatable_wait,
            )
            return True
        log.info(
            "node %s: cards removed; the labels follow once the kubelet has brought "
            "allocatable down to the new capacity",
            self.node,
        )
        return False

    def _labels(self, changes: Mapping[str, str | None]) -> None:
        patch_labels(self.api, self.node, changes)
        _log_changes(self.node, "labels", changes)

    def _capacity(self, changes: Mapping[str, str | None]) -> None:
        patch_capacity(self.api, self.node, changes)
        _log_changes(self.node, "capacity", changes)


def _log_changes(node: str, what: str, changes: Mapping[str, str | None]) -> None:
    written = ", ".join(f"{k}={v}" for k, v in changes.items() if v is not None)
    removed = ", ".join(k for k, v in changes.items() if v is None)
    if written:
        log.info("node %s: %s set %s", node, what, written)
    if removed:
        log.info("node %s: %s removed %s", node, what, removed)
