"""What the node side handed out next to what gas decided, per pod and container (pure).

gas writes its decision into `gas-container-cards` at bind time; the node agent writes the
cards it gave each container into `gas-node-cards` (same format: one `|`-separated segment
per `spec.containers` entry, cards comma-separated inside) once the kubelet has allocated
them. A container whose two segments differ is drift: gas's books say one card carries it,
while it runs on another. A pod without `gas-node-cards` has not been handed anything yet
(or its node runs another device plugin): nothing to compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_NODE_CARDS,
    Allocation,
    SpecError,
    as_list,
    as_mapping,
    parse_cards,
    sort_cards,
)
from gas.tools.inspector.report import AllocationFinding

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass
class Handouts:
    """Per node and card: the pods the node side handed the card to, and the pods whose
    hand-out and decision disagree on it."""

    handed: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    drifting: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    findings: list[AllocationFinding] = field(default_factory=list)

    def add(self, table: dict[str, dict[str, list[str]]], node: str, card: str, who: str) -> None:
        pods = table.setdefault(node, {}).setdefault(card, [])
        if who not in pods:
            pods.append(who)


def _short(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:77] + "...")


def _container_names(pod: Mapping[str, Any]) -> list[str]:
    containers = as_list(as_mapping(pod.get("spec")).get("containers"))
    return [str(as_mapping(c).get("name") or f"#{i}") for i, c in enumerate(containers)]


def _decision(annotations: Mapping[str, Any], containers: int) -> tuple[bool, Allocation | None]:
    """(readable, gas's allocation): None when gas decided nothing; not readable when the
    annotation cannot be read (the allocation report names that problem already)."""
    value = annotations.get(ANNOTATION_CARDS)
    if value is None:
        return True, None
    try:
        return True, parse_cards(str(value), containers)
    except SpecError:
        return False, None


def _cards(cards: tuple[str, ...]) -> str:
    return ", ".join(sort_cards(cards)) or "no card"


def compare_pods(pods: list[Mapping[str, Any]]) -> Handouts:
    """The hand-outs of every bound, running-or-pending pod that carries `gas-node-cards`."""
    result = Handouts()
    for pod in pods:
        metadata = as_mapping(pod.get("metadata"))
        annotations = as_mapping(metadata.get("annotations"))
        value = annotations.get(ANNOTATION_NODE_CARDS)
        node = as_mapping(pod.get("spec")).get("nodeName")
        phase = as_mapping(pod.get("status")).get("phase")
        if value is None or not isinstance(node, str) or not node or phase in TERMINAL_PHASES:
            continue
        who = f"{metadata.get('namespace') or 'default'}/{metadata.get('name')}"
        names = _container_names(pod)
        try:
            handed = parse_cards(str(value), len(names))
        except SpecError:
            result.findings.append(
                AllocationFinding(
                    "annotation",
                    f"pod {who} on {node}: {ANNOTATION_NODE_CARDS}={_short(str(value))} "
                    "cannot be read; what the node handed out is unknown",
                    node=node,
                    pod=who,
                )
            )
            continue
        for cards in handed:
            for card in cards:
                result.add(result.handed, node, card, who)
        readable, decided = _decision(annotations, len(names))
        if not readable:
            continue
        for index, name in enumerate(names):
            got = handed[index]
            wanted = () if decided is None else decided[index]
            if set(got) == set(wanted):
                continue
            for card in set(got) ^ set(wanted):
                result.add(result.drifting, node, card, who)
            chose = "gas decided nothing" if decided is None else f"gas decided {_cards(wanted)}"
            result.findings.append(
                AllocationFinding(
                    "node_drift",
                    f"pod {who} on {node}, container {name}: {chose}, the node handed out "
                    f"{_cards(got)}",
                    node=node,
                    pod=who,
                )
            )
    return result
