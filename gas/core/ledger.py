"""The ledger: which pod holds what on which card, and the nodes' capacities.

The API server is the source of truth; the ledger is a cache rebuilt from it. Entries are
keyed by pod UID and come in three states:

- RESERVED: a bind chose cards and its Binding write is in flight.
- PENDING: the bind's write succeeded, or its outcome is unknown (timeout, 5xx), and the
  watch has not yet shown the pod bound. Kept so the cards are not handed out twice in the
  window before the watch catches up; cleared by the watch or a relist, or settled once
  `pending_grace` has passed: by then a Binding sent before the commit can no longer land
  (the API server gives up on a request long before), so a fresh read of the pod showing
  it unbound, bound by someone else, or gone proves the cards free (see `stale_pending`).
- BOUND: the cluster shows the pod on a node with a `gas-container-cards` annotation.

Over-counting is safe, under-counting is not: an entry only goes away when the cluster
shows the pod terminal or deleted, when a definitive API rejection cancels a reservation,
or when the cluster shows the pod not bound by gas at a time its Binding can no longer land.

One lock guards everything; nothing under it does I/O or parsing.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import operator
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any, TypeVar, cast

from gas.core.allocator import Placement, Policy, Rejection, place, summarize
from gas.core.model import (
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


# Slots: one of each per pod, tens of thousands of them, and a slotted instance is about
# half the size of one with a __dict__.
@dataclass(frozen=True, slots=True)
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
    # The pod's `spec.priority`: kube-scheduler's preempt call may name victims by UID alone.
    priority: int = 0


@dataclass(slots=True)
class _Entry:
    holding: PodHolding
    state: State
    since: float
    # Earlier binds of the pod whose outcome is still unknown: any one of them may be the
    # Binding that landed, so their cards stay counted with this entry's.
    earlier: tuple[PodHolding, ...] = ()
    replaced: _Entry | None = None  # the PENDING entry a reservation took over, for cancel


@dataclass(frozen=True)
class PodObservation:
    """A pod as the cluster shows it, reduced to what the ledger needs (built off-lock)."""

    uid: str
    namespace: str
    name: str
    terminal: bool
    holding: PodHolding | None  # None: not bound by gas (no node or no annotation)


@dataclass(frozen=True)
class NodeState:
    """One node and what is held on it, copied under the lock for work done off it.

    Blocked cards and tiles are those of the holdings: the node's book is their sum."""

    node: NodeGpu
    # Every holding counted on the node: BOUND, PENDING and RESERVED entries, and the
    # uncertain earlier bind a reservation took over.
    holdings: tuple[PodHolding, ...]
    # The asking pod's own uncertain earlier bind here: not counted against the pod (as in
    # `Ledger.check`), though its blocked cards would be.
    own: PodHolding | None = None
    # The entry state of each holding, in the order of `holdings` (the uncertain earlier
    # bind a reservation took over is PENDING). Preemption may add only BOUND pods as
    # victims: the others may not be in kube-scheduler's cache yet. Empty: not known, and
    # then none counts as BOUND.
    states: tuple[State, ...] = ()


def observe_pod(pod: Mapping[str, Any]) -> PodObservation | None:
    """Reduce a v1.Pod (JSON dict) to an observation; None when it has no UID."""
    metadata = as_mapping(pod.get("metadata"))
    uid = metadata.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    # Namespaces and node names repeat across the pods: one string each for all of them.
    namespace = sys.intern(str(metadata.get("namespace") or ""))
    name = str(metadata.get("name") or "")
    terminal = as_mapping(pod.get("status")).get("phase") in TERMINAL_PHASES
    node = as_mapping(pod.get("spec")).get("nodeName")
    annotations = as_mapping(metadata.get("annotations"))
    cards = annotations.get(ANNOTATION_CARDS)
    holding = None
    if isinstance(node, str) and node and cards is not None:
        node = sys.intern(node)
        tiles = annotations.get(ANNOTATION_TILES)
        holding = holding_from_annotation(uid, namespace, name, node, pod, cards, tiles)
        priority = as_mapping(pod.get("spec")).get("priority")
        if isinstance(priority, int) and not isinstance(priority, bool) and priority:
            holding = dataclasses.replace(holding, priority=priority)
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
    # Tens of thousands of pods hold a few hundred distinct card sets and usages: they
    # share one (never changed) object each, which halves the ledger's memory.
    allocation = _shared(("cards", allocation), allocation)
    usage = _shared(("usage", *((card, tuple(r.items())) for card, r in usage.items())), usage)
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


_T = TypeVar("_T")
_SHARED_LIMIT = 100_000
_shared_values: dict[Hashable, Any] = {}


def _shared(key: Hashable, value: _T) -> _T:
    """The value first shared under `key` (an equal one), else `value`, now shared."""
    found: _T | None = _shared_values.get(key)
    if found is not None:
        return found
    if len(_shared_values) >= _SHARED_LIMIT:
        _shared_values.clear()  # only sharing is lost
    _shared_values[key] = value
    return value


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


class _Answers:
    """What `check` answered for one pod shape: by node name, the node object the answer
    was computed for and the answer.

    kube-scheduler asks about every node for every pod, pods mostly come in a few shapes,
    and a bind changes one node. So answers are kept until their node changes: `_apply`
    drops a node's answers when its book changes, and an answer computed for another node
    object than the current one is not used. A filter then computes afresh only the nodes
    that changed since the last pod of its shape, and finds the others with a few C-level
    passes over the names."""

    __slots__ = ("books", "entries")

    def __init__(self, books: dict[str, _NodeBook]) -> None:
        # The books the answers were computed against: a rebuild replaces them.
        self.books = books
        self.entries: dict[str, tuple[NodeGpu | None, Allocation | Rejection]] = {}


_NO_ENTRY = (object(), None)  # its node is no node's: never current
_NODE_OF = operator.itemgetter(0)
_ANSWER_OF = operator.itemgetter(1)


class _Derived:
    """What `place` is given about one node in one state of its book, computed once for
    all the pod shapes fitted to that state (dropped with the answers by `_apply`)."""

    __slots__ = ("blocked", "node", "summary", "tiles_used")

    def __init__(self, node: NodeGpu, book: _NodeBook) -> None:
        self.node = node
        self.blocked = frozenset(c for c, n in book.blocked.items() if n > 0)
        self.tiles_used = book.tiles_used()
        self.summary = summarize(node, book.usage, self.blocked)


_SHAPES_KEPT = 16
"""Pod shapes whose answers are kept (the most recently asked)."""
_SHAPES_KNOWN = 10_000
"""Request shapes numbered at once (see `Ledger._shape_key`)."""


@dataclass
class _NodeBook:
    """The sum of the holdings on one node. Changed only through `Ledger._apply`, which
    drops the answers derived from it (`_Answers`)."""

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


DEFAULT_PENDING_GRACE = 120.0
"""Seconds after which a Binding whose outcome was unknown can no longer land: twice the
API server's default request timeout (60 s), which bounds how late it can still write."""


@dataclass(frozen=True)
class StalePending:
    """A PENDING entry older than the grace: its pod must be read afresh to settle it."""

    uid: str
    namespace: str
    name: str
    node: str
    since: float


class Ledger:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        policy: Policy | None = None,
        pending_grace: float = DEFAULT_PENDING_GRACE,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._policy = policy or Policy()
        self.pending_grace = pending_grace
        self._nodes: dict[str, NodeGpu] = {}
        self._entries: dict[str, _Entry] = {}
        self._books: dict[str, _NodeBook] = {}
        self._answers: dict[int, _Answers] = {}  # by shape number, least recent first
        self._derived: dict[str, _Derived] = {}  # by node name
        self._shape_numbers: dict[Hashable, int] = {}
        self._shape_counter = itertools.count()

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

        Reservations in flight survive. A PENDING entry survives while its Binding may
        still land: its pod is listed but not (yet) bound and the list began within the
        grace of the commit, or its pod is not listed and may be newer than the list.
        """
        observations = list(observations)
        bound = [o.holding for o in observations if o.holding is not None and not o.terminal]
        terminal = {o.uid for o in observations if o.terminal}
        listed = {o.uid for o in observations}
        with self._lock:
            keep = [
                e
                for uid, e in self._entries.items()
                if uid not in terminal
                and (
                    e.state is State.RESERVED
                    or (
                        e.state is State.PENDING
                        and (
                            e.since >= listed_at
                            or (uid in listed and listed_at < e.since + self.pending_grace)
                        )
                    )
                )
            ]
            self._entries = {}
            self._books = {}
            self._answers.clear()
            self._derived.clear()
            for entry in keep:
                self._entries[entry.holding.uid] = entry
                for holding in (entry.holding, *entry.earlier):
                    self._apply(holding, +1)
            for holding in bound:
                self._put(holding, State.BOUND, listed_at)

    # ------------------------------------------------------------ scheduler side

    def check(
        self, request: PodRequest, nodes: Iterable[NodeGpu | str], uid: str | None = None
    ) -> dict[str, Allocation | Rejection]:
        """Fit `request` on each node (by name from the cache, or as given); reserves nothing.
        The answers come in the order of `nodes`.

        `uid` names the pod being fitted: its own earlier, uncertain bind does not count
        against it.
        """
        items = list(nodes)
        if all(map(isinstance, items, repeat(str))):
            names = cast(list[str], items)
            return dict(zip(names, self.check_names(request, names, uid), strict=True))
        shape = _request_shape(request)
        with self._lock:
            answers = self._answers_for(self._shape_key(shape))
            own = self._own_pending(uid)
            results: dict[str, Allocation | Rejection] = {}
            for item in items:
                if isinstance(item, str):
                    results[item] = self._check_names(request, [item], own, answers)[0]
                    continue
                # A node object from the request: equal to the one an answer was computed
                # for (nodes change rarely) is as good as the same.
                name = item.name
                entry = answers.entries.get(name)
                mine = own is not None and own.node == name
                if entry is not None and not mine and (entry[0] is item or entry[0] == item):
                    results[name] = entry[1]
                    continue
                results[name] = self._answer(item, request, own, answers)
        return results

    def check_names(
        self, request: PodRequest, names: Sequence[str], uid: str | None = None
    ) -> list[Allocation | Rejection]:
        """`check` of nodes by name, the answers in the order of `names`: what a filter
        asks, of up to thousands of nodes, and a list is quicker to build than a dict."""
        shape = _request_shape(request)
        with self._lock:
            answers = self._answers_for(self._shape_key(shape))
            return self._check_names(request, names, self._own_pending(uid), answers)

    def _check_names(
        self,
        request: PodRequest,
        names: Sequence[str],
        own: PodHolding | None,
        answers: _Answers,
    ) -> list[Allocation | Rejection]:
        """`check_names` with the lock held. The kept answers are found and validated
        with C-level passes over the names; only the nodes that changed are fitted here."""
        known = self._nodes
        current = list(map(known.get, names))
        entries = list(map(answers.entries.get, names, repeat(_NO_ENTRY)))
        stale = map(operator.is_not, current, map(_NODE_OF, entries))
        redo = list(compress(range(len(names)), stale))
        results: list[Allocation | Rejection | None] = list(map(_ANSWER_OF, entries))
        if own is not None:
            # The pod's own uncertain bind: its answer for this pod is not the kept one.
            redo += [index for index, name in enumerate(names) if name == own.node]
        for index in redo:
            name = names[index]
            node = current[index]
            if node is None:
                results[index] = _UNKNOWN_NODE
                answers.entries[name] = (None, _UNKNOWN_NODE)
            else:
                results[index] = self._answer(node, request, own, answers)
        return cast(list[Allocation | Rejection], results)  # every None was redone

    def _answer(
        self, node: NodeGpu, request: PodRequest, own: PodHolding | None, answers: _Answers
    ) -> Allocation | Rejection:
        """Fit afresh; kept unless the pod's own uncertain bind is on the node (the answer
        is then for this pod alone)."""
        mine = own if own is not None and own.node == node.name else None
        placed = self._place_fresh(node, self._books.get(node.name), request, mine)
        result = placed if isinstance(placed, Rejection) else placed.cards
        if mine is None:
            if len(answers.entries) > 2 * len(self._nodes) + 1000:
                answers.entries.clear()  # names of nodes long gone
            answers.entries[node.name] = (node, result)
        return result

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
            # The earlier attempt's usage stays applied, now owned by the new entry.
            earlier = () if entry is None else (*entry.earlier, entry.holding)
            self._entries[uid] = _Entry(holding, State.RESERVED, now, earlier, replaced=entry)
            self._apply(holding, +1)
            return result

    def commit(self, uid: str, landed: bool = True) -> None:
        """The Binding exists (`landed`) or may exist: keep the cards until the watch
        confirms. Only a Binding known to have landed frees the pod's earlier uncertain
        attempts (a pod is bound once); after another unknown outcome any of them may be
        the one that landed, so all stay held until the cluster shows which."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(uid)
            if entry is not None and entry.state is State.RESERVED:
                entry.state = State.PENDING
                entry.since = now
                entry.replaced = None
                if landed:
                    for holding in entry.earlier:
                        self._apply(holding, -1)
                    entry.earlier = ()

    def cancel(self, uid: str) -> None:
        """The Binding was definitively refused: give the cards back."""
        with self._lock:
            entry = self._entries.get(uid)
            if entry is not None and entry.state is State.RESERVED:
                del self._entries[uid]
                self._apply(entry.holding, -1)
                if entry.replaced is not None:
                    self._entries[uid] = entry.replaced

    def stale_pending(self) -> list[StalePending]:
        """PENDING entries older than the grace, for the caller to read their pods afresh."""
        cutoff = self._clock() - self.pending_grace
        with self._lock:
            return [
                StalePending(uid, e.holding.namespace, e.holding.name, e.holding.node, e.since)
                for uid, e in self._entries.items()
                if e.state is State.PENDING and e.since <= cutoff
            ]

    def settle_pending(self, stale: StalePending) -> bool:
        """Release a stale PENDING entry whose pod a read made after the grace showed not
        bound by gas (or gone). False when the entry changed since: a new bind of the pod,
        or the watch, has taken over."""
        with self._lock:
            entry = self._entries.get(stale.uid)
            if entry is None or entry.state is not State.PENDING or entry.since != stale.since:
                return False
            self._drop(stale.uid)
            return True

    # ------------------------------------------------------------ inspection

    def node_states(self, names: Iterable[str], uid: str | None = None) -> dict[str, NodeState]:
        """The named nodes gas knows, with their holdings, in one consistent copy.

        `uid` names the pod being fitted, as for `check`. One pass over the entries under
        the lock; the caller searches off it."""
        with self._lock:
            wanted = {name: node for name in names if (node := self._nodes.get(name))}
            held: dict[str, list[PodHolding]] = {name: [] for name in wanted}
            states: dict[str, list[State]] = {name: [] for name in wanted}
            for entry in self._entries.values():
                if entry.holding.node in held:
                    held[entry.holding.node].append(entry.holding)
                    states[entry.holding.node].append(entry.state)
                for earlier in entry.earlier:
                    if earlier.node in held:
                        held[earlier.node].append(earlier)
                        states[earlier.node].append(State.PENDING)
            own = self._own_pending(uid)
        return {
            name: NodeState(
                node,
                tuple(held[name]),
                own if own is not None and own.node == name else None,
                tuple(states[name]),
            )
            for name, node in wanted.items()
        }

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
                if e.earlier:
                    # Earlier binds of the pod with unknown outcomes: still counted.
                    pods[uid]["earlier"] = [
                        {"node": h.node, "cards": [list(c) for c in h.allocation]}
                        for h in e.earlier
                    ]
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

    def _shape_key(self, shape: Hashable) -> int:
        """A number for a request shape with the ledger's policy: equal numbers get equal
        answers on equal node states. A number is hashed in no time, unlike the shape."""
        key = (self._policy, shape)
        number = self._shape_numbers.get(key)
        if number is None:
            if len(self._shape_numbers) >= _SHAPES_KNOWN:
                # Numbers are never reused, so answers kept under old ones just go unused.
                self._shape_numbers.clear()
            number = self._shape_numbers[key] = next(self._shape_counter)
        return number

    def _answers_for(self, key: int) -> _Answers:
        answers = self._answers.pop(key, None)
        if answers is None or answers.books is not self._books:
            answers = _Answers(self._books)
            while len(self._answers) >= _SHAPES_KEPT:
                del self._answers[next(iter(self._answers))]
        self._answers[key] = answers  # now the most recent
        return answers

    def _place(
        self, node: NodeGpu, request: PodRequest, own: PodHolding | None = None
    ) -> Placement | Rejection:
        mine = own if own is not None and own.node == node.name else None
        return self._place_fresh(node, self._books.get(node.name), request, mine)

    def _place_fresh(
        self,
        node: NodeGpu,
        book: _NodeBook | None,
        request: PodRequest,
        mine: PodHolding | None,
    ) -> Placement | Rejection:
        if book is None:
            return place(node, {}, request, policy=self._policy)
        if mine is not None:
            return place(
                node,
                _without(book.usage, mine.usage),
                request,
                blocked=frozenset(c for c, n in book.blocked.items() if n > 0),
                node_blocked=book.blocking_pods > 0,
                tiles_used=book.tiles_used(mine),
                policy=self._policy,
            )
        derived = self._derived.get(node.name)
        if derived is None or derived.node is not node:
            derived = self._derived[node.name] = _Derived(node, book)
        return place(
            node,
            book.usage,
            request,
            blocked=derived.blocked,
            node_blocked=book.blocking_pods > 0,
            tiles_used=derived.tiles_used,
            policy=self._policy,
            summary=derived.summary,
        )

    def _put(self, holding: PodHolding, state: State, since: float) -> None:
        if holding.uid in self._entries:
            self._drop(holding.uid)
        self._entries[holding.uid] = _Entry(holding, state, since)
        self._apply(holding, +1)

    def _drop(self, uid: str) -> None:
        entry = self._entries.pop(uid)
        for holding in (entry.holding, *entry.earlier):
            self._apply(holding, -1)

    def _apply(self, holding: PodHolding, sign: int) -> None:
        for answers in self._answers.values():
            answers.entries.pop(holding.node, None)
        self._derived.pop(holding.node, None)
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


_UNKNOWN_NODE = Rejection("gpu: node is not known to gas", False)


def _request_shape(request: PodRequest) -> Hashable:
    """A hashable copy of everything in `request`, orders kept (a reason can name the first
    resource in a container's order). Container names matter only to `gas-same-gpu`."""
    group = request.same_gpu
    containers = tuple(
        (need.name if need.name in group else None, need.gpus, tuple(need.requests.items()))
        for need in request.containers
    )
    rest = tuple(
        _frozen(getattr(request, f.name))
        for f in dataclasses.fields(request)
        if f.name != "containers"
    )
    return containers, rest


def _frozen(value: object) -> Hashable:
    if isinstance(value, Mapping):
        return tuple((key, _frozen(item)) for key, item in value.items())
    if isinstance(value, tuple | list):
        return tuple(_frozen(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return type(value), tuple(_frozen(getattr(value, f.name)) for f in fields)
    try:
        hash(value)
    except TypeError:
        # A value of a kind this does not know (a future field): a key equal to no other,
        # so the answer is computed afresh rather than possibly shared wrongly.
        return object()
    return value


def _without(
    usage: Mapping[str, Mapping[str, int]], minus: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    result = {card: dict(resources) for card, resources in usage.items()}
    for card, resources in minus.items():
        own = result.get(card, {})
        for res, amount in resources.items():
            own[res] = own.get(res, 0) - amount
    return result
