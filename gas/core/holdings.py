"""What a pod holds on its node, read from its annotations (or a bind), and the pod as the
ledger observes it.

Parsing happens here, off the ledger's lock. An annotation that cannot be read fails
closed: the cards it names (else the whole node) count as full until the pod goes away,
and a warning says so.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    Allocation,
    SpecError,
    TileAllocation,
    allocation_usage,
    as_mapping,
    is_card_name,
    parse_cards,
    parse_tiles,
    pod_request,
)

# The ledger's accounting warnings keep the logger they had before parsing moved here:
# operators' log filters name it.
log = logging.getLogger("gas.core.ledger")

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


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
