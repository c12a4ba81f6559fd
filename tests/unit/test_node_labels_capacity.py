"""The node agent's labels and capacity as pure functions of the cards, and the changes
that bring a node there."""

from __future__ import annotations

import argparse

import pytest

from gas.core.model import (
    LABEL_CARDS,
    LABEL_GPU_NUMBERS,
    LABEL_NUMA_MAP,
    node_cards,
    node_from_object,
)
from gas.host.cards import Card
from gas.host.labels import (
    LABEL_TILES,
    NODE_EXACT_LABELS,
    card_labels,
    label_changes,
    labels_for,
    managed_bases,
)
from gas.node.capacity import (
    MEMORY,
    MILLICORES,
    capacity_changes,
    capacity_for,
)
from gas.node.command import add_arguments
from gas.node.publish import allocatable_followed

GIB = 1024**3


def card(number: int, tiles: int = 1, memory: int = 16 * GIB, numa: int | None = 0) -> Card:
    return Card(
        f"card{number}", number, "0x8086", numa, "", f"renderD{128 + number}", "i915", tiles, memory
    )


CARDS = [card(0, tiles=2, memory=32 * GIB), card(1, tiles=2, memory=32 * GIB, numa=1), card(2)]


def test_node_labels_are_the_label_node_ones_plus_the_tile_count() -> None:
    assert labels_for(CARDS, numa=True) == {
        LABEL_GPU_NUMBERS: "0.1.2",
        LABEL_CARDS: "card0.card1.card2",
        LABEL_NUMA_MAP: "0-0.2_1-1",
        LABEL_TILES: "5",
    }
    assert labels_for(CARDS) == card_labels(CARDS) | {LABEL_TILES: "5"}
    assert labels_for([]) == {}


def test_the_tile_label_is_owned_without_continuations() -> None:
    current = {LABEL_TILES: "5", LABEL_TILES + "2": "not ours", LABEL_GPU_NUMBERS: "0"}
    bases = managed_bases(numa=False)
    assert label_changes(current, {}, bases, NODE_EXACT_LABELS) == {
        LABEL_GPU_NUMBERS: None,
        LABEL_TILES: None,
    }
    # label-node does not own the tile count: it leaves it alone.
    assert label_changes(current, {}, bases) == {LABEL_GPU_NUMBERS: None}


def test_capacity_totals() -> None:
    assert capacity_for(CARDS) == {
        MEMORY: str(80 * GIB),
        MILLICORES: "3000",
        LABEL_TILES: "5",
    }
    assert capacity_for([]) == {}


def test_gas_reads_back_a_card_of_the_node_as_each_cards_share() -> None:
    """What the extender makes of the labels and capacity: allocatable (the kubelet copies
    capacity there) divided by the card count."""
    cards = [card(n, tiles=2, memory=8 * GIB) for n in range(4)]
    node = {
        "metadata": {"name": "n1", "labels": labels_for(cards)},
        "status": {"allocatable": capacity_for(cards)},
    }
    gpu = node_from_object(node)
    assert gpu.problem is None
    assert gpu.cards == node_cards(labels_for(cards))
    assert gpu.capacity == {MEMORY: 8 * GIB, MILLICORES: 1000, LABEL_TILES: 2}


def test_capacity_changes_touch_owned_keys_only() -> None:
    desired = capacity_for(CARDS)
    # The API server writes quantities in canonical form: the same amount is no change.
    same = {MEMORY: "80Gi", MILLICORES: "3k", LABEL_TILES: "5"}
    assert capacity_changes(same, desired) == {}
    assert capacity_changes({MEMORY: "64Gi", LABEL_TILES: "5"}, desired) == {
        MEMORY: str(80 * GIB),
        MILLICORES: "3000",
    }
    assert capacity_changes({MEMORY: "rubbish"}, desired)[MEMORY] == str(80 * GIB)
    assert capacity_changes(same | {"cpu": "8"}, {}) == {
        MEMORY: None,
        MILLICORES: None,
        LABEL_TILES: None,
    }


def test_allocatable_followed() -> None:
    desired = capacity_for(CARDS[:1])
    node = {"status": {"allocatable": {MEMORY: "80Gi", MILLICORES: "3000", "cpu": "8"}}}
    assert not allocatable_followed(node, desired)
    node["status"]["allocatable"] = {MEMORY: "32Gi", MILLICORES: "1000"}
    assert allocatable_followed(node, desired)
    assert allocatable_followed({"status": {}}, {})
    assert not allocatable_followed(node, {})


def test_a_bad_share_count_is_refused_with_the_flags() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--shared-dev-num", "3"]).shares_per_card == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--shares-per-card", bad])
