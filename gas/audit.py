"""Recompute card usage from pods alone, and check it against capacity and a ledger.

The same arithmetic the ledger uses, applied statelessly to a list of pods: what the
cluster's annotations imply. Differences from a running gas's ledger are drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gas.ledger import observe_pod
from gas.model import node_from_object

NodeUsage = dict[str, dict[str, dict[str, int]]]
"""node -> card -> resource -> amount"""


def usage_from_pods(pods: Iterable[Mapping[str, Any]]) -> NodeUsage:
    """Usage implied by the bound, non-terminal pods that carry gas's annotation."""
    usage: NodeUsage = {}
    for pod in pods:
        observation = observe_pod(pod)
        if observation is None or observation.terminal or observation.holding is None:
            continue
        holding = observation.holding
        cards = usage.setdefault(holding.node, {})
        for card, resources in holding.usage.items():
            per_card = cards.setdefault(card, {})
            for res, amount in resources.items():
                if amount:  # the ledger keeps no zero entries; neither do we
                    per_card[res] = per_card.get(res, 0) + amount
            if not per_card:
                del cards[card]
        if not cards:
            del usage[holding.node]
    return usage


def over_capacity(nodes: Iterable[Mapping[str, Any]], usage: NodeUsage) -> list[str]:
    """One line per card resource given out beyond the card's capacity."""
    problems = []
    capacities = {n.name: n for n in map(node_from_object, nodes)}
    for node_name, cards in sorted(usage.items()):
        node = capacities.get(node_name)
        for card, resources in sorted(cards.items()):
            for res, amount in sorted(resources.items()):
                capacity = node.capacity.get(res, 0) if node else 0
                if node is None or card not in node.cards or amount > capacity:
                    problems.append(f"{node_name}/{card} {res}: {amount} given, {capacity} exist")
    return problems


def drift(expected: NodeUsage, ledger_usage: Mapping[str, Any]) -> list[str]:
    """Differences between usage recomputed from pods and a ledger's usage snapshot."""
    problems = []
    for node in sorted(set(expected) | set(ledger_usage)):
        want = expected.get(node, {})
        have = ledger_usage.get(node, {})
        if want != have:
            problems.append(f"{node}: pods imply {want}, ledger holds {have}")
    return problems
