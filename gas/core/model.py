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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gas.core.quantity import QuantityError, parse_quantity

RESOURCE_PREFIX = "gpu.intel.com/"
I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"
GPU_COUNT_RESOURCES = (I915, XE)
TILES = "gpu.intel.com/tiles"
I915_MONITORING = "gpu.intel.com/i915_monitoring"
XE_MONITORING = "gpu.intel.com/xe_monitoring"

LABEL_GPU_NUMBERS = "gpu.intel.com/gpu-numbers"
LABEL_CARDS = "gpu.intel.com/cards"
LABEL_PCI_GROUPS = "gpu.intel.com/pci-groups"
LABEL_XE_LINKS = "gpu.intel.com/xe-links"
LABEL_NUMA_MAP = "gpu.intel.com/numa-gpu-map"
SPLIT_LABEL_MARK = "Z"

# Node policy labels live under `telemetry.aware.scheduling.<policy>/<name>`.
POLICY_PREFIX = "telemetry.aware.scheduling."
POLICY_DISABLE = "gas-disable-"
POLICY_PREFER_GPU = "gas-prefer-gpu"
POLICY_DESCHEDULE = "gas-deschedule-pods-"
POLICY_TILE_DISABLE = "gas-tile-disable-"
POLICY_TILE_DESCHEDULE = "gas-tile-deschedule-"
POLICY_TILE_PREFERRED = "gas-tile-preferred-"
PCI_GROUP = "PCI_GROUP"

ANNOTATION_TS = "gas-ts"
ANNOTATION_CARDS = "gas-container-cards"
ANNOTATION_TILES = "gas-container-tiles"
# What the node agent handed out, in the format of ANNOTATION_CARDS.
ANNOTATION_NODE_CARDS = "gas-node-cards"
ANNOTATION_ALLOW = "gas-allow"
ANNOTATION_DENY = "gas-deny"
ANNOTATION_SAME_GPU = "gas-same-gpu"
ANNOTATION_XELINK = "gas-allocate-xelink"
ANNOTATION_SINGLE_NUMA = "gas-allocate-single-numa"
ANNOTATION_POLICY = "gas-policy"
FIRST_FIT, BINPACK, SPREAD = "first-fit", "binpack", "spread"
PLACEMENT_POLICIES = (FIRST_FIT, BINPACK, SPREAD)
LABEL_DESCHEDULE_POD = "gpu.aware.scheduling/deschedule-pod"

# More cards than this in one label is a broken label, not a real machine.
MAX_CARDS_PER_NODE = 256
MAX_GPUS_PER_CONTAINER = 64

_CARD_NAME = re.compile(r"^card(0|[1-9][0-9]{0,5})$")
_GPU_NUMBER = re.compile(r"^(0|[1-9][0-9]{0,5})$")
_TILE_LABEL = re.compile(r"^(card(?:0|[1-9][0-9]{0,5}))_gt(0|[1-9][0-9]{0,5})$")
_TILE_NAME = re.compile(r"^gt(0|[1-9][0-9]{0,5})$")
_XE_LINK = re.compile(r"^([0-9]{1,6})\.([0-9]{1,6})-([0-9]{1,6})\.([0-9]{1,6})$")

Usage = Mapping[str, Mapping[str, int]]
"""Per card name: resource name -> amount given out."""

TileUsage = Mapping[str, frozenset[int]]
"""Per card name: tile indices in use."""

TileAllocation = tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]
"""Per app container (spec order): (card, tile indices) for each of its cards; empty for a
container that asks for no tiles."""

XeLink = tuple[tuple[str, int], tuple[str, int]]
"""Two (card, tile) ends of one Xe link."""


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
    # Policy and topology labels, read once per node event. Problems that only matter to
    # pods asking for a feature are kept apart so other pods still use the node.
    disabled: frozenset[str] = frozenset()
    preferred: str | None = None
    unavailable_tiles: TileUsage = field(default_factory=dict)
    preferred_tiles: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pci_groups: tuple[frozenset[str], ...] = ()
    xe_links: tuple[XeLink, ...] = ()
    xe_link_problem: str | None = None
    numa_groups: tuple[tuple[str, ...], ...] = ()
    numa_problem: str | None = None
    descheduled: frozenset[str] = frozenset()
    descheduled_tiles: TileUsage = field(default_factory=dict)

    @property
    def tiles_per_card(self) -> int:
        return self.capacity.get(TILES, 0)


def read_split_label(labels: Mapping[str, str], key: str) -> str:
    """A label whose value may continue in `key2`, `key3`, ... each prefixed with `Z`.

    Label values are limited to 63 characters, so long card lists are split this way by
    the GPU node labelling tools. A continuation without the prefix is an error.
    """
    value = labels.get(key, "")
    index = 2
    while (part := labels.get(f"{key}{index}")) is not None:
        if not part:
            raise SpecError(
                f"gpu: node label {key}{index} is empty, so it does not start with "
                f"{SPLIT_LABEL_MARK} as a continuation must"
            )
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
                amount = (
                    _known_quantity(quantity) if type(quantity) is str else parse_quantity(quantity)
                )
                capacity[resource] = amount // len(cards)
            except QuantityError as exc:
                raise SpecError(f"gpu: node allocatable {resource} is malformed") from exc
        policy = _node_policy(labels, cards, capacity.get(TILES, 0))
    except SpecError as exc:
        return NodeGpu(name=name, problem=str(exc))
    return NodeGpu(name=name, cards=cards, capacity=capacity, **policy)


def _policy_labels(labels: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """(key, name after the policy prefix, value) of every policy label."""
    for key, value in sorted(labels.items()):
        if not key.startswith(POLICY_PREFIX):
            continue
        _, _, name = key.partition("/")
        if "/" in key and "/" not in name:
            yield key, name, value


def _label_card(key: str, card: str) -> str:
    if not is_card_name(card):
        raise SpecError(f"gpu: node label {key} does not name a card")
    return card


def _tile_label(key: str, rest: str) -> tuple[str, int]:
    match = _TILE_LABEL.match(rest)
    if match is None:
        raise SpecError(f"gpu: node label {key} does not name a tile as cardN_gtM")
    return match.group(1), int(match.group(2))


def _number_groups(value: str, key: str) -> list[list[str]]:
    """`0.1_2.3` -> [[card0, card1], [card2, card3]]."""
    if not value:
        return []
    groups = []
    for group in value.split("_"):
        parts = group.split(".")
        if not all(_GPU_NUMBER.match(p) for p in parts):
            raise SpecError(f"gpu: node label {key} is malformed")
        groups.append([f"card{p}" for p in parts])
    return groups


def _node_policy(labels: Mapping[str, str], cards: tuple[str, ...], tiles: int) -> dict[str, Any]:
    """The policy and topology fields of NodeGpu; SpecError when one that takes cards
    away cannot be read (failing closed: the node then hosts no GPU pod)."""
    pci_problem = None
    try:
        pci_groups = tuple(
            frozenset(g)
            for g in _number_groups(read_split_label(labels, LABEL_PCI_GROUPS), LABEL_PCI_GROUPS)
        )
    except SpecError as exc:
        pci_groups, pci_problem = (), str(exc)

    def with_group(key: str, card: str, value: str) -> set[str]:
        if value != PCI_GROUP:
            return {card}
        if pci_problem is not None:
            raise SpecError(f"{pci_problem} (needed by {key}={PCI_GROUP})")
        return {card}.union(*(g for g in pci_groups if card in g))

    disabled: set[str] = set()
    descheduled: set[str] = set()
    preferred: list[str] = []
    unavailable: dict[str, set[int]] = {}
    descheduled_tiles: dict[str, set[int]] = {}
    preferred_tiles: dict[str, set[int]] = {}
    for key, name, value in _policy_labels(labels):
        if name.startswith(POLICY_DISABLE):
            disabled |= with_group(key, _label_card(key, name[len(POLICY_DISABLE) :]), value)
        elif name.startswith(POLICY_DESCHEDULE):
            card = _label_card(key, name[len(POLICY_DESCHEDULE) :])
            descheduled |= with_group(key, card, value)
        elif name == POLICY_PREFER_GPU:
            if is_card_name(value) and value in cards:
                preferred.append(value)
        elif name.startswith((POLICY_TILE_DISABLE, POLICY_TILE_DESCHEDULE)):
            deschedule = name.startswith(POLICY_TILE_DESCHEDULE)
            rest = name[len(POLICY_TILE_DESCHEDULE if deschedule else POLICY_TILE_DISABLE) :]
            card, tile = _tile_label(key, rest)
            if tile < tiles:
                unavailable.setdefault(card, set()).add(tile)
            if deschedule:
                descheduled_tiles.setdefault(card, set()).add(tile)
        elif name.startswith(POLICY_TILE_PREFERRED):
            # A preference is advice: a malformed one is ignored rather than taking the
            # node out of service. Both `...cardN=gtM` (GAS) and `...cardN_gtM` are read.
            rest = name[len(POLICY_TILE_PREFERRED) :]
            match = _TILE_LABEL.match(rest)
            value_match = _TILE_NAME.match(value)
            if match is not None:
                card, tile = match.group(1), int(match.group(2))
            elif is_card_name(rest) and value_match is not None:
                card, tile = rest, int(value_match.group(1))
            else:
                continue
            if tile < tiles:
                preferred_tiles.setdefault(card, set()).add(tile)

    xe_links: tuple[XeLink, ...] = ()
    xe_link_problem = None
    try:
        xe_links = _xe_links(read_split_label(labels, LABEL_XE_LINKS), cards)
    except SpecError as exc:
        xe_link_problem = str(exc)
    numa_groups: tuple[tuple[str, ...], ...] = ()
    numa_problem = None
    try:
        numa_groups = _numa_groups(read_split_label(labels, LABEL_NUMA_MAP), cards)
    except SpecError as exc:
        numa_problem = str(exc)
    return {
        "disabled": frozenset(disabled),
        # Several policies may each name a preferred card: the lowest one wins, so the
        # choice does not depend on label order.
        "preferred": sort_cards(preferred)[0] if preferred else None,
        "unavailable_tiles": {c: frozenset(t) for c, t in unavailable.items()},
        "preferred_tiles": {c: tuple(sorted(t)) for c, t in preferred_tiles.items()},
        "pci_groups": pci_groups,
        "xe_links": xe_links,
        "xe_link_problem": xe_link_problem,
        "numa_groups": numa_groups,
        "numa_problem": numa_problem,
        "descheduled": frozenset(descheduled),
        "descheduled_tiles": {c: frozenset(t) for c, t in descheduled_tiles.items()},
    }


def _xe_links(value: str, cards: tuple[str, ...]) -> tuple[XeLink, ...]:
    """`0.0-1.0_2.0-3.0`: Level-Zero device ids are indices into the numerically sorted
    cards (device 0 is the lowest-numbered card)."""
    if not value:
        return ()
    links = []
    for entry in value.split("_"):
        match = _XE_LINK.match(entry)
        if match is None:
            raise SpecError(f"gpu: node label {LABEL_XE_LINKS} entry {entry!r} is malformed")
        a, a_tile, b, b_tile = (int(g) for g in match.groups())
        if a >= len(cards) or b >= len(cards):
            raise SpecError(
                f"gpu: node label {LABEL_XE_LINKS} entry {entry!r} names a device the node lacks"
            )
        links.append(((cards[a], a_tile), (cards[b], b_tile)))
    return tuple(links)


def xe_link_groups(labels: Mapping[str, str], cards: Iterable[str]) -> dict[str, int]:
    """Card -> its Xe Link group, from the node's `gpu.intel.com/xe-links` label: cards
    joined by links, directly or through others, share a group, numbered by its
    lowest-numbered card. Cards without a link have none. Raises SpecError for a malformed
    label."""
    ordered = sort_cards(cards)
    links = _xe_links(read_split_label(labels, LABEL_XE_LINKS), ordered)
    parent = {card: card for card in ordered}

    def root(card: str) -> str:
        while parent[card] != card:
            parent[card] = parent[parent[card]]
            card = parent[card]
        return card

    linked: set[str] = set()
    for (a, _), (b, _) in links:
        if a == b:
            continue  # a link between a card's own tiles joins no cards
        linked |= {a, b}
        first, second = sorted((root(a), root(b)), key=card_number)
        parent[second] = first
    return {card: card_number(root(card)) for card in ordered if card in linked}


def _numa_groups(value: str, cards: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """`0-0.1_1-2.3`: NUMA node 0 has card0 and card1, node 1 card2 and card3."""
    if not value:
        return ()
    groups = []
    for group in value.split("_"):
        numa, sep, numbers = group.partition("-")
        if not sep or not _GPU_NUMBER.match(numa) or "-" in numbers or not numbers:
            raise SpecError(f"gpu: node label {LABEL_NUMA_MAP} group {group!r} is malformed")
        members = _number_groups(numbers, LABEL_NUMA_MAP)[0]
        groups.append(sort_cards(c for c in members if c in cards))
    return tuple(groups)


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
    """A pod's GPU asks, one entry per app container in spec order, and the GAS feature
    annotations. `problems` maps an annotation to why its value cannot be used; the
    allocator turns each into a reason (allow/deny only when those features are on)."""

    containers: tuple[ContainerNeed, ...]
    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    same_gpu: tuple[str, ...] = ()
    xelink: bool = False
    single_numa: bool = False
    problems: Mapping[str, str] = field(default_factory=dict)
    policy: str | None = None
    """The pod's `gas-policy` annotation (one of PLACEMENT_POLICIES), when it has one."""

    @property
    def wants_tiles(self) -> bool:
        return any(c.requests.get(TILES, 0) > 0 for c in self.containers)

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
            result[resource] = (
                _known_quantity(quantity) if type(quantity) is str else parse_quantity(quantity)
            )
        except QuantityError as exc:
            raise SpecError(f"gpu: {kind} {_name(container)!r} {resource}: {exc}") from exc
    return result


@functools.lru_cache(maxsize=4096)
def _known_quantity(text: str) -> int:
    """`parse_quantity` of a string, remembered: the pods of a cluster repeat a few
    quantities thousands of times (errors are raised afresh each time)."""
    return parse_quantity(text)


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
    annotations = as_mapping(as_mapping(pod.get("metadata")).get("annotations"))
    return _with_annotations(tuple(needs), annotations)


def _presence(annotations: Mapping[str, Any], key: str) -> bool:
    """GAS switches these on by mere presence; `false` (any case) switches them off here,
    since nobody writing `false` means on."""
    if key not in annotations:
        return False
    value = annotations[key]
    return not (isinstance(value, str) and value.strip().lower() == "false")


def _card_list(value: object, key: str) -> frozenset[str]:
    if not isinstance(value, str):
        raise SpecError(f"gpu: pod annotation {key} is not a string")
    if not value.strip():
        return frozenset()
    names = [part.strip() for part in value.split(",")]
    for part in names:
        if not is_card_name(part):
            raise SpecError(
                f"gpu: pod annotation {key} is malformed: {part!r} is not a card name like card0"
            )
    return frozenset(names)


def _with_annotations(
    needs: tuple[ContainerNeed, ...], annotations: Mapping[str, Any]
) -> PodRequest:
    problems: dict[str, str] = {}
    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    if ANNOTATION_ALLOW in annotations:
        try:
            allow = _card_list(annotations[ANNOTATION_ALLOW], ANNOTATION_ALLOW)
            if not allow:
                problems[ANNOTATION_ALLOW] = (
                    f"gpu: pod annotation {ANNOTATION_ALLOW} is empty, which would allow no card"
                )
        except SpecError as exc:
            problems[ANNOTATION_ALLOW] = str(exc)
    if ANNOTATION_DENY in annotations:
        try:
            deny = _card_list(annotations[ANNOTATION_DENY], ANNOTATION_DENY)
        except SpecError as exc:
            problems[ANNOTATION_DENY] = str(exc)
    xelink = _presence(annotations, ANNOTATION_XELINK)
    single_numa = _presence(annotations, ANNOTATION_SINGLE_NUMA)
    same_gpu: tuple[str, ...] = ()
    if ANNOTATION_SAME_GPU in annotations:
        try:
            same_gpu = _same_gpu(needs, annotations[ANNOTATION_SAME_GPU])
        except SpecError as exc:
            problems[ANNOTATION_SAME_GPU] = str(exc)
        if xelink:
            problems[ANNOTATION_XELINK] = (
                f"gpu: pod annotations {ANNOTATION_XELINK} and {ANNOTATION_SAME_GPU} "
                "cannot be combined"
            )
    if xelink and ANNOTATION_XELINK not in problems:
        for need in needs:
            if need.gpus <= 0:
                continue
            if need.gpus % 2:
                problems[ANNOTATION_XELINK] = (
                    f"gpu: pod annotation {ANNOTATION_XELINK}: container {need.name!r} "
                    f"asks for {need.gpus} GPUs, an odd number"
                )
                break
            if need.requests.get(TILES, 0) != need.gpus:
                problems[ANNOTATION_XELINK] = (
                    f"gpu: pod annotation {ANNOTATION_XELINK}: container {need.name!r} "
                    f"must ask for as many {TILES} as GPUs ({need.gpus})"
                )
                break
    policy: str | None = None
    if ANNOTATION_POLICY in annotations:
        value = annotations[ANNOTATION_POLICY]
        policy = value.strip().lower() if isinstance(value, str) else None
        if policy not in PLACEMENT_POLICIES:
            policy = None
            problems[ANNOTATION_POLICY] = (
                f"gpu: pod annotation {ANNOTATION_POLICY} is {str(value)[:40]!r}, "
                f"not one of {', '.join(PLACEMENT_POLICIES)}"
            )
    return PodRequest(
        containers=needs,
        allow=allow,
        deny=deny,
        same_gpu=same_gpu,
        xelink=xelink,
        single_numa=single_numa,
        problems=problems,
        policy=policy,
    )


def _same_gpu(needs: tuple[ContainerNeed, ...], value: object) -> tuple[str, ...]:
    key = ANNOTATION_SAME_GPU
    if not isinstance(value, str):
        raise SpecError(f"gpu: pod annotation {key} is not a string")
    names = tuple(part.strip() for part in value.split(","))
    if len(names) < 2:
        raise SpecError(f"gpu: pod annotation {key} must name at least two containers")
    if len(set(names)) != len(names):
        raise SpecError(f"gpu: pod annotation {key} names a container twice")
    by_name = {need.name: need for need in needs}
    for name in names:
        need = by_name.get(name)
        if need is None:
            raise SpecError(f"gpu: pod annotation {key} names {name!r}, not a container")
        if need.gpus != 1:
            raise SpecError(
                f"gpu: pod annotation {key}: container {name!r} must ask for exactly 1 GPU"
            )
        for res in (TILES, I915_MONITORING, XE_MONITORING):
            if res in need.requests:
                raise SpecError(f"gpu: pod annotation {key}: container {name!r} asks for {res}")
    return names


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


def format_tiles(tiles: TileAllocation) -> str:
    """`card0:gt0+gt1,card1:gt0|`: as the cards annotation, each card with its tiles."""
    return "|".join(
        ",".join(f"{card}:" + "+".join(f"gt{t}" for t in indices) for card, indices in entries)
        for entries in tiles
    )


def parse_tiles(value: str, allocation: Allocation) -> TileAllocation:
    """Read a `gas-container-tiles` annotation against the pod's card allocation."""
    segments = value.split("|")
    if len(segments) != len(allocation):
        raise SpecError(
            f"{ANNOTATION_TILES} has {len(segments)} segments for {len(allocation)} containers"
        )
    result = []
    for segment, cards in zip(segments, allocation, strict=True):
        entries = []
        for entry in segment.split(",") if segment else ():
            card, sep, tiles = entry.partition(":")
            if not sep or card not in cards or not tiles:
                raise SpecError(f"{ANNOTATION_TILES} entry {entry!r} is malformed")
            indices = []
            for tile in tiles.split("+"):
                match = _TILE_NAME.match(tile)
                if match is None:
                    raise SpecError(f"{ANNOTATION_TILES} entry {entry!r} is malformed")
                indices.append(int(match.group(1)))
            entries.append((card, tuple(indices)))
        result.append(tuple(entries))
    return tuple(result)


def tiles_by_card(tiles: TileAllocation) -> dict[str, frozenset[int]]:
    by_card: dict[str, set[int]] = {}
    for entries in tiles:
        for card, indices in entries:
            by_card.setdefault(card, set()).update(indices)
    return {card: frozenset(indices) for card, indices in by_card.items()}


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
    # JSON objects are plain dicts: the exact type test spares the slower ABC check,
    # which a relist of tens of thousands of pods would otherwise make many times each.
    return value if type(value) is dict or isinstance(value, Mapping) else {}


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
