"""Recompute card usage from pods alone, and check it against capacity and a ledger.

The same arithmetic the ledger uses, applied statelessly to a list of pods: what the
cluster's annotations imply. Differences from a running gas's ledger are drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gas.core.holdings import PodHolding, observe_pod
from gas.core.model import (
    ANNOTATION_CARDS,
    SpecError,
    allocation_usage,
    as_mapping,
    format_tiles,
    node_from_object,
    pod_request,
    tiles_by_card,
)

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


# ---------------------------------------------------------------- invariants

IN_FLIGHT_STATES = frozenset({"reserved", "pending"})


def check_invariants(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    ledger: Mapping[str, Any] | None = None,
    *,
    require_annotations: bool = False,
) -> list[str]:
    """Every broken invariant, one line each (pure; an empty list means all hold).

    From the cluster alone: no card given beyond its capacity, no UID on two pods, no tile
    held by two pods, and (with `require_annotations`) no GPU pod bound without gas's
    annotation. With a ledger snapshot (`/debug/ledger`): every bound, non-terminal pod's
    annotation is held by the ledger on the same node and cards, the ledger holds nothing
    as bound that the cluster does not show, and its usage equals what the annotations
    imply plus its binds in flight (RESERVED/PENDING entries: see `in_flight`, not drift).
    """
    nodes = list(nodes)
    pods = list(pods)
    problems = over_capacity(nodes, usage_from_pods(pods))
    by_uid: dict[str, Mapping[str, Any]] = {}
    held: dict[str, PodHolding] = {}
    tile_holders: dict[tuple[str, str, int], list[str]] = {}
    for pod in pods:
        observation = observe_pod(pod)
        if observation is None:
            continue
        who = f"{observation.namespace}/{observation.name}"
        first = by_uid.get(observation.uid)
        if first is not None:
            other = as_mapping(first.get("metadata"))
            problems.append(
                f"uid {observation.uid} is on two pods: {other.get('namespace')}/"
                f"{other.get('name')} and {who}"
            )
            continue
        by_uid[observation.uid] = pod
        if observation.terminal:
            continue
        holding = observation.holding
        if holding is None:
            node = as_mapping(pod.get("spec")).get("nodeName")
            if require_annotations and node and _uses_gpus(pod):
                problems.append(f"pod {who} is bound to {node} without {ANNOTATION_CARDS}")
            continue
        held[observation.uid] = holding
        for card, indices in tiles_by_card(holding.tiles).items():
            for tile in indices:
                tile_holders.setdefault((holding.node, card, tile), []).append(who)
    for (node, card, tile), holders in sorted(tile_holders.items()):
        if len(holders) > 1:
            problems.append(f"{node}/{card} tile gt{tile} held by {', '.join(sorted(holders))}")
    if ledger is not None:
        problems += _ledger_problems(held, by_uid, ledger)
    return problems


def in_flight(ledger: Mapping[str, Any]) -> list[str]:
    """The ledger's binds in flight (RESERVED, PENDING), one line each: not drift."""
    lines = []
    for uid, entry in sorted(as_mapping(ledger.get("pods")).items()):
        entry = as_mapping(entry)
        if entry.get("state") in IN_FLIGHT_STATES:
            lines.append(
                f"{entry.get('state')}: {entry.get('namespace')}/{entry.get('name')} "
                f"(uid {uid}) on {entry.get('node')} cards {_cards_text(entry.get('cards'))}"
            )
    return lines


def _ledger_problems(
    held: Mapping[str, PodHolding],
    pods: Mapping[str, Mapping[str, Any]],
    ledger: Mapping[str, Any],
) -> list[str]:
    problems = []
    entries = {uid: as_mapping(e) for uid, e in as_mapping(ledger.get("pods")).items()}
    # What the ledger's usage should be: the annotations of the pods it holds as bound
    # (or does not hold at all), plus what its in-flight entries take.
    expected: NodeUsage = {}
    exact = True
    for uid, holding in sorted(held.items()):
        who = f"{holding.namespace}/{holding.name}"
        entry = entries.get(uid)
        if entry is None:
            problems.append(f"pod {who} holds {_holding_text(holding)} but the ledger has no entry")
            _add_usage(expected, holding.node, holding.usage)
            continue
        if entry.get("state") in IN_FLIGHT_STATES and entry.get("node") == holding.node:
            continue  # a bind the watch has not confirmed yet: counted with its entry below
        mine = (holding.node, _cards_text(holding.allocation), format_tiles(holding.tiles))
        theirs = (entry.get("node"), _cards_text(entry.get("cards")), entry.get("tiles") or "")
        blocked = (sorted(holding.blocked_cards), holding.blocks_node)
        if mine != theirs or blocked != (entry.get("blocked_cards"), entry.get("blocks_node")):
            problems.append(
                f"pod {who} holds {_holding_text(holding)} by its annotation, ledger has "
                f"{entry.get('state')} on {theirs[0]} cards {theirs[1]}"
            )
        if entry.get("state") not in IN_FLIGHT_STATES:
            _add_usage(expected, holding.node, holding.usage)
    for uid, entry in sorted(entries.items()):
        who = f"{entry.get('namespace')}/{entry.get('name')}"
        if entry.get("state") not in IN_FLIGHT_STATES:
            if uid not in held:
                problems.append(
                    f"ledger holds {who} (uid {uid}) as bound on {entry.get('node')}, "
                    "but the cluster shows it deleted, terminal or not bound by gas"
                )
            continue
        earlier = entry.get("earlier")
        for part in (entry, *(earlier if isinstance(earlier, list) else [])):
            part = as_mapping(part)
            if not part:
                continue
            usage = _entry_usage(pods.get(uid), part)
            if usage is None:
                exact = False  # its pod is gone: the watch will drop the entry
            else:
                _add_usage(expected, str(part.get("node")), usage)
    if exact:
        problems += drift(_nonzero(expected), _nonzero(as_mapping(ledger.get("usage"))))
    return problems


def _entry_usage(
    pod: Mapping[str, Any] | None, entry: Mapping[str, Any]
) -> dict[str, dict[str, int]] | None:
    if pod is None:
        return None
    cards = entry.get("cards")
    try:
        allocation = tuple(tuple(str(c) for c in segment) for segment in cards or [])
        return allocation_usage(pod_request(pod), allocation)
    except (SpecError, TypeError, ValueError):
        return None


def _add_usage(into: NodeUsage, node: str, usage: Mapping[str, Mapping[str, int]]) -> None:
    cards = into.setdefault(node, {})
    for card, resources in usage.items():
        per_card = cards.setdefault(card, {})
        for res, amount in resources.items():
            per_card[res] = per_card.get(res, 0) + amount


def _nonzero(usage: Mapping[str, Any]) -> NodeUsage:
    result: NodeUsage = {}
    for node, cards in usage.items():
        kept = {
            card: {res: amount for res, amount in as_mapping(resources).items() if amount}
            for card, resources in as_mapping(cards).items()
        }
        kept = {card: resources for card, resources in kept.items() if resources}
        if kept:
            result[node] = kept
    return result


def _uses_gpus(pod: Mapping[str, Any]) -> bool:
    try:
        return pod_request(pod).needs_gpu
    except SpecError:
        return True


def _cards_text(cards: object) -> str:
    if not isinstance(cards, list | tuple):
        return repr(cards)
    return "|".join(",".join(str(c) for c in segment) for segment in cards)


def _holding_text(holding: PodHolding) -> str:
    if holding.blocks_node:
        return f"the whole of {holding.node} (unreadable annotation)"
    return f"{_cards_text(holding.allocation)} on {holding.node}"
