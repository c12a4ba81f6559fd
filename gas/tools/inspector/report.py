"""The allocation report: what pod annotations give out on every node's cards (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    GPU_COUNT_RESOURCES,
    RESOURCE_PREFIX,
    NodeGpu,
    SpecError,
    as_mapping,
    card_number,
    node_from_object,
    pod_request,
    sort_cards,
)
from gas.core.quantity import format_quantity

NODE_MISSING = "node does not exist"


@dataclass
class CardView:
    """One card of a node: what it gives out against what it has, and who holds it."""

    name: str
    listed: bool
    resources: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Short resource name -> (allocated, capacity)."""
    pods: list[str] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)
    handed_out: list[str] = field(default_factory=list)
    """Pods the node side handed this card to (`gas-node-cards`)."""
    node_drift: list[str] = field(default_factory=list)
    """Pods whose hand-out and gas's decision disagree on this card."""

    @property
    def over_capacity(self) -> bool:
        if not self.listed:
            return bool(self.resources)
        return any(allocated > capacity for allocated, capacity in self.resources.values())


@dataclass
class NodeView:
    """One node shown, with its cards in numeric order."""

    name: str
    problem: str | None
    cards: list[CardView] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AllocationFinding:
    """A problem or warning of the allocation report, with the node, card and pod it is
    about (None where it is about none)."""

    kind: str
    message: str
    node: str | None = None
    card: str | None = None
    pod: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node": self.node,
            "card": self.card,
            "pod": self.pod,
            "message": self.message,
        }


@dataclass
class AllocationReport:
    """What the pods' annotations give out on every node's cards, and what is wrong."""

    nodes: list[NodeView]
    pods: int
    nodes_without_gpus: int
    problems: list[AllocationFinding]
    warnings: list[AllocationFinding]
    drift_url: str | None = None
    drift: list[str] = field(default_factory=list)
    placeable: dict[str, dict[str, int]] | None = None
    """Node -> pod size -> more pods of that size that fit (`gas.core.scoring.placeable_pods`);
    None unless asked for (`--placeable`)."""

    @property
    def resources(self) -> list[str]:
        """Every resource shown, GPU counts first."""
        names = {r for node in self.nodes for card in node.cards for r in card.resources}
        return sorted(names, key=resource_order)

    def totals(self) -> dict[str, tuple[int, int]]:
        sums: dict[str, tuple[int, int]] = {}
        for node in self.nodes:
            for card in node.cards:
                for res, (allocated, capacity) in card.resources.items():
                    had = sums.get(res, (0, 0))
                    sums[res] = (had[0] + allocated, had[1] + capacity)
        return {res: sums[res] for res in sorted(sums, key=resource_order)}

    @property
    def card_count(self) -> int:
        return sum(1 for node in self.nodes for card in node.cards if card.listed)

    @property
    def failed(self) -> bool:
        return bool(self.problems or self.drift)

    @property
    def handouts_seen(self) -> bool:
        """Whether any card shown was handed out by a node side that reports it."""
        return any(card.handed_out or card.node_drift for n in self.nodes for card in n.cards)


def build_report(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    only_node: str | None = None,
    placeable: bool = False,
) -> AllocationReport:
    """What the annotations of `pods` give out on the cards of `nodes` (pure)."""
    # Imported when used: `gas` imports this module to build its parser on every start.
    from gas.core.holdings import observe_pod
    from gas.tools.audit import usage_from_pods
    from gas.tools.inspector.handout import compare_pods

    gpus = {gpu.name: gpu for gpu in map(node_from_object, nodes)}
    gpu_like = {_name(obj) for obj in nodes if _looks_like_gpu_node(obj)}
    usage = usage_from_pods(pods)

    holders: dict[str, dict[str, list[str]]] = {}  # node -> card -> pods
    card_blockers: dict[str, dict[str, list[str]]] = {}
    node_blockers: dict[str, list[str]] = {}
    holding_pods: dict[str, set[str]] = {}  # node -> pod UIDs
    problems: list[AllocationFinding] = []
    warnings: list[AllocationFinding] = []
    for pod in pods:
        observation = observe_pod(pod)
        if observation is None or observation.terminal:
            continue
        who = f"{observation.namespace}/{observation.name}"
        holding = observation.holding
        if holding is None:
            node = as_mapping(pod.get("spec")).get("nodeName")
            if isinstance(node, str) and node and _uses_gpus(pod):
                warnings.append(
                    AllocationFinding(
                        "unaccounted",
                        f"pod {who} on {node} uses GPUs but has no {ANNOTATION_CARDS} "
                        "annotation: gas does not account it (scheduled around the extender?)",
                        node=node,
                        pod=who,
                    )
                )
            continue
        holding_pods.setdefault(holding.node, set()).add(holding.uid)
        cards = {c for segment in holding.allocation for c in segment} | set(holding.usage)
        for card in cards:
            holders.setdefault(holding.node, {}).setdefault(card, []).append(who)
        if holding.blocked_cards or holding.blocks_node:
            for card in holding.blocked_cards:
                card_blockers.setdefault(holding.node, {}).setdefault(card, []).append(who)
            if holding.blocks_node:
                node_blockers.setdefault(holding.node, []).append(who)
            # Readable cards with blocked ones: the cards were accounted and it is the
            # tiles annotation that could not be read.
            annotation = ANNOTATION_TILES if holding.allocation else ANNOTATION_CARDS
            value = as_mapping(as_mapping(pod.get("metadata")).get("annotations")).get(annotation)
            held = ", ".join(sort_cards(holding.blocked_cards)) or "the whole node"
            problems.append(
                AllocationFinding(
                    "annotation",
                    f"pod {who} on {holding.node}: {annotation}={_short(value)} "
                    f"cannot be read; gas counts {held} as full",
                    node=holding.node,
                    pod=who,
                )
            )

    handouts = compare_pods(list(pods))
    problems.extend(handouts.findings)
    if only_node is not None:
        shown = {only_node}
    else:
        shown = gpu_like | set(usage) | set(holders) | set(node_blockers) | set(handouts.handed)
        shown |= {name for name, gpu in gpus.items() if gpu.cards}
    views = []
    for name in sorted(shown):
        gpu = gpus.get(name) or NodeGpu(name=name, problem=NODE_MISSING)
        view = _node_view(
            gpu,
            usage.get(name, {}),
            holders.get(name, {}),
            card_blockers.get(name, {}),
            node_blockers.get(name, []),
        )
        _add_handouts(view, handouts.handed.get(name, {}), handouts.drifting.get(name, {}))
        views.append(view)
        if gpu.problem is not None and gpu.problem != NODE_MISSING:
            warnings.append(AllocationFinding("node", f"{name}: {gpu.problem}", node=name))
        problems.extend(_capacity_findings(view))

    fragmentation = None
    if placeable:
        from gas.core.scoring import placeable_pods

        fragmentation = placeable_pods(
            [gpus[v.name] for v in views if v.name in gpus and gpus[v.name].cards],
            usage,
            {node: frozenset(cards) for node, cards in card_blockers.items()},
            frozenset(node_blockers),
        )
    return AllocationReport(
        placeable=fragmentation,
        nodes=views,
        pods=sum(len(holding_pods.get(view.name, ())) for view in views),
        nodes_without_gpus=len({_name(obj) for obj in nodes} - shown),
        problems=sorted(problems, key=_finding_order),
        warnings=sorted(warnings, key=_finding_order),
    )


def _node_view(
    gpu: NodeGpu,
    usage: Mapping[str, Mapping[str, int]],
    holders: Mapping[str, list[str]],
    blockers: Mapping[str, list[str]],
    node_blockers: list[str],
) -> NodeView:
    view = NodeView(gpu.name, gpu.problem, blocked_by=sorted(node_blockers))
    listed = set(gpu.cards)
    # A blocked card the node does not have holds nothing, so it gets no row.
    names = listed | set(usage) | set(holders) | (set(blockers) & listed)
    for card in sort_cards(names):
        card_view = CardView(card, card in listed)
        card_usage = usage.get(card, {})
        resources = set(card_usage) | (set(gpu.capacity) if card_view.listed else set())
        for res in sorted(resources):
            capacity = gpu.capacity.get(res, 0) if card_view.listed else 0
            card_view.resources[_short_resource(res)] = (card_usage.get(res, 0), capacity)
        card_view.pods = sorted(holders.get(card, []))
        card_view.blocked_by = sorted(blockers.get(card, []))
        view.cards.append(card_view)
    return view


def _add_handouts(
    view: NodeView, handed: Mapping[str, list[str]], drifting: Mapping[str, list[str]]
) -> None:
    """Each card's hand-outs; a card only the node side names gets a row of its own."""
    rows = {card.name: card for card in view.cards}
    for name in set(handed) | set(drifting):
        if name not in rows:
            rows[name] = CardView(name, listed=False)
    for name, card in rows.items():
        card.handed_out = sorted(handed.get(name, []))
        card.node_drift = sorted(drifting.get(name, []))
    view.cards = [rows[name] for name in sort_cards(rows)]


def _capacity_findings(view: NodeView) -> list[AllocationFinding]:
    findings = []
    for card in view.cards:
        where = f"{view.name}/{card.name}"
        if not card.listed:
            if card.over_capacity:
                why = view.problem or "not a card of the node's labels"
                findings.append(
                    AllocationFinding(
                        "over_capacity",
                        f"{where}: held by {', '.join(card.pods)}, but the card is unknown ({why})",
                        node=view.name,
                        card=card.name,
                    )
                )
            continue
        for res, (allocated, capacity) in card.resources.items():
            if allocated > capacity:
                findings.append(
                    AllocationFinding(
                        "over_capacity",
                        f"{where}: {res} {format_amount(res, allocated)} allocated, "
                        f"capacity {format_amount(res, capacity)}",
                        node=view.name,
                        card=card.name,
                    )
                )
    return findings


def _looks_like_gpu_node(node: Mapping[str, Any]) -> bool:
    labels = as_mapping(as_mapping(node.get("metadata")).get("labels"))
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    return any(str(key).startswith(RESOURCE_PREFIX) for key in (*labels, *allocatable))


def _uses_gpus(pod: Mapping[str, Any]) -> bool:
    try:
        return pod_request(pod).needs_gpu
    except SpecError:
        # Only GPU requests or a missing container list make a pod unreadable here: a
        # bound pod with broken GPU requests is worth a look too.
        return True


def _name(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("name") or "")


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _short_resource(resource: str) -> str:
    return resource.removeprefix(RESOURCE_PREFIX)


def resource_order(short: str) -> tuple[int, str]:
    """Sort key of a short resource name: the GPU counts first, then by name."""
    gpu_counts = [_short_resource(r) for r in GPU_COUNT_RESOURCES]
    return (gpu_counts.index(short), short) if short in gpu_counts else (len(gpu_counts), short)


def _finding_order(finding: AllocationFinding) -> tuple[str, int, str, str, str]:
    card = card_number(finding.card) if finding.card else -1
    return (finding.node or "", card, finding.pod or "", finding.kind, finding.message)


def format_amount(resource: str, value: int) -> str:
    """An amount as shown: memory in binary units (`5Gi`), others as integers."""
    # Only memory is counted in bytes; binary suffixes on millicores would mislead.
    return format_quantity(value) if resource.startswith("memory") else str(value)
