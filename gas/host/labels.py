"""The node labels gas reads, as a pure function of the cards, and the patch that brings a
node's labels there.

`card_labels` are those `gas label-node` writes: `gpu.intel.com/gpu-numbers` (`0.1.2`),
`gpu.intel.com/cards` (`card0.card1.card2`, deprecated but still read by GAS) and, with
`numa`, `gpu.intel.com/numa-gpu-map` (`0-0.1_1-2.3`). A value longer than a label allows
continues in `<key>2`, `<key>3`, ... each starting with `Z`, as GAS reads them.
`labels_for` adds `gpu.intel.com/tiles`, the node's total tile count, for `gas node`.

`label_changes` is the merge patch of `metadata.labels` from the node's labels to the
wanted ones: it also removes owned labels that are no longer true (a continuation left from
a longer value, every label once the cards are gone) and never touches any other label.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gas.core.model import (
    LABEL_CARDS,
    LABEL_GPU_NUMBERS,
    LABEL_NUMA_MAP,
    SPLIT_LABEL_MARK,
    TILES,
)
from gas.host.cards import Card
from gas.host.kubeapi import merge_patch, read_node
from gas.kubeapi.core import RawCoreV1Api

LABEL_NUMA_GPU_MAP = LABEL_NUMA_MAP
LABEL_TILES = TILES
NODE_EXACT_LABELS = (LABEL_TILES,)
"""Labels `gas node` owns besides the split ones: never continued, so `tiles2` is not its."""
LABEL_VALUE_MAX = 63

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def is_label_value(value: str) -> bool:
    """The API server's rule for label values."""
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(value) is not None


def split_label(key: str, value: str) -> dict[str, str]:
    """`key: value`, continued in `key2`, `key3`, ... (each `Z` + the next part) when the
    value is too long for one label.

    Each part is as long as it can be while ending where a list item ends (`0.1.2`, then
    `Z.5.8.9`), so every part is a valid label value and still reads well; a part ending
    with a separator would be rejected by the API server.
    """
    if is_label_value(value):
        return {key: value} if value else {}
    parts: list[str] = []
    position = 0
    while position < len(value):
        prefix = SPLIT_LABEL_MARK if parts else ""
        limit = min(LABEL_VALUE_MAX - len(prefix), len(value) - position)
        part = _longest_part(prefix, value, position, limit)
        if part is None:
            raise ValueError(f"cannot split the value of {key} into valid label values")
        parts.append(prefix + part)
        position += len(part)
    return {key if i == 0 else f"{key}{i + 1}": part for i, part in enumerate(parts)}


def _longest_part(prefix: str, value: str, start: int, limit: int) -> str | None:
    candidates = [value[start : start + n] for n in range(limit, 0, -1)]
    whole_items = [
        c for c in candidates if start + len(c) == len(value) or not value[start + len(c)].isalnum()
    ]
    for candidate in whole_items + candidates:
        if is_label_value(prefix + candidate):
            return candidate
    return None


def numa_gpu_map(cards: Iterable[Card]) -> str:
    """`<numa node>-<gpu numbers>` groups joined by `_`: `0-0.1_1-2.3`.

    Cards whose NUMA node is unknown are left out: a single-NUMA allocation must not be
    given a card whose locality nobody knows.
    """
    groups: dict[int, list[int]] = {}
    for card in cards:
        if card.numa_node is not None:
            groups.setdefault(card.numa_node, []).append(card.number)
    return "_".join(
        f"{node}-{'.'.join(str(n) for n in sorted(numbers))}"
        for node, numbers in sorted(groups.items())
    )


def managed_bases(numa: bool) -> tuple[str, ...]:
    """The split labels a run owns. Without `numa` an existing NUMA map is left alone:
    another tool may write it."""
    bases = (LABEL_GPU_NUMBERS, LABEL_CARDS)
    return (*bases, LABEL_NUMA_GPU_MAP) if numa else bases


def card_labels(cards: Sequence[Card], numa: bool = False) -> dict[str, str]:
    """The labels `gas label-node` writes for `cards` (none for no cards)."""
    ordered = sorted(cards, key=lambda card: card.number)
    if not ordered:
        return {}
    labels = split_label(LABEL_GPU_NUMBERS, ".".join(str(c.number) for c in ordered))
    labels.update(split_label(LABEL_CARDS, ".".join(c.name for c in ordered)))
    if numa:
        labels.update(split_label(LABEL_NUMA_GPU_MAP, numa_gpu_map(ordered)))
    return labels


def labels_for(cards: Sequence[Card], numa: bool = False) -> dict[str, str]:
    """The labels `gas node` writes: `card_labels` and the node's total tile count."""
    labels = card_labels(cards, numa)
    if cards:
        labels[LABEL_TILES] = str(sum(card.tiles for card in cards))
    return labels


def is_managed(key: str, bases: Iterable[str]) -> bool:
    """`base`, or one of its continuations `base2`, `base3`, ..."""
    for base in bases:
        if key == base:
            return True
        suffix = key.removeprefix(base)
        if suffix != key and suffix.isdigit() and suffix[0] != "0" and int(suffix) >= 2:
            return True
    return False


def label_changes(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    bases: Iterable[str],
    exact: Iterable[str] = (),
) -> dict[str, str | None]:
    """The merge patch of `metadata.labels` from `current` to `desired`: changed values, and
    None (delete) for owned labels no longer wanted: the split labels of `bases` with their
    continuations, and the `exact` keys. Labels not owned are never touched."""
    bases = tuple(bases)
    exact = frozenset(exact)
    changes: dict[str, str | None] = {
        key: value for key, value in desired.items() if current.get(key) != value
    }
    for key in current:
        if key not in desired and (key in exact or is_managed(key, bases)):
            changes[key] = None
    return dict(sorted(changes.items()))


def labels_of(node: Mapping[str, Any]) -> dict[str, str]:
    """The labels of a node object (JSON)."""
    metadata = node.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return {str(k): str(v) for k, v in (labels or {}).items()}


def patch_labels(api: RawCoreV1Api, node: str, changes: Mapping[str, str | None]) -> None:
    """One merge patch of the node's labels; no call when there is nothing to change."""
    if changes:
        merge_patch(api.patch_node, node, {"metadata": {"labels": dict(changes)}})


def apply_labels(
    api: RawCoreV1Api,
    node: str,
    desired: Mapping[str, str],
    bases: Iterable[str],
    exact: Iterable[str] = (),
) -> dict[str, str | None]:
    """Bring the node's owned labels to `desired` in one merge patch; no call when they are
    already right. Returns the changes made."""
    changes = label_changes(labels_of(read_node(api, node)), desired, bases, exact)
    patch_labels(api, node, changes)
    return changes
