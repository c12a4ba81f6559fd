"""The resource model: what a node's GPU cards offer and what a pod asks of them.

Everything here is pure: it reads plain Kubernetes JSON objects (dicts, as they come over
the wire) and returns immutable values. Per-card capacity is the node's allocatable divided
by its card count, rounded down; a container's per-card need is its request divided by its
GPU count, rounded up. Rounding both ways against the pod means a card is never promised
more than it has (GAS truncates the need, which can under-count a pod by a remainder).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gas.quantity import QuantityError, parse_quantity

RESOURCE_PREFIX = "gpu.intel.com/"
I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"
GPU_COUNT_RESOURCES = (I915, XE)

LABEL_GPU_NUMBERS = "gpu.intel.com/gpu-numbers"
LABEL_CARDS = "gpu.intel.com/cards"
SPLIT_LABEL_MARK = "Z"

ANNOTATION_TS = "gas-ts"
ANNOTATION_CARDS = "gas-container-cards"
ANNOTATION_TILES = "gas-container-tiles"

# More cards than this in one label is a broken label, not a real machine.
MAX_CARDS_PER_NODE = 256
MAX_GPUS_PER_CONTAINER = 64

_CARD_NAME = re.compile(r"^card(0|[1-9][0-9]{0,5})$")
_GPU_NUMBER = re.compile(r"^(0|[1-9][0-9]{0,5})$")

Usage = Mapping[str, Mapping[str, int]]
"""Per card name: resource name -> amount given out."""


class SpecError(ValueError):
    """A node or pod whose GPU description cannot be read; the message is a filter reason."""


def card_number(card: str) -> int:
    """The N of `cardN`; names that are not `cardN` sort after every real card."""
    match = _CARD_NAME.match(card)
    return int(match.group(1)) if match else 1 << 30


def sort_cards(cards: Iterable[str]) -> tuple[str, ...]:
    """Numeric card order: card2 before card10 (GAS sorts as strings)."""
    return tuple(sorted(cards, key=lambda c: (card_number(c), c)))


def is_card_name(name: str) -> bool:
    return _CARD_NAME.match(name) is not None


# ---------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeGpu:
    """What one node offers: its cards in numeric order and each card's capacity.

    `problem` is set when the node's labels or allocatable cannot be read; such a node
    hosts no GPU pod and `problem` is the reason given to the scheduler.
    """

    name: str
    cards: tuple[str, ...] = ()
    capacity: Mapping[str, int] = field(default_factory=dict)
    problem: str | None = None


def read_split_label(labels: Mapping[str, str], key: str) -> str:
    """A label whose value may continue in `key2`, `key3`, ... each prefixed with `Z`.

    Label values are limited to 63 characters, so long card lists are split this way by
    the GPU node labelling tools. A continuation without the prefix is an error.
    """
    value = labels.get(key, "")
    index = 2
    while (part := labels.get(f"{key}{index}")) is not None:
        if not part.startswith(SPLIT_LABEL_MARK):
            raise SpecError(f"gpu: node label {key}{index} does not start with {SPLIT_LABEL_MARK}")
        value += part[1:]
        index += 1
    return value


def node_cards(labels: Mapping[str, str]) -> tuple[str, ...]:
    """Card names from `gpu-numbers` (`0.1.2`), else from `cards` (`card0.card1`)."""
    numbers = read_split_label(labels, LABEL_GPU_NUMBERS)
    if numbers:
        parts = numbers.split(".")
        if not all(_GPU_NUMBER.match(p) for p in parts):
            raise SpecError(f"gpu: node label {LABEL_GPU_NUMBERS} is malformed")
        cards = [f"card{p}" for p in parts]
    else:
        value = labels.get(LABEL_CARDS, "")
        if not value:
            raise SpecError(f"gpu: node has no {LABEL_GPU_NUMBERS} or {LABEL_CARDS} label")
        cards = value.split(".")
        if not all(is_card_name(c) for c in cards):
            raise SpecError(f"gpu: node label {LABEL_CARDS} is malformed")
    if len(set(cards)) != len(cards):
        raise SpecError("gpu: node label lists a card twice")
    if len(cards) > MAX_CARDS_PER_NODE:
        raise SpecError("gpu: node label lists too many cards")
    return sort_cards(cards)


def node_from_object(node: Mapping[str, Any]) -> NodeGpu:
    """Read a v1.Node (JSON dict). Never raises: an unreadable node carries a problem."""
    metadata = as_mapping(node.get("metadata"))
    name = metadata.get("name")
    name = name if isinstance(name, str) else ""
    try:
        labels = _string_map(metadata.get("labels"), "node labels")
        cards = node_cards(labels)
        allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
        capacity: dict[str, int] = {}
        for resource, quantity in allocatable.items():
            if not isinstance(resource, str) or not resource.startswith(RESOURCE_PREFIX):
                continue
            try:
                capacity[resource] = parse_quantity(quantity) // len(cards)
            except QuantityError as exc:
                raise SpecError(f"gpu: node allocatable {resource} is malformed") from exc
    except SpecError as exc:
        return NodeGpu(name=name, problem=str(exc))
    return NodeGpu(name=name, cards=cards, capacity=capacity)


# ---------------------------------------------------------------- pods


@dataclass(frozen=True)
class ContainerNeed:
    """One app container's GPU ask: how many distinct cards, and its total requests."""

    name: str
    gpus: int
    requests: Mapping[str, int]

    def per_card(self, cards: int | None = None) -> Mapping[str, int]:
        """The need on each of `cards` cards (default: its GPU count), rounded up."""
        if not cards or cards == self.gpus:
            return self._own_per_card
        return {res: -(-amount // cards) for res, amount in self.requests.items()}

    @functools.cached_property
    def _own_per_card(self) -> Mapping[str, int]:
        # Asked for once per node and card by the allocator: computed once per pod.
        divisor = max(self.gpus, 1)
        return {res: -(-amount // divisor) for res, amount in self.requests.items()}


@dataclass(frozen=True)
class PodRequest:
    """A pod's GPU asks, one entry per app container in spec order."""

    containers: tuple[ContainerNeed, ...]

    @property
    def needs_gpu(self) -> bool:
        return any(c.gpus > 0 for c in self.containers)


Allocation = tuple[tuple[str, ...], ...]
"""Card names per app container, in spec order."""


def gpu_count(requests: Mapping[str, int]) -> int:
    """`xe` is the card count when asked for, else `i915` (as GAS)."""
    xe = requests.get(XE, 0)
    return xe if xe > 0 else requests.get(I915, 0)


def container_requests(container: Mapping[str, Any], kind: str = "container") -> dict[str, int]:
    """The `gpu.intel.com/*` requests of a container, limits filling in absent requests.

    The API server copies extended-resource limits into requests, but objects built by
    hand (or by a test) may carry only limits.
    """
    resources = as_mapping(container.get("resources"))
    limits = as_mapping(resources.get("limits"))
    requests = as_mapping(resources.get("requests"))
    merged = {**limits, **requests}
    result: dict[str, int] = {}
    for resource, quantity in merged.items():
        if not isinstance(resource, str) or not resource.startswith(RESOURCE_PREFIX):
            continue
        try:
            result[resource] = parse_quantity(quantity)
        except QuantityError as exc:
            raise SpecError(f"gpu: {kind} {_name(container)!r} {resource}: {exc}") from exc
    return result


def pod_request(pod: Mapping[str, Any]) -> PodRequest:
    """Read the GPU asks of a v1.Pod (JSON dict); SpecError names what is wrong."""
    spec = as_mapping(pod.get("spec"))
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise SpecError("gpu: pod has no containers")
    for init in as_list(spec.get("initContainers")):
        if any(v > 0 for v in container_requests(as_mapping(init), "init container").values()):
            raise SpecError(
                f"gpu: init container {_name(init)!r} requests GPU resources, "
                "which gas cannot annotate; request them in an app container"
            )
    needs = []
    for container in containers:
        container = as_mapping(container)
        requests = container_requests(container)
        gpus = gpu_count(requests)
        if gpus > MAX_GPUS_PER_CONTAINER:
            raise SpecError(f"gpu: container {_name(container)!r} asks for {gpus} GPUs")
        needs.append(ContainerNeed(name=_name(container), gpus=gpus, requests=requests))
    return PodRequest(containers=tuple(needs))


def format_cards(allocation: Allocation) -> str:
    """`card0,card1|card2`: containers by `|`, cards by `,`."""
    return "|".join(",".join(cards) for cards in allocation)


def parse_cards(value: str, containers: int) -> Allocation:
    """Read a `gas-container-cards` annotation written for a pod of `containers`."""
    segments = value.split("|")
    if len(segments) != containers:
        raise SpecError(
            f"{ANNOTATION_CARDS} has {len(segments)} segments for {containers} containers"
        )
    allocation = []
    for segment in segments:
        cards = tuple(segment.split(",")) if segment else ()
        if not all(is_card_name(c) for c in cards):
            raise SpecError(f"{ANNOTATION_CARDS} segment {segment!r} is malformed")
        if len(set(cards)) != len(cards):
            raise SpecError(f"{ANNOTATION_CARDS} segment {segment!r} repeats a card")
        allocation.append(cards)
    return tuple(allocation)


def allocation_usage(request: PodRequest, allocation: Allocation) -> dict[str, dict[str, int]]:
    """What `allocation` takes from each card: each container's need on each of its cards."""
    usage: dict[str, dict[str, int]] = {}
    for need, cards in zip(request.containers, allocation, strict=True):
        if not cards:
            continue
        for res, amount in need.per_card(len(cards)).items():
            for card in cards:
                per_card = usage.setdefault(card, {})
                per_card[res] = per_card.get(res, 0) + amount
    return usage


# ---------------------------------------------------------------- helpers


def as_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _string_map(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"gpu: {what} are not a map")
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def _name(container: Mapping[str, Any]) -> str:
    name = container.get("name")
    return name if isinstance(name, str) else "?"
