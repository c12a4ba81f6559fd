"""Descheduling: node policy labels ask that the pods on some cards or tiles be moved.

gas labels the pods it placed on such a card or tile with
`gpu.aware.scheduling/deschedule-pod=gpu` for a descheduler to evict, and removes the label
once it no longer holds. The label is derived from the node's labels and the pod's
annotations, never remembered. `Descheduler` is the worker: watch callbacks feed its index
and queue, one thread sends the merge patches. What is labelled, and why: docs/descheduling.md.
"""

from __future__ import annotations

import collections
import heapq
import logging
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gas.core.holdings import TERMINAL_PHASES
from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    LABEL_DESCHEDULE_POD,
    NodeGpu,
    as_mapping,
    is_card_name,
)

log = logging.getLogger(__name__)

LABEL_VALUE = "gpu"

_TILE = re.compile(r"^gt(0|[1-9][0-9]{0,5})$")


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the decision needs of a pod gas placed, as the watch last showed it."""

    uid: str
    namespace: str
    name: str
    node: str
    cards: frozenset[str]
    tiles: frozenset[tuple[str, int]]
    label: str | None  # the current value of the deschedule label, None when absent
    terminal: bool = False
    deleting: bool = False


def pod_facts(pod: Mapping[str, Any]) -> PodFacts | None:
    """The facts of a pod gas placed; None for any other pod, which gas never touches."""
    metadata = as_mapping(pod.get("metadata"))
    uid = metadata.get("uid")
    node = as_mapping(pod.get("spec")).get("nodeName")
    annotations = as_mapping(metadata.get("annotations"))
    cards = annotations.get(ANNOTATION_CARDS)
    if not (isinstance(uid, str) and uid and isinstance(node, str) and node):
        return None
    if not isinstance(cards, str):
        return None
    tiles = annotations.get(ANNOTATION_TILES)
    label = as_mapping(metadata.get("labels")).get(LABEL_DESCHEDULE_POD)
    # One record per gas pod, tens of thousands of them: node names and namespaces are
    # interned (the ledger interns them too, so both hold one string each) and the card and
    # tile sets, which repeat across the pods, are shared.
    return PodFacts(
        uid=uid,
        namespace=sys.intern(str(metadata.get("namespace") or "")),
        name=str(metadata.get("name") or ""),
        node=sys.intern(node),
        cards=_shared(annotation_cards(cards)),
        tiles=_shared(annotation_tiles(tiles)) if isinstance(tiles, str) else _EMPTY,
        label=label if isinstance(label, str) else None,
        terminal=as_mapping(pod.get("status")).get("phase") in TERMINAL_PHASES,
        deleting=metadata.get("deletionTimestamp") is not None,
    )


# Since Python 3.10 every `frozenset()` is a new object: one for all the pods without tiles.
_EMPTY: frozenset[Any] = frozenset()

_SHARED_MAX = 4096
_shared_sets: dict[frozenset[Any], frozenset[Any]] = {}

_T = TypeVar("_T")


def _shared(found: frozenset[_T]) -> frozenset[_T]:
    """One object for each distinct (never changed) card or tile set. Pods on the same
    cards hold equal sets, and a node has few cards, so a few hundred sets serve them all;
    past the bound (a cluster of unusual card names) a set is simply not shared."""
    if not found:
        return _EMPTY
    kept = _shared_sets.get(found)
    if kept is not None:
        return kept
    if len(_shared_sets) < _SHARED_MAX:
        _shared_sets[found] = found
    return found


def annotation_cards(value: str) -> frozenset[str]:
    """Every card a `gas-container-cards` value names. Read leniently: an annotation the
    ledger cannot account still says which cards the pod runs on."""
    return frozenset(p for p in re.split(r"[|,]", value) if is_card_name(p))


def annotation_tiles(value: str) -> frozenset[tuple[str, int]]:
    """Every (card, tile) a `gas-container-tiles` value (`card0:gt0+gt1,card1:gt0|`) names."""
    found = set()
    for entry in re.split(r"[|,]", value):
        card, _, tiles = entry.partition(":")
        if not is_card_name(card):
            continue
        for tile in tiles.split("+"):
            match = _TILE.match(tile)
            if match is not None:
                found.add((card, int(match.group(1))))
    return frozenset(found)


def wants_label(node: NodeGpu | None, pod: PodFacts) -> bool | None:
    """Whether the pod should carry the deschedule label; None: leave it as it is.

    Left alone: terminal pods and pods being deleted (they are leaving anyway), and pods
    whose node is unknown or unreadable, since without the node's labels removing a label
    would be as much a guess as adding one.
    """
    if pod.terminal or pod.deleting:
        return None
    if node is None or node.name != pod.node or node.problem is not None:
        return None
    if pod.cards & node.descheduled:
        return True
    return any(tile in node.descheduled_tiles.get(card, ()) for card, tile in pod.tiles)


def label_patch(node: NodeGpu | None, pod: PodFacts) -> dict[str, Any] | None:
    """The JSON merge patch that brings the pod's label to what it should be, or None.

    The UID rides along as a guard: the API server refuses to change a UID, so a patch
    meant for a pod that was deleted and recreated under the same name fails (422)
    instead of labelling the newcomer.
    """
    wanted = wants_label(node, pod)
    if wanted is None:
        return None
    if wanted and pod.label != LABEL_VALUE:
        value: str | None = LABEL_VALUE
    elif not wanted and pod.label is not None:
        value = None
    else:
        return None
    return {"metadata": {"uid": pod.uid, "labels": {LABEL_DESCHEDULE_POD: value}}}


# ---------------------------------------------------------------- the worker


class PodGone(Exception):
    """The pod the patch was meant for no longer exists (404), or was replaced (422)."""


class PatchRejected(Exception):
    """The API server refused the patch for good (say 403): retrying would not help."""


PatchFn = Callable[[str, str, dict[str, Any]], None]
"""(namespace, name, merge patch); raises PodGone, PatchRejected, or anything else for a
failure worth retrying."""


class Descheduler(threading.Thread):
    """Keeps the deschedule label of gas's pods in step with their nodes' labels.

    Fed by the reflectors' callbacks, which only touch the index and the queue. The queue
    holds each pod UID at most once, so the work is bounded by the number of gas pods
    however many events arrive; a failed patch is retried with exponential backoff and,
    while it waits, further events for that pod do not jump the queue. With `gate`, only
    while this replica answers the scheduler: the others keep their index and queue warm
    and write nothing.
    """

    BASE_DELAY = 0.5
    MAX_DELAY = 60.0

    def __init__(self, patch: PatchFn, stop: threading.Event) -> None:
        super().__init__(name="descheduler", daemon=True)
        self._patch = patch
        self._stop_event = stop
        self._cond = threading.Condition()
        self._pods: dict[str, PodFacts] = {}
        self._by_node: dict[str, set[str]] = {}
        self._nodes: dict[str, NodeGpu] = {}
        self._ready: collections.deque[str] = collections.deque()
        self._queued: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._retries: list[tuple[float, str]] = []
        self._failures: dict[str, int] = {}
        self.patched = 0
        self.failed = 0
        self._active: Callable[[], bool] = lambda: True

    def gate(self, active: Callable[[], bool]) -> None:
        """Send patches only while `active()` (no I/O: asked with the queue's lock held).
        Replicas otherwise write the same labels twice; the queue waits meanwhile, and a
        pod whose label another replica set by then is found needing nothing."""
        self._active = active

    # ------------------------------------------------------------ feeding (any thread)

    def nodes_listed(self, nodes: Iterable[NodeGpu]) -> None:
        with self._cond:
            fresh = {node.name: node for node in nodes}
            for name in set(self._nodes) | set(fresh):
                self._set_node_locked(name, fresh.get(name))

    def node_changed(self, node: NodeGpu) -> None:
        with self._cond:
            self._set_node_locked(node.name, node)

    def node_removed(self, name: str) -> None:
        with self._cond:
            self._nodes.pop(name, None)

    def pods_listed(self, listed: Iterable[PodFacts]) -> None:
        """A full pod list, as `pod_facts` of its pods (those gas placed): the list is read
        in pages, and each page's pods are reduced to their facts before the next is read."""
        facts = list(listed)
        with self._cond:
            self._pods.clear()
            self._by_node.clear()
            for fact in facts:
                self._put_pod_locked(fact)
            for fact in facts:
                self._consider_locked(fact)

    def pod_changed(self, pod: Mapping[str, Any]) -> None:
        fact = pod_facts(pod)
        uid = as_mapping(pod.get("metadata")).get("uid")
        with self._cond:
            if isinstance(uid, str):
                self._drop_pod_locked(uid)
            if fact is not None:
                self._put_pod_locked(fact)
                self._consider_locked(fact)

    def pod_removed(self, pod: Mapping[str, Any]) -> None:
        uid = as_mapping(pod.get("metadata")).get("uid")
        if isinstance(uid, str):
            with self._cond:
                self._drop_pod_locked(uid)
                self._failures.pop(uid, None)
                self._retry_at.pop(uid, None)

    def pending(self) -> int:
        with self._cond:
            return len(self._ready) + len(self._retry_at)

    def facts(self) -> dict[str, PodFacts]:
        """The pods gas placed, by UID, as the controller last saw them."""
        with self._cond:
            return dict(self._pods)

    # ------------------------------------------------------------ index (lock held)

    def _set_node_locked(self, name: str, node: NodeGpu | None) -> None:
        old = self._nodes.get(name)
        if node is None:
            self._nodes.pop(name, None)
            return
        self._nodes[name] = node
        # Node objects change every few seconds (status, heartbeats); only a change of
        # what decides the label is worth looking at the node's pods again.
        if old is not None and _deschedule_view(old) == _deschedule_view(node):
            return
        for uid in self._by_node.get(name, ()):
            self._consider_locked(self._pods[uid])

    def _put_pod_locked(self, fact: PodFacts) -> None:
        self._pods[fact.uid] = fact
        self._by_node.setdefault(fact.node, set()).add(fact.uid)

    def _drop_pod_locked(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            on_node = self._by_node.get(old.node)
            if on_node is not None:
                on_node.discard(uid)
                if not on_node:
                    del self._by_node[old.node]

    def _consider_locked(self, fact: PodFacts) -> None:
        if label_patch(self._nodes.get(fact.node), fact) is None:
            return
        if fact.uid in self._queued or fact.uid in self._retry_at:
            return
        self._queued.add(fact.uid)
        self._ready.append(fact.uid)
        self._cond.notify()

    # ------------------------------------------------------------ the worker thread

    def run(self) -> None:
        while not self._stop_event.is_set():
            uid = self._next(timeout=0.5)
            if uid is not None:
                self._process(uid)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _next(self, timeout: float) -> str | None:
        with self._cond:
            deadline = time.monotonic() + timeout
            while not self._stop_event.is_set():
                now = time.monotonic()
                while self._retries and self._retries[0][0] <= now:
                    due, uid = heapq.heappop(self._retries)
                    if self._retry_at.get(uid) == due:
                        del self._retry_at[uid]
                        self._queued.add(uid)
                        self._ready.append(uid)
                if self._ready and self._active():
                    uid = self._ready.popleft()
                    self._queued.discard(uid)
                    return uid
                if now >= deadline:
                    return None
                wait = deadline - now
                if self._retries:
                    wait = min(wait, self._retries[0][0] - now)
                self._cond.wait(max(wait, 0.001))
            return None

    def _process(self, uid: str) -> None:
        with self._cond:
            fact = self._pods.get(uid)
            patch = label_patch(self._nodes.get(fact.node), fact) if fact else None
        if fact is None or patch is None:
            with self._cond:
                self._failures.pop(uid, None)
            return
        where = f"{fact.namespace}/{fact.name} (uid {uid})"
        value = patch["metadata"]["labels"][LABEL_DESCHEDULE_POD]
        try:
            self._patch(fact.namespace, fact.name, patch)
        except PodGone as exc:
            log.info("deschedule label of pod %s not changed: pod gone (%s)", where, exc)
            with self._cond:
                self._failures.pop(uid, None)
            return
        except PatchRejected as exc:
            self.failed += 1
            log.warning("deschedule label of pod %s not changed: %s", where, exc)
            with self._cond:
                self._failures.pop(uid, None)
            return
        except Exception as exc:
            self.failed += 1
            self._schedule_retry(uid, where, exc)
            return
        self.patched += 1
        log.info(
            "pod %s on node %s: %s %s",
            where,
            fact.node,
            "labelled" if value else "unlabelled",
            f"{LABEL_DESCHEDULE_POD}={value}" if value else LABEL_DESCHEDULE_POD,
        )
        # The patch's answer is not taken into the index: a watch event newer than it may
        # already be there, and resourceVersions may not be compared. Until the watch
        # shows the change, a further event for the pod may cost one idempotent patch.
        with self._cond:
            self._failures.pop(uid, None)

    def _schedule_retry(self, uid: str, where: str, exc: Exception) -> None:
        with self._cond:
            failures = self._failures.get(uid, 0) + 1
            self._failures[uid] = failures
            delay = min(self.BASE_DELAY * 2 ** (failures - 1), self.MAX_DELAY)
            delay *= random.uniform(0.8, 1.2)
            due = time.monotonic() + delay
            self._retry_at[uid] = due
            heapq.heappush(self._retries, (due, uid))
            self._cond.notify()
        log.warning(
            "deschedule label of pod %s not changed (%s); retry %d in %.1fs",
            where,
            exc,
            failures,
            delay,
        )


def _deschedule_view(node: NodeGpu) -> tuple[object, ...]:
    return (node.problem, node.descheduled, sorted(node.descheduled_tiles.items()))
