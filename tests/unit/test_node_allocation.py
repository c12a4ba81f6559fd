"""What a container receives: device IDs, device nodes, the tile mask (gas.node.devices,
gas.node.allocation)."""

from __future__ import annotations

import pytest

from gas.host.cards import Card
from gas.node.allocation import (
    ZE_AFFINITY_MASK,
    AllocationError,
    affinity_mask,
    composite_hierarchy,
    device_nodes,
    grant,
    mismatch,
    preferred_ids,
)
from gas.node.devices import (
    DeviceIdError,
    cards_by_resource,
    device_list,
    id_order,
    ids_by_card,
    parse_device_id,
)


def card(number: int, tiles: int = 1, driver: str = "i915", render: int | None = None) -> Card:
    return Card(
        name=f"card{number}",
        number=number,
        vendor="0x8086",
        numa_node=number % 2,
        render_node=f"renderD{render if render is not None else 128 + number}",
        driver=driver,
        tiles=tiles,
    )


CARDS = {c.name: c for c in (card(0), card(1, tiles=2), card(2, tiles=2, render=200))}


def test_device_ids_are_card_dash_share_in_numeric_order() -> None:
    devices = device_list([card(10), card(2)], 3, unhealthy=["card10"])
    assert [d.id for d in devices] == [
        "card2-0",
        "card2-1",
        "card2-2",
        "card10-0",
        "card10-1",
        "card10-2",
    ]
    assert [d.healthy for d in devices] == [True] * 3 + [False] * 3
    assert parse_device_id("card10-2") == ("card10", 2)
    assert sorted(["card2-10", "card10-0", "card2-9"], key=id_order) == [
        "card2-9",
        "card2-10",
        "card10-0",
    ]
    for bad in ("card1", "gpu0-1", "card01-1", "card1-x", "card1-1-1"):
        with pytest.raises(DeviceIdError):
            parse_device_id(bad)
    with pytest.raises(ValueError):
        device_list([card(0)], 0)


def test_the_driver_decides_the_resource() -> None:
    grouped = cards_by_resource([card(0), card(1, driver="xe"), card(2, driver="vfio-pci")])
    assert {r: [c.name for c in cs] for r, cs in grouped.items()} == {
        "gpu.intel.com/i915": ["card0"],
        "gpu.intel.com/xe": ["card1"],
    }


def test_device_nodes_use_the_cards_own_render_node() -> None:
    nodes = device_nodes(["card2", "card0"], CARDS, "/host/dev")
    assert [(n.host_path, n.container_path, n.permissions) for n in nodes] == [
        ("/host/dev/dri/card0", "/dev/dri/card0", "rw"),
        ("/host/dev/dri/renderD128", "/dev/dri/renderD128", "rw"),
        ("/host/dev/dri/card2", "/dev/dri/card2", "rw"),
        ("/host/dev/dri/renderD200", "/dev/dri/renderD200", "rw"),
    ]
    with pytest.raises(AllocationError, match="card7"):
        device_nodes(["card7"], CARDS)


@pytest.mark.parametrize(
    ("tiles", "cards", "composite", "expected"),
    [
        ([("card1", [1])], ["card1"], False, "1"),
        ([("card1", [0, 1])], ["card1"], False, "0,1"),
        # the second card's tiles come after the first card's two
        ([("card1", [1]), ("card2", [0])], ["card1", "card2"], False, "1,2"),
        ([("card2", [0]), ("card1", [1])], ["card2", "card1"], False, "1,2"),
        ([("card1", [1]), ("card2", [0])], ["card1", "card2"], True, "0.1,1.0"),
        ([("card2", [1])], ["card1", "card2"], False, "3"),
        ([("card2", [1])], ["card1", "card2"], True, "1.1"),
        # one tile per card: nothing to choose, no mask
        ([("card0", [0])], ["card0"], False, None),
        ([], ["card1"], False, None),
    ],
)
def test_affinity_mask(
    tiles: list[tuple[str, list[int]]], cards: list[str], composite: bool, expected: str | None
) -> None:
    per_card = {name: CARDS[name].tiles for name in cards}
    assert affinity_mask(tiles, cards, per_card, composite) == expected


def test_a_mask_naming_a_tile_or_card_the_container_lacks_is_an_error() -> None:
    with pytest.raises(AllocationError, match="gt2"):
        affinity_mask([("card1", [2])], ["card1"], {"card1": 2})
    with pytest.raises(AllocationError, match="card2"):
        affinity_mask([("card2", [0])], ["card1"], {"card1": 2, "card2": 2})


def test_grant_sets_the_mask_only_for_multi_tile_cards() -> None:
    handed = grant(["card1"], [("card1", (1,))], CARDS)
    assert handed.cards == ("card1",)
    assert handed.envs == {ZE_AFFINITY_MASK: "1"}
    assert grant(["card0"], [("card0", (0,))], CARDS).envs == {}
    composite = grant(["card1"], [("card1", (1,))], CARDS, composite=True)
    assert composite.envs == {ZE_AFFINITY_MASK: "0.1"}
    assert composite_hierarchy({"ZE_FLAT_DEVICE_HIERARCHY": " composite "})
    assert not composite_hierarchy({"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"})


def test_preferred_ids_take_the_right_count_of_each_card() -> None:
    available = ["card1-3", "card0-1", "card1-0", "card0-0", "card2-5"]
    assert preferred_ids(["card1"], 1, available) == ["card1-0"]
    assert preferred_ids(["card0", "card1"], 2, available) == ["card0-0", "card1-0"]
    assert preferred_ids(["card0", "card1"], 4, available) == [
        "card0-0",
        "card0-1",
        "card1-0",
        "card1-3",
    ]
    assert preferred_ids(["card1"], 1, available, must_include=["card1-3"]) == ["card1-3"]
    # not enough shares of a card, or a must-include on another card: no preference
    assert preferred_ids(["card2"], 2, available) is None
    assert preferred_ids(["card3"], 1, available) is None
    assert preferred_ids(["card1"], 1, available, must_include=["card0-0"]) is None
    with pytest.raises(AllocationError):
        preferred_ids(["card0", "card1"], 3, available)


def test_mismatch_says_why_the_kubelets_choice_is_not_gas() -> None:
    assert mismatch(["card0", "card1"], ["card1-4", "card0-2"]) is None
    assert "card2" in (mismatch(["card0"], ["card2-0"]) or "")
    assert mismatch(["card0", "card1"], ["card0-1", "card0-2"]) is not None
    assert mismatch(["card0"], ["bogus"]) is not None
    assert ids_by_card(["card1-2", "card0-3", "card1-0"]) == {
        "card0": ["card0-3"],
        "card1": ["card1-0", "card1-2"],
    }
