"""Node scores for the prioritize verb, and the fragmentation measure. Pure functions.

`node_score` places the pod as bind would and scores the node 0..10 by how full its usable
cards would then be (`binpack`; 10 minus that for `spread`; 0 everywhere for `first-fit`).
`placeable_pods` counts how many more pods of each of `POD_SIZES` each node could take;
`PlaceableMemo` does the same across calls, computing again only the nodes that changed. The
exact rules: docs/scoring.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from gas.core.allocator import Policy, Rejection, place
from gas.core.model import (
    BINPACK,
    FIRST_FIT,
    I915,
    RESOURCE_PREFIX,
    XE,
    Allocation,
    ContainerNeed,
    NodeGpu,
    PodRequest,
    Usage,
    allocation_usage,
)

SCORE_MAX = 10
MEMORY_MAX = RESOURCE_PREFIX + "memory.max"
MAX_PLACEABLE = 1000
"""Placements tried per node and size; a bound for absurd capacities."""


# ---------------------------------------------------------------- node scores


def asked_resources(node: NodeGpu, request: PodRequest) -> list[str]:
    """The resources the pod needs on its cards and the node has capacity of."""
    names = {
        res
        for need in request.containers
        if need.gpus > 0
        for res, amount in need.per_card().items()
        if amount > 0 and node.capacity.get(res, 0) > 0
    }
    return sorted(names)


def fullness(
    node: NodeGpu, usage: Usage, request: PodRequest, allocation: Allocation
) -> Fraction | None:
    """The fraction of the node's usable card capacity in use once `allocation` is added,
    averaged over the resources the pod asks for; None when there is nothing to measure."""
    after = _added(usage, allocation_usage(request, allocation))
    resources = asked_resources(node, request)
    cards = [card for card in node.cards if card not in node.disabled]
    if not resources or not cards:
        return None
    total = Fraction(0)
    for res in resources:
        capacity = node.capacity[res]
        used = sum(min(after.get(card, {}).get(res, 0), capacity) for card in cards)
        total += Fraction(used, capacity * len(cards))
    return total / len(resources)


def node_score(
    node: NodeGpu, usage: Usage, request: PodRequest, allocation: Allocation, policy: Policy
) -> int:
    """The score of a node the pod fits on with `allocation` (docs/scoring.md)."""
    mode = policy.placement_for(request)
    if mode == FIRST_FIT:
        return 0
    full = fullness(node, usage, request, allocation)
    if full is None:
        return 0
    packed = math.floor(full * SCORE_MAX + Fraction(1, 2))
    return packed if mode == BINPACK else SCORE_MAX - packed


def score(node: NodeGpu, usage: Usage, request: PodRequest, policy: Policy) -> int:
    """Place the pod on an otherwise unconstrained node and score it; 0 when it does not fit."""
    result = place(node, usage, request, policy=policy)
    if isinstance(result, Rejection):
        return 0
    return node_score(node, usage, request, result.cards, policy)


def _added(usage: Usage, more: Usage) -> dict[str, dict[str, int]]:
    result = {card: dict(resources) for card, resources in usage.items()}
    for card, resources in more.items():
        own = result.setdefault(card, {})
        for res, amount in resources.items():
            own[res] = own.get(res, 0) + amount
    return result


# ---------------------------------------------------------------- fragmentation


@dataclass(frozen=True)
class PodSize:
    name: str
    cards: int
    share: Fraction
    """Of one card's memory.max, on each of the pod's cards."""


POD_SIZES = (
    PodSize("quarter-card", 1, Fraction(1, 4)),
    PodSize("half-card", 1, Fraction(1, 2)),
    PodSize("one-card", 1, Fraction(1)),
    PodSize("two-cards", 2, Fraction(1)),
)


def size_request(node: NodeGpu, size: PodSize) -> PodRequest:
    """A one-container pod of `size` on `node`'s cards."""
    count = XE if node.capacity.get(XE, 0) > 0 and node.capacity.get(I915, 0) <= 0 else I915
    requests = {count: size.cards}
    memory = node.capacity.get(MEMORY_MAX, 0)
    if memory > 0:
        requests[MEMORY_MAX] = max(1, math.floor(memory * size.share)) * size.cards
    return PodRequest(containers=(ContainerNeed(size.name, size.cards, requests),))


def placeable(
    node: NodeGpu,
    usage: Usage,
    size: PodSize,
    *,
    blocked: frozenset[str] = frozenset(),
    node_blocked: bool = False,
) -> int:
    """How many more pods of `size` fit on `node`, placed one after another."""
    request = size_request(node, size)
    current = {card: dict(resources) for card, resources in usage.items()}
    count = 0
    while count < MAX_PLACEABLE:
        result = place(node, current, request, blocked=blocked, node_blocked=node_blocked)
        if isinstance(result, Rejection):
            break
        current = _added(current, allocation_usage(request, result.cards))
        count += 1
    return count


def placeable_pods(
    nodes: Iterable[NodeGpu],
    usage: Mapping[str, Usage],
    blocked: Mapping[str, frozenset[str]] | None = None,
    blocked_nodes: frozenset[str] = frozenset(),
    sizes: Iterable[PodSize] = POD_SIZES,
) -> dict[str, dict[str, int]]:
    """Per node name (sorted): size name -> pods of that size still placeable there."""
    return PlaceableMemo(sizes).placeable_pods(nodes, usage, blocked, blocked_nodes)


def cluster_placeable(
    per_node: Mapping[str, Mapping[str, int]], sizes: Iterable[PodSize] = POD_SIZES
) -> dict[str, int]:
    """Size name -> placeable pods summed over the nodes (each size counted alone)."""
    return {
        size.name: sum(counts.get(size.name, 0) for counts in per_node.values()) for size in sizes
    }


@dataclass(frozen=True)
class _Counted:
    """One node's counts and what they were computed from."""

    node: NodeGpu
    usage: Usage
    blocked: frozenset[str]
    node_blocked: bool
    counts: dict[str, int]


class PlaceableMemo:
    """`placeable_pods` across calls, each node computed again only when its inputs
    changed: the node object (by identity: the ledger replaces it when the node changes),
    its usage, blocked cards or whole-node block. Between two scrapes few nodes change.

    Safe for concurrent calls without a lock: each call reads the memory as it finds it
    and replaces it whole with its own; a node whose kept inputs differ from a call's is
    computed again, so a race costs work, never a wrong count."""

    def __init__(self, sizes: Iterable[PodSize] = POD_SIZES) -> None:
        self._sizes = tuple(sizes)
        self._counted: dict[str, _Counted] = {}
        self.computed = 0
        """Nodes computed (not taken from the memory) since the memo was made."""

    def placeable_pods(
        self,
        nodes: Iterable[NodeGpu],
        usage: Mapping[str, Usage],
        blocked: Mapping[str, frozenset[str]] | None = None,
        blocked_nodes: frozenset[str] = frozenset(),
    ) -> dict[str, dict[str, int]]:
        """As `placeable_pods`. The usages are kept, so they must not change afterwards."""
        blocked = blocked or {}
        known = self._counted
        counted: dict[str, _Counted] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            used = usage.get(node.name, {})
            cards = blocked.get(node.name, frozenset())
            whole = node.name in blocked_nodes
            kept = known.get(node.name)
            if (
                kept is None
                or kept.node is not node
                or kept.node_blocked != whole
                or kept.blocked != cards
                or kept.usage != used
            ):
                counts = {
                    size.name: placeable(node, used, size, blocked=cards, node_blocked=whole)
                    for size in self._sizes
                }
                kept = _Counted(node, used, cards, whole, counts)
                self.computed += 1
            counted[node.name] = kept
        self._counted = counted
        return {name: dict(kept.counts) for name, kept in counted.items()}
