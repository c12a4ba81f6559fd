"""Card choice: which cards of one node each container of a pod gets, or why none fit.

Pure functions of (node capacity, node usage, pod request): no I/O, no locks, no clock.

The search is first fit in numeric card order, as GAS does, so wherever GAS finds cards gas
finds the same ones. Where first fit fails on a multi-container pod, a bounded backtracking
search tries the other card choices, so a node is only dropped when no set of cards fits
(or the search budget runs out, which only an absurd pod can cause).

A rejection says whether waiting can help: `unresolvable` means the pod would not fit on
this node even with every card idle, so preemption is pointless there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from gas.model import Allocation, ContainerNeed, NodeGpu, PodRequest, Usage

SEARCH_BUDGET = 20_000
"""Card combinations tried per pod and node before giving up."""


@dataclass(frozen=True)
class Rejection:
    reason: str
    unresolvable: bool


NODE_BLOCKED = "gpu: node has a pod with an unreadable gas-container-cards annotation"


def allocate(
    node: NodeGpu,
    usage: Usage,
    request: PodRequest,
    *,
    blocked: frozenset[str] = frozenset(),
    node_blocked: bool = False,
    order: Sequence[str] | None = None,
) -> Allocation | Rejection:
    """Cards per container for `request` on `node`, or the reason it does not fit.

    `blocked` cards count as full (an annotation naming them could not be read);
    `node_blocked` makes every card full. `order` overrides the numeric card order.
    """
    if node.problem is not None:
        return Rejection(node.problem, unresolvable=True)
    static = _static_check(node, request)
    if static is not None:
        return static
    if not request.needs_gpu:
        return tuple(() for _ in request.containers)
    if node_blocked:
        return Rejection(NODE_BLOCKED, unresolvable=False)
    cards = node.cards
    if order is not None:
        # Only the node's own cards, each once, whatever the caller's order names.
        own = set(node.cards)
        cards = tuple(c for c in dict.fromkeys(order) if c in own)
    found = _search(node, usage, request, cards, blocked)
    if found is not None:
        return found
    if _search(node, {}, request, node.cards, frozenset()) is None:
        return Rejection(
            "gpu: pod does not fit on this node even with all its cards idle", unresolvable=True
        )
    return Rejection(_shortage(node, usage, request, blocked), unresolvable=False)


def _static_check(node: NodeGpu, request: PodRequest) -> Rejection | None:
    """Reasons that hold whatever the usage: missing resources, too few cards."""
    for need in request.containers:
        if need.gpus == 0:
            continue
        if need.gpus > len(node.cards):
            return Rejection(
                f"gpu: container asks for {need.gpus} cards, node has {len(node.cards)}",
                unresolvable=True,
            )
        for res, amount in need.per_card().items():
            capacity = node.capacity.get(res, 0)
            if capacity <= 0:
                return Rejection(f"gpu: node has no {res} per card", unresolvable=True)
            if amount > capacity:
                return Rejection(
                    f"gpu: container needs more {res} per card than a card has",
                    unresolvable=True,
                )
    return None


class _Budget:
    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _search(
    node: NodeGpu,
    usage: Usage,
    request: PodRequest,
    cards: Sequence[str],
    blocked: frozenset[str],
) -> Allocation | None:
    working: dict[str, dict[str, int]] = {}
    needs = request.containers
    budget = _Budget(SEARCH_BUDGET)
    chosen: list[tuple[str, ...]] = []

    def used(card: str, res: str) -> int:
        own = working.get(card)
        if own is not None and res in own:
            return own[res]
        return usage.get(card, {}).get(res, 0)

    def fits(card: str, per_card: Mapping[str, int]) -> bool:
        return all(
            used(card, res) + amount <= node.capacity.get(res, 0)
            for res, amount in per_card.items()
        )

    def apply(picked: tuple[str, ...], per_card: Mapping[str, int], sign: int) -> None:
        for card in picked:
            own = working.setdefault(card, {})
            for res, amount in per_card.items():
                own[res] = used(card, res) + sign * amount

    def options(need: ContainerNeed) -> Iterator[tuple[str, ...]]:
        if need.gpus == 0:
            yield ()
            return
        per_card = need.per_card()
        eligible = (c for c in cards if c not in blocked and fits(c, per_card))
        if need.gpus == 1:
            # Lazily: first fit usually stops at the first free card.
            yield from ((card,) for card in eligible)
        else:
            yield from combinations(list(eligible), need.gpus)

    def place(index: int) -> bool:
        if index == len(needs):
            return True
        need = needs[index]
        per_card = need.per_card()
        for picked in options(need):
            if not budget.spend():
                return False
            apply(picked, per_card, +1)
            chosen.append(picked)
            if place(index + 1):
                return True
            chosen.pop()
            apply(picked, per_card, -1)
        return False

    return tuple(chosen) if place(0) else None


def _shortage(node: NodeGpu, usage: Usage, request: PodRequest, blocked: frozenset[str]) -> str:
    """A short, stable reason naming the resource that keeps the most cards out."""
    counts: dict[str, int] = {}
    for need in request.containers:
        if need.gpus == 0:
            continue
        for card in node.cards:
            if card in blocked:
                counts["blocked"] = counts.get("blocked", 0) + 1
                continue
            for res, amount in need.per_card().items():
                if usage.get(card, {}).get(res, 0) + amount > node.capacity.get(res, 0):
                    counts[res] = counts.get(res, 0) + 1
    if not counts:
        return "gpu: not enough free cards for every container of the pod"
    worst = max(sorted(counts), key=lambda res: counts[res])
    if worst == "blocked":
        return "gpu: cards are held by a pod with an unreadable gas-container-cards annotation"
    return f"gpu: not enough free {worst} on the node's cards"
