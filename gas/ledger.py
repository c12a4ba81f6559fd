"""The ledger: which pod holds what on which card, and the nodes' capacities.

The API server is the source of truth; the ledger is a cache rebuilt from it. Entries are
keyed by pod UID and come in three states:

- RESERVED: a bind chose cards and its Binding write is in flight.
- PENDING: the bind's write succeeded, or its outcome is unknown (timeout, 5xx), and the
  watch has not yet shown the pod bound. Kept so the cards are not handed out twice in the
  window before the watch catches up; cleared by the watch or a relist.
- BOUND: the cluster shows the pod on a node with a `gas-container-cards` annotation.

Over-counting is safe, under-counting is not: an entry only goes away when the cluster
shows the pod terminal or deleted, when a definitive API rejection cancels a reservation,
or when a relist started after the bind shows the pod not bound by gas.

One lock guards everything; nothing under it does I/O or parsing.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gas.allocator import Placement, Policy, Rejection, place
from gas.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    Allocation,
    NodeGpu,
    PodRequest,
    SpecError,
    TileAllocation,
    allocation_usage,
    as_mapping,
    format_tiles,
    is_card_name,
    parse_cards,
    parse_tiles,
    pod_request,
    tiles_by_card,
)

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class State(enum.Enum):
    RESERVED = "reserved"
    PENDING = "pending"
    BOUND = "bound"


@dataclass(frozen=True)
class PodHolding:
    """What one pod holds on one node, as derived from its annotation or a bind."""

    uid: str
    namespace: str
    name: str
    node: str
    allocation: Allocation
    usage: Mapping[str, Mapping[str, int]]
    # Fail closed: cards named by an annotation that could not be read count as full;
    # when no card can be made out at all, the whole node does.
    blocked_cards: frozenset[str] = frozenset()
    blocks_node: bool = False
    # Tile indices per container and card (`gas-container-tiles`), held while the cards are.
    tiles: TileAllocation = ()


@dataclass
class _Entry:
    holding: PodHolding
    state: State
    since: float
    replaced: _Entry | None = None  # the PENDING entry a new reservation took over


@dataclass(frozen=True)
class PodObservation:
    """A pod as the cluster shows it, reduced to what the ledger needs (built off-lock)."""

    uid: str
    namespace: str
    name: str
    terminal: bool
    holding: PodHolding | None  # None: not bound by gas (no node or no annotation)


def observe_pod(pod: Mapping[str, Any]) -> PodObservation | None:
    """Reduce a v1.Pod (JSON dict) to an observation; None when it has no UID."""
    metadata = as_mapping(pod.get("metadata"))
    uid = metadata.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    namespace = str(metadata.get("namespace") or "")
    name = str(metadata.get("name") or "")
    terminal = as_mapping(pod.get("status")).get("phase") in TERMINAL_PHASES
    node = as_mapping(pod.get("spec")).get("nodeName")
    annotations = as_mapping(metadata.get("annotations"))
    cards = annotations.get(ANNOTATION_CARDS)
    holding = None
    if isinstance(node, str) and node and cards is not None:
        tiles = annotations.get(ANNOTATION_TILES)
        holding = holding_from_annotation(uid, namespace, name, node, pod, cards, tiles)
    return PodObservation(uid, namespace, name, terminal, holding)


def holding_from_annotation(
    uid: str,
    namespace: str,
    name: str,
    node: str,
    pod: Mapping[str, Any],
    cards: object,
    tiles: object = None,
) -> PodHolding:
    """The usage a bound pod's annotations imply; fails closed when they cannot be read."""
    try:
        if not isinstance(cards, str):
            raise SpecError(f"{ANNOTATION_CARDS} is not a string")
        request = pod_request(pod)
        allocation = parse_cards(cards, len(request.containers))
        for need, given in zip(request.containers, allocation, strict=True):
            if need.gpus > 0 and not given:
                raise SpecError(f"{ANNOTATION_CARDS} gives container {need.name!r} no card")
        usage = allocation_usage(request, allocation)
    except SpecError as exc:
        return _unreadable_cards(uid, namespace, name, node, cards, exc)
    if tiles is None:
        return PodHolding(uid, namespace, name, node, allocation, usage)
    try:
        if not isinstance(tiles, str):
            raise SpecError(f"{ANNOTATION_TILES} is not a string")
        tile_allocation = parse_tiles(tiles, allocation)
    except SpecError as exc:
        # The cards are accounted as usual; which of their tiles the pod holds is unknown,
        # so the cards the annotation names (else all the pod's cards) take no new pod.
        text = tiles if isinstance(tiles, str) else ""
        named = frozenset(_named_cards(text)) or frozenset(c for cs in allocation for c in cs)
        _log_fail_closed(f"{namespace}/{name}", uid, node, ANNOTATION_TILES, text, exc, named)
        return PodHolding(uid, namespace, name, node, allocation, usage, blocked_cards=named)
    return PodHolding(uid, namespace, name, node, allocation, usage, tiles=tile_allocation)


def _log_fail_closed(
    pod: str,
    uid: str,
    node: str,
    annotation: str,
    text: str,
    exc: SpecError,
    named: frozenset[str],
) -> None:
    log.warning(
        "pod %s (uid %s) on node %s: cannot account %s=%r (%s); "
        "counting %s as full until the pod goes away",
        pod,
        uid,
        node,
        annotation,
        text[:200],
        exc,
        ",".join(sorted(named)) if named else "the whole node",
    )


def _named_cards(text: str) -> list[str]:
    parts = text.replace("|", ",").replace(":", ",").replace("+", ",").split(",")
    return [part for part in parts if is_card_name(part)]


def _unreadable_cards(
    uid: str, namespace: str, name: str, node: str, cards: object, exc: SpecError
) -> PodHolding:
    text = cards if isinstance(cards, str) else ""
    named = frozenset(_named_cards(text))
    _log_fail_closed(f"{namespace}/{name}", uid, node, ANNOTATION_CARDS, text, exc, named)
    return PodHolding(
        uid, namespace, name, node, (), {}, blocked_cards=named, blocks_node=not named
    )


@dataclass
class _NodeBook:
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    blocked: dict[str, int] = field(default_factory=dict)  # card -> pods blocking it
    blocking_pods: int = 0
    # card -> tile index -> pods holding it (two annotations may claim one tile)
    tiles: dict[str, dict[int, int]] = field(default_factory=dict)

    def tiles_used(self, minus: PodHolding | None = None) -> dict[str, frozenset[int]]:
        counts = {card: dict(tiles) for card, tiles in self.tiles.items()}
        if minus is not None:
            for card, indices in tiles_by_card(minus.tiles).items():
                for tile in indices:
                    counts.get(card, {})[tile] = counts.get(card, {}).get(tile, 0) - 1
        return {
            card: frozenset(t for t, n in tiles.items() if n > 0) for card, tiles in counts.items()
        }


class Ledger:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, policy: Policy | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._policy = policy or Policy()
        self._nodes: dict[str, NodeGpu] = {}
        self._entries: dict[str, _Entry] = {}
        self._books: dict[str, _NodeBook] = {}

    # ------------------------------------------------------------ nodes

    def set_node(self, node: NodeGpu) -> None:
        with self._lock:
            self._nodes[node.name] = node

    def remove_node(self, name: str) -> None:
        # Usage stays: pods on a deleted node are released by their own events.
        with self._lock:
            self._nodes.pop(name, None)

    def replace_nodes(self, nodes: Iterable[NodeGpu]) -> None:
        fresh = {node.name: node for node in nodes}
        with self._lock:
            self._nodes = fresh

    def node(self, name: str) -> NodeGpu | None:
        with self._lock:
            return self._nodes.get(name)

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    # ------------------------------------------------------------ cluster truth

    def observe(self, observation: PodObservation) -> None:
        """Apply a pod ADDED/MODIFIED event."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(observation.uid)
            if observation.terminal:
                if entry is not None:
                    self._drop(observation.uid)
            elif observation.holding is not None:
                self._put(observation.holding, State.BOUND, now)
            elif entry is not None and entry.state is State.BOUND:
                # The cluster no longer shows gas's annotation on a bound pod.
                self._drop(observation.uid)

    def forget(self, uid: str) -> None:
        """Apply a pod DELETED event."""
        with self._lock:
            if uid in self._entries:
                self._drop(uid)

    def replace_pods(self, observations: Iterable[PodObservation], listed_at: float) -> None:
        """Rebuild from a full pod list whose request started at `listed_at` (clock time).

        Reservations in flight survive, and so do PENDING entries newer than the list,
        which may predate their Binding.
        """
        observations = list(observations)
        bound = [o.holding for o in observations if o.holding is not None and not o.terminal]
        terminal = {o.uid for o in observations if o.terminal}
        with self._lock:
            keep = [
                e
                for uid, e in self._entries.items()
                if uid not in terminal
                and (
                    e.state is State.RESERVED or (e.state is State.PENDING and e.since >= listed_at)
                )
            ]
            self._entries = {}
            self._books = {}
            for entry in keep:
                self._entries[entry.holding.uid] = entry
                self._apply(entry.holding, +1)
                if entry.replaced is not None:
                    self._apply(entry.replaced.holding, +1)
            for holding in bound:
                self._put(holding, State.BOUND, listed_at)

    # ------------------------------------------------------------ scheduler side

    def check(
        self, request: PodRequest, nodes: Iterable[NodeGpu | str], uid: str | None = None
    ) -> dict[str, Allocation | Rejection]:
        """Fit `request` on each node (by name from the cache, or as given); reserves nothing.

        `uid` names the pod being fitted: its own earlier, uncertain bind does not count
        against it.
        """
        results: dict[str, Allocation | Rejection] = {}
        with self._lock:
            own = self._own_pending(uid)
            for item in nodes:
                node = self._nodes.get(item) if isinstance(item, str) else item
                name = item if isinstance(item, str) else item.name
                if node is None:
                    results[name] = Rejection("gpu: node is not known to gas", False)
                    continue
                result = self._place(node, request, own)
                results[name] = result if isinstance(result, Rejection) else result.cards
        return results

    def reserve(
        self, uid: str, namespace: str, name: str, request: PodRequest, node_name: str
    ) -> Allocation | Rejection:
        """Choose cards on `node_name` and hold them for the pod until commit or cancel."""
        result = self.reserve_placement(uid, namespace, name, request, node_name)
        return result if isinstance(result, Rejection) else result.cards

    def reserve_placement(
        self, uid: str, namespace: str, name: str, request: PodRequest, node_name: str
    ) -> Placement | Rejection:
        """As `reserve`, with the tiles chosen for the containers that ask for them."""
        now = self._clock()
        with self._lock:
            node = self._nodes.get(node_name)
            if node is None:
                return Rejection("gpu: node is not known to gas", False)
            entry = self._entries.get(uid)
            if entry is not None and entry.state is State.BOUND:
                return Rejection(f"gpu: pod is already bound to {entry.holding.node}", True)
            if entry is not None and entry.state is State.RESERVED:
                return Rejection("gpu: a bind for this pod is already in progress", False)
            # An earlier bind of this pod whose outcome is unknown (PENDING) stays counted
            # while this one is fitted, and comes back if this one is refused: it may
            # have landed.
            result = self._place(node, request, self._own_pending(uid))
            if isinstance(result, Rejection):
                return result
            holding = PodHolding(
                uid,
                namespace,
                name,
                node_name,
                result.cards,
                allocation_usage(request, result.cards),
                tiles=result.tiles,
            )
            self._entries.pop(uid, None)  # its usage stays applied, owned by `replaced`
            self._entries[uid] = _Entry(holding, State.RESERVED, now, replaced=entry)
            self._apply(holding, +1)
            return result

    def commit(self, uid: str) -> None:
        """The Binding exists (or may exist): keep the cards until the watch confirms."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(uid)
            if entry is not None and entry.state is State.RESERVED:
                # At most one Binding of a pod can land, and this one may have: the
                # earlier uncertain attempt it replaced no longer needs holding.
                entry.state = State.PENDING
                entry.since = now
                if entry.replaced is not None:
                    self._apply(entry.replaced.holding, -1)
                    entry.replaced = None

    def cancel(self, uid: str) -> None:
        """The Binding was definitively refused: give the cards back."""
        with self._lock:
            entry = self._entries.get(uid)
            if entry is not None and entry.state is State.RESERVED:
                del self._entries[uid]
                self._apply(entry.holding, -1)
                if entry.replaced is not None:
                    self._entries[uid] = entry.replaced

    # ------------------------------------------------------------ inspection

    def usage(self, node: str) -> dict[str, dict[str, int]]:
        with self._lock:
            book = self._books.get(node)
            return {c: dict(r) for c, r in book.usage.items()} if book else {}

    def holdings(self) -> dict[str, tuple[PodHolding, State]]:
        with self._lock:
            return {uid: (e.holding, e.state) for uid, e in self._entries.items()}

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able view for debugging and the invariant checks of the test suite.

        Tile keys appear only where tiles are held, so readers that predate tiles see the
        same shape as before."""
        with self._lock:
            pods: dict[str, Any] = {}
            for uid, e in sorted(self._entries.items()):
                pods[uid] = {
                    "namespace": e.holding.namespace,
                    "name": e.holding.name,
                    "node": e.holding.node,
                    "cards": [list(c) for c in e.holding.allocation],
                    "state": e.state.value,
                    "blocked_cards": sorted(e.holding.blocked_cards),
                    "blocks_node": e.holding.blocks_node,
                }
                if any(e.holding.tiles):
                    pods[uid]["tiles"] = format_tiles(e.holding.tiles)
                if e.replaced is not None:
                    # The uncertain earlier bind a reservation took over: still counted.
                    pods[uid]["replaced"] = {
                        "node": e.replaced.holding.node,
                        "cards": [list(c) for c in e.replaced.holding.allocation],
                    }
            result: dict[str, Any] = {
                "nodes": {
                    name: {
                        "cards": list(n.cards),
                        "capacity": dict(n.capacity),
                        "problem": n.problem,
                    }
                    for name, n in sorted(self._nodes.items())
                },
                "usage": {
                    node: {c: dict(r) for c, r in sorted(book.usage.items())}
                    for node, book in sorted(self._books.items())
                    if book.usage
                },
                "pods": pods,
            }
            tiles = {
                node: {card: sorted(t) for card, t in sorted(book.tiles_used().items()) if t}
                for node, book in sorted(self._books.items())
                if book.tiles
            }
            if tiles:
                result["tiles"] = tiles
            return result

    # ------------------------------------------------------------ internals (lock held)

    def _own_pending(self, uid: str | None) -> PodHolding | None:
        """The pod's own uncertain earlier bind: at most one Binding of a pod can land, so
        it never competes with the pod's retry (it stays counted for every other pod)."""
        entry = self._entries.get(uid) if uid else None
        return entry.holding if entry is not None and entry.state is State.PENDING else None

    def _place(
        self, node: NodeGpu, request: PodRequest, own: PodHolding | None = None
    ) -> Placement | Rejection:
        book = self._books.get(node.name)
        if book is None:
            return place(node, {}, request, policy=self._policy)
        usage: Mapping[str, Mapping[str, int]] = book.usage
        mine = own if own is not None and own.node == node.name else None
        if mine is not None:
            usage = _without(book.usage, mine.usage)
        blocked = frozenset(c for c, n in book.blocked.items() if n > 0)
        return place(
            node,
            usage,
            request,
            blocked=blocked,
            node_blocked=book.blocking_pods > 0,
            tiles_used=book.tiles_used(mine),
            policy=self._policy,
        )

    def _put(self, holding: PodHolding, state: State, since: float) -> None:
        if holding.uid in self._entries:
            self._drop(holding.uid)
        self._entries[holding.uid] = _Entry(holding, state, since)
        self._apply(holding, +1)

    def _drop(self, uid: str) -> None:
        entry = self._entries.pop(uid)
        self._apply(entry.holding, -1)
        if entry.replaced is not None:
            self._apply(entry.replaced.holding, -1)

    def _apply(self, holding: PodHolding, sign: int) -> None:
        book = self._books.setdefault(holding.node, _NodeBook())
        for card, resources in holding.usage.items():
            card_usage = book.usage.setdefault(card, {})
            for res, amount in resources.items():
                value = card_usage.get(res, 0) + sign * amount
                if value:
                    card_usage[res] = value
                else:
                    card_usage.pop(res, None)
            if not card_usage:
                del book.usage[card]
        for card in holding.blocked_cards:
            count = book.blocked.get(card, 0) + sign
            if count:
                book.blocked[card] = count
            else:
                book.blocked.pop(card, None)
        book.blocking_pods += sign if holding.blocks_node else 0
        for card, indices in tiles_by_card(holding.tiles).items():
            counts = book.tiles.setdefault(card, {})
            for tile in indices:
                count = counts.get(tile, 0) + sign
                if count:
                    counts[tile] = count
                else:
                    counts.pop(tile, None)
            if not counts:
                del book.tiles[card]
        if not book.usage and not book.blocked and not book.blocking_pods and not book.tiles:
            del self._books[holding.node]


def _without(
    usage: Mapping[str, Mapping[str, int]], minus: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    result = {card: dict(resources) for card, resources in usage.items()}
    for card, resources in minus.items():
        own = result.get(card, {})
        for res, amount in resources.items():
            own[res] = own.get(res, 0) - amount
    return result
