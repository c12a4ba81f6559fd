"""Preemption: which of the victims kube-scheduler proposes really make room on the cards.

For each candidate node, the proposed victims that hold cards there (*judged*) are cut down
to the best set whose eviction lets the pod fit as bind would place it; the others
(*unjudged*) are kept as proposed; when the judged ones cannot make room, lower-priority
BOUND GPU pods on the node (*addable*) may be added. Pure functions: no I/O, no locks; the
caller copies the node's holdings out of the ledger (`Ledger.node_states`).

The rules, the order candidate sets are ranked in, and the bounds on the search:
docs/preemption.md.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from gas.core.allocator import Placement, Policy, Rejection, place
from gas.core.holdings import PodHolding
from gas.core.ledger_views import NodeState, State
from gas.core.model import NodeGpu, PodRequest, tiles_by_card

EXHAUSTIVE_VICTIMS = 16
"""Candidates on one node (judged victims, plus addable pods) up to which every subset may
be tried."""

NODE_PLACEMENTS = 2_000
"""Allocator calls one node may spend (about 0.1 ms each)."""

REQUEST_PLACEMENTS = 10_000
"""Allocator calls one preempt request may spend over all its nodes."""

SKIPS_PER_PLACEMENT = 16
"""Subsets the node-total bound rules out for the cost of one allocator call."""

AS_PROPOSED = "as_proposed"
TRIMMED = "trimmed"
EXTENDED = "extended"

UNKNOWN_NODE = "gpu: node is not known to gas"
NO_VICTIMS = "gpu: no victim proposed on this node"
EVEN_EXTENDED = "(even with every proposed victim and every lower-priority GPU pod evicted)"


@dataclass(frozen=True)
class Victim:
    """A pod kube-scheduler proposes to evict."""

    uid: str
    priority: int | None = None
    """The pod's `spec.priority` when the scheduler sent the pod (full form)."""


@dataclass(frozen=True)
class Selection:
    """The victims gas answers for one node."""

    victims: tuple[str, ...]
    """UIDs to evict: the chosen judged ones and every unjudged one in the scheduler's
    order, then those gas added."""
    judged: tuple[str, ...]
    """The proposed victims that hold cards here (chosen or spared)."""
    spared: tuple[str, ...]
    """Judged victims gas leaves out: their cards are not needed."""
    outcome: str
    """`as_proposed`, `trimmed` or `extended` (some victims were added)."""
    minimal: bool
    """No smaller set of the candidates searched would do (the search covered every
    smaller one): the judged victims, or with `extended` those and the addable pods."""
    added: tuple[str, ...] = ()
    """Victims gas added of its own: BOUND lower-priority GPU pods on this node."""


@dataclass
class Budget:
    """Allocator calls left; shared by the nodes of one request."""

    left: int = REQUEST_PLACEMENTS

    def spend(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def select_all(
    request: PodRequest,
    proposals: Mapping[str, Sequence[Victim]],
    states: Mapping[str, NodeState],
    policy: Policy | None = None,
    *,
    priority: int | None = None,
    budget: Budget | None = None,
    node_placements: int = NODE_PLACEMENTS,
) -> dict[str, Selection | Rejection]:
    """The answer for every proposed node, in the proposal's order: a Selection where
    preempting helps the pod onto the cards, else the Rejection saying why the node is
    dropped. A node missing from `states` is unknown to gas and dropped.

    `priority` is the asking pod's: pods below it that a node's state shows BOUND may be
    added as victims there. None adds none."""
    budget = budget if budget is not None else Budget()
    results: dict[str, Selection | Rejection] = {}
    names = list(proposals)
    for index, name in enumerate(names):
        state = states.get(name)
        if state is None:
            results[name] = Rejection(UNKNOWN_NODE, unresolvable=False)
            continue
        # An even share of what is left, so early nodes cannot starve later ones.
        share = min(node_placements, budget.left // (len(names) - index))
        own = Budget(share)
        # Not strict: a state that does not know its entries' states has none.
        bound = {
            h.uid for h, s in zip(state.holdings, state.states, strict=False) if s is State.BOUND
        }
        results[name] = select_victims(
            state.node,
            state.holdings,
            request,
            proposals[name],
            policy,
            own=state.own,
            budget=own,
            priority=priority,
            bound=bound,
        )
        budget.left -= share - own.left
    return results


def select_victims(
    node: NodeGpu,
    holdings: Iterable[PodHolding],
    request: PodRequest,
    proposed: Sequence[Victim],
    policy: Policy | None = None,
    *,
    own: PodHolding | None = None,
    budget: Budget | None = None,
    priority: int | None = None,
    bound: Collection[str] = frozenset(),
) -> Selection | Rejection:
    """The victims to evict on `node` so that `request` fits its cards, chosen from
    `proposed` and, when those cannot make room, from the pods gas may add (docs/preemption.md),
    or the Rejection saying why the node is dropped.

    `holdings` are everything counted on the node; `own` is the asking pod's uncertain
    earlier bind there, if any, which does not count against it. `priority` is the asking
    pod's and `bound` names the holdings the ledger has as BOUND: those on this node below
    `priority` may be added. None adds none.
    """
    budget = budget if budget is not None else Budget(NODE_PLACEMENTS)
    unique: dict[str, Victim] = {}
    for victim in proposed:
        unique.setdefault(victim.uid, victim)
    proposed = list(unique.values())
    if not proposed:
        return Rejection(NO_VICTIMS, unresolvable=False)
    holdings = tuple(holdings)
    own_uid = own.uid if own is not None and own.node == node.name else None
    held_here = {h.uid for h in holdings if h.node == node.name}
    judged = [v for v in proposed if v.uid in held_here and v.uid != own_uid]
    extra = _addable(node, holdings, unique, own_uid, priority, bound)
    room = _Room(node, holdings, request, policy or Policy(), own_uid, judged, extra)
    everyone = tuple(v.uid for v in proposed)
    judged_uids = tuple(v.uid for v in judged)
    budget.spend()  # the first calls are made whatever is left
    if not isinstance(room.fit(frozenset()), Rejection):
        return Selection(everyone, judged_uids, (), AS_PROPOSED, minimal=True)
    budget.spend()
    count = len(judged)
    every = room.fit(frozenset(range(count)))
    if isinstance(every, Rejection):
        if every.unresolvable:  # nothing to do with what is held here
            return every
        if not extra:
            return Rejection(f"{every.reason} (even with every proposed victim evicted)", False)
        budget.spend()
        count = len(room.costs)
        widest = room.fit(frozenset(range(count)))
        if isinstance(widest, Rejection):
            return Rejection(f"{widest.reason} {EVEN_EXTENDED}", False)
    chosen, minimal = _search(room, budget, count, extending=count > len(judged))
    keep = {judged[i].uid for i in chosen if i < len(judged)}
    spared = tuple(v.uid for i, v in enumerate(judged) if i not in chosen)
    added = tuple(extra[i - len(judged)].uid for i in sorted(chosen) if i >= len(judged))
    victims = tuple(u for u in everyone if u in keep or u not in judged_uids) + added
    outcome = EXTENDED if added else TRIMMED if spared else AS_PROPOSED
    return Selection(victims, judged_uids, spared, outcome, minimal, added)


def _addable(
    node: NodeGpu,
    holdings: Sequence[PodHolding],
    proposed: Collection[str],
    own_uid: str | None,
    priority: int | None,
    bound: Collection[str],
) -> list[Victim]:
    """The pods gas may add as victims on `node`, by UID so that replicas agree on ties.

    Only BOUND ones: a reserved or pending pod may not be in kube-scheduler's cache yet,
    and a UID it does not have on the node makes its whole preempt call fail. Only those
    strictly below the asking pod, as kube-scheduler itself would choose."""
    if priority is None:
        return []
    found = {
        h.uid: Victim(h.uid, h.priority)
        for h in holdings
        if h.node == node.name
        and h.uid in bound
        and h.uid not in proposed
        and h.uid != own_uid
        and h.priority < priority
    }
    return [found[uid] for uid in sorted(found)]


# ---------------------------------------------------------------- the search


def _search(
    room: _Room, budget: Budget, count: int, *, extending: bool = False
) -> tuple[frozenset[int], bool]:
    """The chosen candidates among the first `count` (indices) and whether no smaller set
    of them exists. Evicting all `count` is known to fit. When `extending`, the judged
    victims alone are known not to: no set of them alone is tried."""
    everyone = frozenset(range(count))
    judged = room.judged
    if count <= EXHAUSTIVE_VICTIMS:
        # Keep enough budget for the greedy pass should the exhaustive one run out.
        reserve = count
        skipped = 0
        for size in range(1, count):
            candidates = sorted(combinations(range(count), size), key=room.rank)
            for subset in candidates:
                if extending and subset[-1] < judged:
                    # A subset of a set that does not fit: evicting less never helps.
                    continue
                if budget.left <= reserve:
                    return _greedy(room, budget, everyone), False
                chosen = frozenset(subset)
                if not room.frees_enough(chosen):
                    # Cheap, but tens of thousands of them are not.
                    skipped += 1
                    if skipped % SKIPS_PER_PLACEMENT == 0:
                        budget.spend()
                    continue
                budget.spend()
                if not isinstance(room.fit(chosen), Rejection):
                    return chosen, True
        return everyone, True
    return _greedy(room, budget, everyone), False


def _greedy(room: _Room, budget: Budget, start: frozenset[int]) -> frozenset[int]:
    """Spare each victim, most costly first, while the pod still fits without it."""
    chosen = set(start)
    for index in sorted(start, key=room.rank_one, reverse=True):
        trial = frozenset(chosen - {index})
        if not room.frees_enough(trial):
            continue
        if not budget.spend():
            break
        if not isinstance(room.fit(trial), Rejection):
            chosen.discard(index)
    return frozenset(chosen)


@dataclass(frozen=True)
class _Cost:
    priority: int
    share: int  # usage over capacity, over a common denominator
    added: int  # 1 for a pod gas adds, which kube-scheduler has not checked for budgets


@dataclass
class _Piece:
    """What one group of holdings puts on the node's cards."""

    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    tiles: dict[str, set[int]] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)
    blocks_node: bool = False

    def add(self, holding: PodHolding, counted: bool) -> None:
        self.blocked |= holding.blocked_cards
        self.blocks_node |= holding.blocks_node
        if not counted:
            return
        for card, resources in holding.usage.items():
            own = self.usage.setdefault(card, {})
            for res, amount in resources.items():
                own[res] = own.get(res, 0) + amount
        for card, indices in tiles_by_card(holding.tiles).items():
            self.tiles.setdefault(card, set()).update(indices)


class _Room:
    """The node split into what stays (`base`) and what each candidate holds: the judged
    victims, then the pods gas may add (`extra`)."""

    def __init__(
        self,
        node: NodeGpu,
        holdings: tuple[PodHolding, ...],
        request: PodRequest,
        policy: Policy,
        own_uid: str | None,
        judged: Sequence[Victim],
        extra: Sequence[Victim] = (),
    ) -> None:
        self.node = node
        self.request = request
        self.policy = policy
        self.judged = len(judged)
        candidates = [*judged, *extra]
        index = {v.uid: i for i, v in enumerate(candidates)}
        self.base = _Piece()
        self.pieces = [_Piece() for _ in candidates]
        known: dict[int, int] = {}  # the ledger's priority, for victims sent by UID alone
        for holding in holdings:
            if holding.node != node.name:
                continue
            # The pod's own uncertain bind blocks what it blocks but uses nothing of its own.
            counted = holding.uid != own_uid
            at = index.get(holding.uid)
            if at is None:
                self.base.add(holding, counted)
                continue
            self.pieces[at].add(holding, counted)
            known[at] = max(known.get(at, holding.priority), holding.priority)
        priorities = [
            v.priority if v.priority is not None else known.get(i, 0)
            for i, v in enumerate(candidates)
        ]
        self.costs = [
            _Cost(p, s, int(i >= self.judged))
            for i, (p, s) in enumerate(zip(priorities, self._shares(), strict=True))
        ]
        self._totals = self._pod_totals()
        self._freed = [self._held(piece) for piece in self.pieces]
        self._free_now = self._room_left(self._merge(frozenset()))

    # ---- ranking

    def rank(self, subset: tuple[int, ...]) -> tuple[int, int, int, int, tuple[int, ...]]:
        costs = [self.costs[i] for i in subset]
        return (
            max(c.priority for c in costs),
            sum(c.priority for c in costs),
            # Before the GPU taken away: a broken disruption budget costs more than a share.
            sum(c.added for c in costs),
            sum(c.share for c in costs),
            subset,
        )

    def rank_one(self, index: int) -> tuple[int, int, int, int]:
        cost = self.costs[index]
        return (cost.priority, cost.added, cost.share, index)

    def _shares(self) -> list[int]:
        capacities = [c for c in self.node.capacity.values() if c > 0]
        scale = math.lcm(*capacities) if capacities else 1
        return [
            sum(
                amount * (scale // self.node.capacity[res])
                for resources in piece.usage.values()
                for res, amount in resources.items()
                if self.node.capacity.get(res, 0) > 0
            )
            for piece in self.pieces
        ]

    # ---- the node-total bound

    def _pod_totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for need in self.request.containers:
            if need.gpus <= 0:
                continue
            for res, amount in need.per_card().items():
                totals[res] = totals.get(res, 0) + amount * need.gpus
        return totals

    def _held(self, piece: _Piece) -> dict[str, int]:
        """Per resource the pod asks for: what `piece` holds over the node's cards."""
        return {
            res: sum(piece.usage.get(card, {}).get(res, 0) for card in self.node.cards)
            for res in self._totals
        }

    def _room_left(self, piece: _Piece) -> dict[str, int] | None:
        """Per resource the pod asks for: the capacity left over the node's cards beside
        `piece`; None when a card is over capacity, where a sum would understate the room
        (a card's room cannot go below 0) and the bound would be unsound."""
        result = {}
        for res in self._totals:
            capacity = self.node.capacity.get(res, 0)
            used = [piece.usage.get(card, {}).get(res, 0) for card in self.node.cards]
            if any(amount > capacity for amount in used):
                return None
            result[res] = capacity * len(used) - sum(used)
        return result

    def frees_enough(self, chosen: frozenset[int]) -> bool:
        """False when evicting `chosen` cannot make room even counting the node's cards
        as one pool: no card choice could fit then. Never false for a set that fits (no
        card is over capacity, so evicting more only adds room linearly)."""
        if self._free_now is None:
            return True
        for res, total in self._totals.items():
            free = self._free_now[res] + sum(self._freed[i][res] for i in chosen)
            if free < total:
                return False
        return True

    # ---- the allocator

    def _merge(self, evicted: frozenset[int]) -> _Piece:
        merged = _Piece()
        merged.blocked = set(self.base.blocked)
        merged.blocks_node = self.base.blocks_node
        merged.usage = {card: dict(r) for card, r in self.base.usage.items()}
        merged.tiles = {card: set(t) for card, t in self.base.tiles.items()}
        for index, piece in enumerate(self.pieces):
            if index in evicted:
                continue
            merged.blocked |= piece.blocked
            merged.blocks_node |= piece.blocks_node
            for card, resources in piece.usage.items():
                own = merged.usage.setdefault(card, {})
                for res, amount in resources.items():
                    own[res] = own.get(res, 0) + amount
            for card, tiles in piece.tiles.items():
                merged.tiles.setdefault(card, set()).update(tiles)
        return merged

    def fit(self, evicted: frozenset[int]) -> Placement | Rejection:
        """Place the pod as if the victims at `evicted` were gone."""
        left = self._merge(evicted)
        return place(
            self.node,
            left.usage,
            self.request,
            blocked=frozenset(left.blocked),
            node_blocked=left.blocks_node,
            tiles_used={card: frozenset(t) for card, t in left.tiles.items()},
            policy=self.policy,
        )
