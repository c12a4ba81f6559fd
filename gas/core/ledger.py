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

One lock guards everything; nothing under it does I/O or parsing: pods are read into
holdings off it (`gas.core.holdings`). The books are kept a second time as arrays of free
capacity per card (`gas.core.freebook`), from which `check` decides the usual pod (one
container, plain first fit) for every named node at once, and `judge_names` gives a filter
its reply (`gas.core.judgement`) without an answer per node. Other pods, and the few nodes
the arrays leave, are fitted node by node, their answers kept per pod shape until their
node's book changes (`gas.core.answers`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any, cast

from gas.core.allocator import Placement, Policy, Rejection, place
from gas.core.answers import AnswerCache, Answers, request_shape
from gas.core.durations import DEFAULT_PENDING_GRACE
from gas.core.freebook import Ask, BookView, FreeBook
from gas.core.holdings import PodHolding, PodObservation
from gas.core.judgement import Judgement, judge
from gas.core.ledger_views import LedgerFigures, NodeState, StalePending, State
from gas.core.model import (
    Allocation,
    NodeGpu,
    PodRequest,
    allocation_usage,
    format_tiles,
    tiles_by_card,
)


@dataclass(slots=True)
class _Entry:
    holding: PodHolding
    state: State
    since: float
    # Earlier binds of the pod whose outcome is still unknown: any one of them may be the
    # Binding that landed, so their cards stay counted with this entry's.
    earlier: tuple[PodHolding, ...] = ()
    replaced: _Entry | None = None  # the PENDING entry a reservation took over, for cancel


@dataclass
class _NodeBook:
    """The sum of the holdings on one node. Changed only through `Ledger._apply`, which
    drops the answers derived from it (`AnswerCache.invalidate`)."""

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
        self._cache = AnswerCache(self._policy)
        # The books again as arrays, for plain pods on many nodes at once.
        self._free = FreeBook(self._policy)

    # ------------------------------------------------------------ nodes

    def set_node(self, node: NodeGpu) -> None:
        with self._lock:
            if self._nodes.get(node.name) == node:
                # Most node events (status heartbeats) change nothing gas reads: the
                # answers and arrays made for the node as it is stay.
                return
            self._nodes[node.name] = node
            self._free.set_node(node, self._book_view(node.name))

    def remove_node(self, name: str) -> None:
        # Usage stays: pods on a deleted node are released by their own events.
        with self._lock:
            self._nodes.pop(name, None)
            self._free.remove_node(name)

    def replace_nodes(self, nodes: Iterable[NodeGpu]) -> None:
        fresh = {node.name: node for node in nodes}
        with self._lock:
            # A node equal to the one held stays the same object, as in `set_node`: what
            # is kept per node object (a scrape's lines) outlives a relist.
            for name, node in fresh.items():
                held = self._nodes.get(name)
                if held is not None and held == node:
                    fresh[name] = held
            self._nodes = fresh
            self._free.replace_nodes(fresh.values(), self._book_views())

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
                if (
                    entry is not None
                    and not entry.earlier
                    and _holds_the_same(entry.holding, observation.holding)
                ):
                    # What gas counts already (a bind's own watch event, most often): only
                    # the state moves on, so the node's kept answers and arrays stay valid.
                    # The watch's holding has the pod's priority, which a reservation lacks.
                    entry.holding = observation.holding
                    entry.state = State.BOUND
                    entry.since = now
                    entry.replaced = None
                else:
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
            self._cache.clear()
            self._free.suspend()
            for entry in keep:
                self._entries[entry.holding.uid] = entry
                for holding in (entry.holding, *entry.earlier):
                    self._apply(holding, +1)
            for holding in bound:
                self._put(holding, State.BOUND, listed_at)
            self._free.replace_books(self._book_views())

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
        ask, shape = self._ask(request)
        with self._lock:
            own = self._own_pending(uid)
            # Names, and node objects equal to those gas knows (nodes change rarely), are
            # answered by name, all together; other node objects one by one.
            known = [isinstance(item, str) or self._knows(item) for item in items]
            names = [item if isinstance(item, str) else item.name for item in items]
            by_name = list(compress(names, known))
            answered = self._fit_names(request, by_name, own, ask, shape)
            found = dict(zip(by_name, answered, strict=True))
            answers: Answers | None = None
            results: dict[str, Allocation | Rejection] = {}
            for item, name, is_known in zip(items, names, known, strict=True):
                if is_known:
                    results[name] = found[name]
                    continue
                if answers is None:  # rare: the shape found only now
                    shape = request_shape(request) if shape is None else shape
                    answers = self._cache.answers(shape)
                node = cast(NodeGpu, item)
                kept = None if own is not None and own.node == name else answers.get(node)
                results[name] = (
                    kept if kept is not None else self._answer(node, request, own, answers)
                )
        return results

    def check_names(
        self, request: PodRequest, names: Sequence[str], uid: str | None = None
    ) -> list[Allocation | Rejection]:
        """`check` of nodes by name, the answers in the order of `names`: what a filter
        asks, of up to thousands of nodes, and a list is quicker to build than a dict."""
        ask, shape = self._ask(request)
        with self._lock:
            return self._fit_names(request, names, self._own_pending(uid), ask, shape)

    def judge_names(
        self, request: PodRequest, names: Sequence[str], uid: str | None = None
    ) -> Judgement:
        """What a filter answers of `check_names`: the names that pass, and the reason for
        each of the others. The arrays find it for the usual pod on nodes they decide
        without an answer per node; only the nodes they leave are fitted one by one.
        Decided under one hold of the lock; only the reply to answers per node is put
        together off it."""
        ask, shape = self._ask(request)
        with self._lock:
            own = self._own_pending(uid)
            # The pod's own uncertain bind makes its answer on that node its own.
            if ask is not None and own is None:
                judged = self._free.judge(ask, names, functools.partial(self._fit_left, request))
                if judged is not None:
                    return judged
            results = self._fit_names(request, names, own, ask, shape)
        return judge(names, results)

    def fits_any(self, request: PodRequest, names: Sequence[str], uid: str | None = None) -> bool:
        """Whether `judge_names` would pass any of `names`. The first name is fitted alone
        first, node by node as the arrays' leftovers are (their fixed cost is that of a
        thousand rows): a prioritize names the nodes that passed the filter a moment ago,
        so it nearly always settles it."""
        if not names:
            return False
        shape = request_shape(request)
        with self._lock:
            own = self._own_pending(uid)
            first = self._check_names(request, names[:1], own, self._cache.answers(shape))[0]
        if not isinstance(first, Rejection):
            return True
        return bool(self.judge_names(request, names, uid).passed)

    def _fit_left(self, request: PodRequest, names: list[str]) -> list[Allocation | Rejection]:
        """The answers for the names the arrays leave when judging (`FreeBook.judge`),
        with the lock held: fitted node by node, as `_decide` fits those `decide` leaves
        (not through it: looking up only these names would drop the rows the arrays
        keep for the names of the last filter)."""
        return self._check_names(request, names, None, self._cache.answers(request_shape(request)))

    def _ask(self, request: PodRequest) -> tuple[Ask | None, Hashable]:
        """What the arrays need of `request` when they decide it (the shape None), else
        None and its shape, which only the answers kept per node need: found off the
        lock."""
        ask = self._free.ask(request)
        return ask, request_shape(request) if ask is None else None

    def _fit_names(
        self,
        request: PodRequest,
        names: Sequence[str],
        own: PodHolding | None,
        ask: Ask | None,
        shape: Hashable,
    ) -> list[Allocation | Rejection]:
        """`check_names` with the lock held, `ask` and `shape` as `_ask` gives them."""
        if ask is not None:
            return self._decide(request, names, own, ask)
        return self._check_names(request, names, own, self._cache.answers(shape))

    def _decide(
        self, request: PodRequest, names: Sequence[str], own: PodHolding | None, ask: Ask
    ) -> list[Allocation | Rejection]:
        """`check_names` of a pod the arrays decide, with the lock held: the nodes they
        leave (unknown, not regular, or with the pod's own uncertain bind) are fitted as
        other pods are."""
        results, left = self._free.decide(ask, names)
        if own is not None:
            # The pod's own uncertain bind: the book the arrays hold is not the pod's.
            left += [
                i for i, name in enumerate(names) if name == own.node and results[i] is not None
            ]
        if left:
            answers = self._cache.answers(request_shape(request))
            redone = self._check_names(request, [names[i] for i in left], own, answers)
            for index, answer in zip(left, redone, strict=True):
                results[index] = answer
        return cast(list[Allocation | Rejection], results)  # every None was redone

    def _check_names(
        self,
        request: PodRequest,
        names: Sequence[str],
        own: PodHolding | None,
        answers: Answers,
    ) -> list[Allocation | Rejection]:
        """`check_names` with the lock held, one node at a time. The kept answers are found
        and validated with C-level passes over the names; only the nodes that changed are
        fitted here."""
        current = list(map(self._nodes.get, names))
        results, redo = answers.kept(names, current)
        if own is not None:
            # The pod's own uncertain bind: its answer for this pod is not the kept one.
            redo += [index for index, name in enumerate(names) if name == own.node]
        for index in redo:
            node = current[index]
            if node is None:
                results[index] = _UNKNOWN_NODE
                answers.keep(names[index], None, _UNKNOWN_NODE, len(self._nodes))
            else:
                results[index] = self._answer(node, request, own, answers)
        return cast(list[Allocation | Rejection], results)  # every None was redone

    def _answer(
        self, node: NodeGpu, request: PodRequest, own: PodHolding | None, answers: Answers
    ) -> Allocation | Rejection:
        """Fit afresh; kept unless the pod's own uncertain bind is on the node (the answer
        is then for this pod alone)."""
        placed = self._place(node, request, own, answers)
        result = placed if isinstance(placed, Rejection) else placed.cards
        if own is None or own.node != node.name:
            answers.keep(node.name, node, result, len(self._nodes))
        return result

    def reserve_placement(
        self, uid: str, namespace: str, name: str, request: PodRequest, node_name: str
    ) -> Placement | Rejection:
        """Choose cards on `node_name`, and tiles for the containers that ask for them,
        and hold them for the pod until commit or cancel."""
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
                # No tiles as the watch shows them (no annotation), so that the bind's own
                # watch event finds the holding unchanged.
                tiles=result.tiles if any(result.tiles) else (),
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

    def figures(self) -> LedgerFigures:
        """What the per-card and placeable metrics read, in one pass under the lock: the
        nodes and their books, without the per-pod detail of `snapshot`."""
        with self._lock:
            nodes = dict(sorted(self._nodes.items()))
            usage = {
                name: {card: dict(resources) for card, resources in book.usage.items()}
                for name, book in self._books.items()
                if book.usage and name in nodes
            }
            blocked: dict[str, set[str]] = {}
            blocking: set[str] = set()
            states = [entry.state for entry in self._entries.values()]
            for entry in self._entries.values():
                holding = entry.holding
                # The entry's own holding, as `snapshot` lists it.
                if holding.blocked_cards:
                    blocked.setdefault(holding.node, set()).update(holding.blocked_cards)
                if holding.blocks_node:
                    blocking.add(holding.node)
        return LedgerFigures(
            nodes,
            usage,
            {name: frozenset(cards) for name, cards in blocked.items()},
            frozenset(blocking),
            # Counted by identity in C: an Enum's hash is a Python call.
            {state.value: states.count(state) for state in State},
        )

    # ------------------------------------------------------------ internals (lock held)

    def _own_pending(self, uid: str | None) -> PodHolding | None:
        """The pod's own uncertain earlier bind: at most one Binding of a pod can land, so
        it never competes with the pod's retry (it stays counted for every other pod)."""
        entry = self._entries.get(uid) if uid else None
        return entry.holding if entry is not None and entry.state is State.PENDING else None

    def _place(
        self,
        node: NodeGpu,
        request: PodRequest,
        own: PodHolding | None,
        answers: Answers | None = None,
    ) -> Placement | Rejection:
        """`place` on the node's book as it stands, but for the pod's own uncertain bind
        (`own`) when that is on the node: the one state no other pod is fitted to.
        `answers`, those of the request's shape, keep what the idle check finds."""
        book = self._books.get(node.name)
        if book is None or own is None or own.node != node.name:
            return self._cache.place(node, book, request, answers)
        return place(
            node,
            _without(book.usage, own.usage),
            request,
            blocked=frozenset(c for c, n in book.blocked.items() if n > 0),
            node_blocked=book.blocking_pods > 0,
            tiles_used=book.tiles_used(own),
            policy=self._policy,
        )

    def _knows(self, node: NodeGpu) -> bool:
        """Whether `node` is the node object gas has under its name, or one equal to it."""
        known = self._nodes.get(node.name)
        return known is node or known == node

    def _book_view(self, node: str) -> BookView:
        book = self._books.get(node)
        return _NO_BOOK if book is None else (book.usage, book.blocked, book.blocking_pods)

    def _book_views(self) -> dict[str, BookView]:
        return {name: (b.usage, b.blocked, b.blocking_pods) for name, b in self._books.items()}

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
        node = holding.node
        self._cache.invalidate(node)
        book = self._books.setdefault(node, _NodeBook())
        for card, resources in holding.usage.items():
            card_usage = book.usage.setdefault(card, {})
            for res, amount in resources.items():
                value = card_usage.get(res, 0) + sign * amount
                if value:
                    card_usage[res] = value
                else:
                    card_usage.pop(res, None)
            self._free.set_usage(node, card, card_usage, resources)
            if not card_usage:
                del book.usage[card]
        for card in holding.blocked_cards:
            count = book.blocked.get(card, 0) + sign
            if count:
                book.blocked[card] = count
            else:
                book.blocked.pop(card, None)
            self._free.set_blocked(node, card, count)
        if holding.blocks_node:
            book.blocking_pods += sign
            self._free.set_blocking(node, book.blocking_pods)
        # Most pods hold no tiles: not worth a call per pod in a rebuild of 50,000.
        for card, indices in tiles_by_card(holding.tiles).items() if holding.tiles else ():
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
_NO_BOOK: BookView = ({}, {}, 0)


def _holds_the_same(counted: PodHolding, observed: PodHolding) -> bool:
    """Whether `observed` holds what `counted` does, whatever their priorities: no book
    counts a priority, and a bind's reservation does not know the pod's (preemption reads
    it from the watch's holding)."""
    return counted == observed or (
        counted.priority != observed.priority
        and dataclasses.replace(observed, priority=counted.priority) == counted
    )


def _without(
    usage: Mapping[str, Mapping[str, int]], minus: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    result = {card: dict(resources) for card, resources in usage.items()}
    for card, resources in minus.items():
        own = result.get(card, {})
        for res, amount in resources.items():
            own[res] = own.get(res, 0) - amount
    return result
