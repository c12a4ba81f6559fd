"""GAS feature annotations and node labels in the pure allocator and the model.

Tiles, allow/deny lists, same GPU, Xe link, single NUMA, node policy labels (disable,
PCI groups, preferred card, deschedule), split labels and the balanced resource.
"""

from __future__ import annotations

from typing import Any

import pytest

from gas.core.allocator import Placement, Policy, Rejection, place
from gas.core.model import (
    I915,
    TILES,
    NodeGpu,
    SpecError,
    format_tiles,
    node_from_object,
    parse_cards,
    parse_tiles,
    pod_request,
)
from tests.support.objects import ctr, make_node, pod_object, res

P = "telemetry.aware.scheduling.policy/"
ALLOW_DENY = Policy(allowlist=True, denylist=True)


def node(numbers: str = "0.1", labels: dict[str, str] | None = None, **alloc: str) -> NodeGpu:
    """Node n1 as gas reads it; 4 i915 per card unless `alloc` says otherwise."""
    alloc = alloc or {"i915": str(4 * len(numbers.split(".")))}
    return node_from_object(make_node("n1", numbers, labels=labels, **alloc))


def tile_node(numbers: str = "0.1", tiles: int = 2, /, **labels: str) -> NodeGpu:
    """`tiles` tiles per card, 4 pods per card."""
    cards = len(numbers.split("."))
    return node(numbers, labels, i915=str(4 * cards), tiles=str(tiles * cards))


def pod(*containers: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """Pod p (uid u, no status); annotation keywords spell `-` as `_`."""
    return pod_object(
        "p",
        *(containers or (ctr(i915="1"),)),
        namespace="ns",
        uid="u",
        annotations={k.replace("_", "-"): v for k, v in annotations.items()},
        phase=None,
    )


def run(
    gpu_node: NodeGpu,
    pod_obj: dict[str, Any],
    usage: dict[str, dict[str, int]] | None = None,
    tiles_used: dict[str, frozenset[int]] | None = None,
    policy: Policy | None = None,
) -> Placement | Rejection:
    return place(gpu_node, usage or {}, pod_request(pod_obj), tiles_used=tiles_used, policy=policy)


def placed(result: Placement | Rejection) -> tuple[str, str]:
    assert isinstance(result, Placement), result
    tiles = format_tiles(result.tiles) if any(result.tiles) else ""
    return "|".join(",".join(c) for c in result.cards), tiles


def rejected(result: Placement | Rejection, unresolvable: bool = True) -> str:
    assert isinstance(result, Rejection), result
    assert result.unresolvable is unresolvable, result
    return result.reason


# ---------------------------------------------------------------- xe resources


def test_xe_monitoring_is_an_ordinary_resource() -> None:
    gpu_node = node("0.1", xe="8", xe_monitoring="2")
    assert placed(run(gpu_node, pod(ctr(xe="1", xe_monitoring="1")))) == ("card0", "")
    lacking = node("0.1", xe="8", xe_monitoring="1")  # 1 // 2 cards = 0 per card
    assert "xe_monitoring" in rejected(run(lacking, pod(ctr(xe="1", xe_monitoring="1"))))


# ---------------------------------------------------------------- tiles


def test_tile_capacity_comes_from_allocatable() -> None:
    assert tile_node("0.1.2.3", 4).tiles_per_card == 4
    assert node("0.1").tiles_per_card == 0


def test_tiles_are_the_lowest_free_indices() -> None:
    assert placed(run(tile_node(), pod(ctr(i915="1", tiles="1")))) == ("card0", "card0:gt0")
    assert placed(run(tile_node(), pod(ctr(i915="1", tiles="2")))) == ("card0", "card0:gt0+gt1")


def test_tiles_held_by_other_pods_are_skipped() -> None:
    result = run(tile_node(), pod(ctr(i915="1", tiles="1")), tiles_used={"card0": frozenset({0})})
    assert placed(result) == ("card0", "card0:gt1")
    full = run(tile_node(), pod(ctr(i915="1", tiles="1")), tiles_used={"card0": frozenset({0, 1})})
    assert placed(full) == ("card1", "card1:gt0")


def test_tiles_by_index_count_even_when_the_usage_count_is_lower() -> None:
    # A pod whose annotation names two tiles but whose request says one (old GAS pods):
    # the indices win, the card has no free tile.
    result = run(
        tile_node(),
        pod(ctr(i915="1", tiles="1")),
        usage={"card0": {TILES: 1, I915: 1}},
        tiles_used={"card0": frozenset({0, 1})},
    )
    assert placed(result) == ("card1", "card1:gt0")


def test_multi_gpu_container_gets_tiles_on_each_card() -> None:
    result = run(tile_node(), pod(ctr(i915="2", tiles="2")))
    assert placed(result) == ("card0,card1", "card0:gt0,card1:gt0")


def test_multi_container_pod_mixing_tile_and_non_tile_containers() -> None:
    result = run(
        tile_node(),
        pod(
            ctr("a", i915="1", tiles="2"),
            ctr("plain", i915="1"),
            ctr("sidecar"),
            ctr("b", i915="1", tiles="1"),
        ),
    )
    # a takes both tiles of card0, so b goes to card1; plain shares card0 without tiles.
    assert placed(result) == ("card0|card0||card1", "card0:gt0+gt1|||card1:gt0")


def test_containers_of_one_pod_get_distinct_tiles_on_a_shared_card() -> None:
    result = run(tile_node(), pod(ctr("a", i915="1", tiles="1"), ctr("b", i915="1", tiles="1")))
    assert placed(result) == ("card0|card0", "card0:gt0|card0:gt1")


def test_more_tiles_than_a_card_has_is_unresolvable() -> None:
    assert "tiles" in rejected(run(tile_node(), pod(ctr(i915="1", tiles="3"))))


def test_tiles_on_a_node_without_tiles_is_unresolvable() -> None:
    assert "tiles" in rejected(run(node("0.1"), pod(ctr(i915="1", tiles="1"))))


def test_all_tiles_taken_is_resolvable() -> None:
    taken = {"card0": frozenset({0, 1}), "card1": frozenset({0, 1})}
    result = run(tile_node(), pod(ctr(i915="1", tiles="1")), tiles_used=taken)
    assert "tiles" in rejected(result, unresolvable=False)


def test_disabled_and_descheduled_tiles_are_not_given_out() -> None:
    gpu_node = tile_node(
        **{f"{P}gas-tile-disable-card0_gt0": "true", f"{P}gas-tile-deschedule-card1_gt1": "x"}
    )
    assert gpu_node.unavailable_tiles == {"card0": {0}, "card1": {1}}
    assert gpu_node.descheduled_tiles == {"card1": {1}}
    assert placed(run(gpu_node, pod(ctr(i915="1", tiles="1")))) == ("card0", "card0:gt1")
    # Two tiles on one card: only cards with two usable tiles qualify, and none has.
    assert "idle" in rejected(run(gpu_node, pod(ctr(i915="1", tiles="2"))))


def test_unavailable_tile_in_use_is_not_counted_twice() -> None:
    gpu_node = tile_node(**{f"{P}gas-tile-disable-card0_gt0": "true"})
    # The pod holding gt0 counts it once, gt1 stays free.
    result = run(
        gpu_node,
        pod(ctr(i915="1", tiles="1")),
        usage={"card0": {I915: 1, TILES: 1}},
        tiles_used={"card0": frozenset({0})},
    )
    assert placed(result) == ("card0", "card0:gt1")


def test_tile_labels_beyond_capacity_are_ignored() -> None:
    gpu_node = tile_node(**{f"{P}gas-tile-disable-card0_gt7": "true"})
    assert gpu_node.unavailable_tiles == {}
    assert placed(run(gpu_node, pod(ctr(i915="1", tiles="2")))) == ("card0", "card0:gt0+gt1")


@pytest.mark.parametrize(
    "label", ["gas-tile-preferred-card0", "gas-tile-preferred-card0_gt1", "gas-tile-preferred-x"]
)
def test_preferred_tiles_come_first(label: str) -> None:
    gpu_node = tile_node("0.1", 4, **{f"{P}{label}": "gt1"})
    result = run(gpu_node, pod(ctr(i915="1", tiles="1")))
    expected = "card0:gt0" if label.endswith("-x") else "card0:gt1"  # malformed: ignored
    assert placed(result) == ("card0", expected)
    if not label.endswith("-x"):
        two = run(gpu_node, pod(ctr(i915="1", tiles="2")))
        assert placed(two) == ("card0", "card0:gt0+gt1")
        taken = run(gpu_node, pod(ctr(i915="1", tiles="1")), tiles_used={"card0": frozenset({1})})
        assert placed(taken) == ("card0", "card0:gt0")


@pytest.mark.parametrize(
    "key",
    [
        "gas-tile-disable-card0",
        "gas-tile-disable-card0_gt",
        "gas-tile-deschedule-0_gt1",
        "gas-tile-disable-card0_gt1x",
    ],
)
def test_malformed_tile_label_fails_closed(key: str) -> None:
    gpu_node = tile_node(**{f"{P}{key}": "true"})
    assert gpu_node.problem is not None and key in gpu_node.problem
    assert key in rejected(run(gpu_node, pod(ctr(i915="1"))))


def test_tiles_annotation_round_trip() -> None:
    allocation = parse_cards("card0,card1|card0||card2", 4)
    text = "card0:gt0,card1:gt0|card0:gt1+gt3|||"
    with pytest.raises(SpecError):
        parse_tiles(text, allocation)  # five segments for four containers
    text = "card0:gt0,card1:gt0|card0:gt1+gt3||"
    tiles = parse_tiles(text, allocation)
    assert tiles == ((("card0", (0,)), ("card1", (0,))), (("card0", (1, 3)),), (), ())
    assert format_tiles(tiles) == text


@pytest.mark.parametrize(
    "text",
    ["card0", "card0:", "card0:gt", "card0:0", "card1:gt0", "card0:gt0+", "cd:gt0", "card0:gt-1"],
)
def test_malformed_tiles_annotation_is_an_error(text: str) -> None:
    with pytest.raises(SpecError):
        parse_tiles(text, (("card0",),))


# ---------------------------------------------------------------- allow / deny


def test_allow_list_limits_the_cards() -> None:
    gpu_node = node("0.1.2")
    allowed = pod(gas_allow=" card2 , card1")
    assert placed(run(gpu_node, allowed, policy=ALLOW_DENY)) == ("card1", "")
    assert placed(run(gpu_node, allowed)) == ("card0", "")  # feature off: not read


def test_deny_list_excludes_cards() -> None:
    gpu_node = node("0.1.2")
    denied = pod(gas_deny="card0,card1")
    assert placed(run(gpu_node, denied, policy=ALLOW_DENY)) == ("card2", "")
    assert placed(run(gpu_node, denied)) == ("card0", "")
    assert placed(run(gpu_node, pod(gas_deny=""), policy=ALLOW_DENY)) == ("card0", "")


def test_allow_and_deny_together() -> None:
    gpu_node = node("0.1.2")
    both = pod(gas_allow="card0,card1", gas_deny="card0")
    assert placed(run(gpu_node, both, policy=ALLOW_DENY)) == ("card1", "")
    only_allow = Policy(allowlist=True)
    assert placed(run(gpu_node, both, policy=only_allow)) == ("card0", "")


def test_allow_list_leaving_too_few_cards_is_unresolvable() -> None:
    reason = rejected(run(node("0.1"), pod(gas_allow="card5"), policy=ALLOW_DENY))
    assert "only 0 usable" in reason and "gas-allow" in reason
    two = pod(ctr(i915="2"), gas_deny="card1")
    assert "only 1 usable" in rejected(run(node("0.1"), two, policy=ALLOW_DENY))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gas-allow", ""),
        ("gas-allow", "   "),
        ("gas-allow", "card0,,card1"),
        ("gas-allow", "gpu0"),
        ("gas-allow", "card0;card1"),
        ("gas-deny", "card0,"),
        ("gas-deny", "all"),
    ],
)
def test_malformed_allow_deny_is_a_reason_naming_the_annotation(key: str, value: str) -> None:
    bad = pod(**{key.replace("-", "_"): value})
    assert key in rejected(run(node("0.1"), bad, policy=ALLOW_DENY))
    assert placed(run(node("0.1"), bad)) == ("card0", "")  # feature off: not read


# ---------------------------------------------------------------- same GPU


def test_same_gpu_containers_share_one_card() -> None:
    gpu_node = node("0.1", i915="4", millicores="2000")
    result = run(
        gpu_node,
        pod(
            ctr("a", i915="1", millicores="300"),
            ctr("other", i915="1", millicores="900"),
            ctr("b", i915="1", millicores="300"),
            gas_same_gpu="a, b",
        ),
    )
    # Without the annotation b would fit on card0 next to a... and it does, with it too.
    assert placed(result) == ("card0|card1|card0", "")


def test_same_gpu_moves_the_group_to_a_card_that_holds_all() -> None:
    gpu_node = node("0.1", i915="4", millicores="2000")
    # card0 has room for one more container only.
    usage = {"card0": {I915: 1, res("millicores"): 700}}
    group = pod(
        ctr("a", i915="1", millicores="200"),
        ctr("b", i915="1", millicores="200"),
        gas_same_gpu="a,b",
    )
    assert placed(run(gpu_node, group, usage=usage)) == ("card1|card1", "")
    free = pod(ctr("a", i915="1", millicores="200"), ctr("b", i915="1", millicores="200"))
    assert placed(run(gpu_node, free, usage=usage)) == ("card0|card1", "")


def test_same_gpu_group_that_fits_no_card_is_rejected() -> None:
    gpu_node = node("0.1", i915="4", millicores="2000")
    group = pod(
        ctr("a", i915="1", millicores="600"),
        ctr("b", i915="1", millicores="600"),
        gas_same_gpu="a,b",
    )
    assert "does not fit" in rejected(run(gpu_node, group))


@pytest.mark.parametrize(
    ("value", "containers", "expected"),
    [
        ("", [ctr("a", i915="1")], "at least two"),
        ("a", [ctr("a", i915="1")], "at least two"),
        ("a,a", [ctr("a", i915="1")], "twice"),
        ("a,ghost", [ctr("a", i915="1")], "'ghost', not a container"),
        ("a,b", [ctr("a", i915="1"), ctr("b", i915="2")], "exactly 1 GPU"),
        ("a,b", [ctr("a", i915="1"), ctr("b")], "exactly 1 GPU"),
        ("a,b", [ctr("a", i915="1"), ctr("b", i915="1", tiles="0")], "tiles"),
        ("a,b", [ctr("a", i915="1"), ctr("b", i915="1", i915_monitoring="1")], "monitoring"),
        ("a,b", [ctr("a", xe="1"), ctr("b", xe="1", xe_monitoring="1")], "monitoring"),
    ],
)
def test_same_gpu_restrictions(value: str, containers: list[dict[str, Any]], expected: str) -> None:
    gpu_node = node("0.1", i915="8", tiles="4", i915_monitoring="2", xe="8", xe_monitoring="2")
    reason = rejected(run(gpu_node, pod(*containers, gas_same_gpu=value)))
    assert "gas-same-gpu" in reason and expected in reason


def test_same_gpu_and_xelink_cannot_be_combined() -> None:
    both = pod(
        ctr("a", i915="1"), ctr("b", i915="1"), gas_same_gpu="a,b", gas_allocate_xelink="true"
    )
    reason = rejected(run(node("0.1"), both))
    assert "gas-allocate-xelink" in reason and "gas-same-gpu" in reason


# ---------------------------------------------------------------- Xe link


def xe_node(numbers: str = "0.1.2.3", links: str = "0.0-1.0_2.0-3.0", tiles: int = 2) -> NodeGpu:
    return tile_node(numbers, tiles, **{"gpu.intel.com/xe-links": links})


def xe_pod(gpus: int = 2, tiles: int | None = None, flag: str = "true") -> dict[str, Any]:
    return pod(
        ctr(i915=str(gpus), tiles=str(gpus if tiles is None else tiles)), gas_allocate_xelink=flag
    )


def test_xe_link_pair() -> None:
    assert placed(run(xe_node(), xe_pod())) == ("card0,card1", "card0:gt0,card1:gt0")
    assert placed(run(xe_node(), xe_pod(4))) == (
        "card0,card1,card2,card3",
        "card0:gt0,card1:gt0,card2:gt0,card3:gt0",
    )


def test_xe_link_partner_found_from_the_right_hand_side() -> None:
    # The only link names card1 first: GAS never finds card0 -> card1 here.
    gpu_node = xe_node(links="1.0-0.1")
    assert placed(run(gpu_node, xe_pod())) == ("card0,card1", "card0:gt1,card1:gt0")


def test_xe_link_on_a_partially_linked_node() -> None:
    gpu_node = xe_node(links="0.0-2.0_0.1-2.1")
    first = run(gpu_node, xe_pod())
    assert placed(first) == ("card0,card2", "card0:gt0,card2:gt0")
    taken = {"card0": frozenset({0}), "card2": frozenset({0})}
    usage = {"card0": {I915: 1, TILES: 1}, "card2": {I915: 1, TILES: 1}}
    second = run(gpu_node, xe_pod(), usage=usage, tiles_used=taken)
    assert placed(second) == ("card0,card2", "card0:gt1,card2:gt1")
    all_taken = {"card0": frozenset({0, 1}), "card2": frozenset({0, 1})}
    usage = {"card0": {I915: 2, TILES: 2}, "card2": {I915: 2, TILES: 2}}
    third = run(gpu_node, xe_pod(), usage=usage, tiles_used=all_taken)
    assert "tiles" in rejected(third, unresolvable=False)
    # card1 and card3 have no link at all, so four linked GPUs never fit.
    assert "does not fit" in rejected(run(gpu_node, xe_pod(4)))


def test_xe_link_skips_disabled_tiles_and_cards() -> None:
    gpu_node = tile_node(
        "0.1.2.3",
        2,
        **{
            "gpu.intel.com/xe-links": "0.0-1.0_2.0-3.0_2.1-3.1",
            f"{P}gas-disable-card1": "true",
            f"{P}gas-tile-disable-card2_gt0": "true",
        },
    )
    assert placed(run(gpu_node, xe_pod())) == ("card2,card3", "card2:gt1,card3:gt1")


def test_xe_link_device_ids_follow_numeric_gpu_number_order() -> None:
    # Level-Zero device 0 is the lowest GPU number: 1 -> card1, 2 -> card2, 3 -> card10.
    gpu_node = xe_node("10.1.2.11", links="0.0-2.0")
    assert gpu_node.xe_links == ((("card1", 0), ("card10", 0)),)
    assert placed(run(gpu_node, xe_pod())) == ("card1,card10", "card1:gt0,card10:gt0")


@pytest.mark.parametrize(
    ("gpus", "tiles", "expected"),
    [
        (1, 1, "odd"),
        (3, 3, "odd"),
        (2, 4, "as many gpu.intel.com/tiles as GPUs"),
        (2, 0, "as many"),
    ],
)
def test_xe_link_restrictions(gpus: int, tiles: int, expected: str) -> None:
    reason = rejected(run(xe_node(), xe_pod(gpus, tiles)))
    assert "gas-allocate-xelink" in reason and expected in reason


def test_xe_link_without_tiles_request_is_a_reason() -> None:
    bare = pod(ctr(i915="2"), gas_allocate_xelink="")
    assert "gas-allocate-xelink" in rejected(run(xe_node(), bare))


@pytest.mark.parametrize("links", ["0.0-1", "0.0-1.0_x", "0.0-1.0_", "0.0-9.0", "0.0=1.0"])
def test_malformed_xe_links_fail_closed_for_xe_link_pods_only(links: str) -> None:
    gpu_node = xe_node(links=links)
    assert gpu_node.problem is None
    assert "xe-links" in rejected(run(gpu_node, xe_pod()))
    assert placed(run(gpu_node, pod(ctr(i915="2", tiles="2")))) == (
        "card0,card1",
        "card0:gt0,card1:gt0",
    )


def test_xe_link_pod_on_a_node_without_links_is_unresolvable() -> None:
    assert "xe-links" in rejected(run(tile_node("0.1"), xe_pod()))


@pytest.mark.parametrize("flag", ["false", "False", " FALSE "])
def test_xe_link_false_is_off(flag: str) -> None:
    # Odd GPU count would be refused with the annotation on.
    assert placed(run(xe_node(), xe_pod(1, flag=flag))) == ("card0", "card0:gt0")


# ---------------------------------------------------------------- single NUMA


def numa_node(mapping: str = "0-0.1_1-2.3") -> NodeGpu:
    return node("0.1.2.3", {"gpu.intel.com/numa-gpu-map": mapping}, i915="4")


def two_containers(**annotations: str) -> dict[str, Any]:
    return pod(ctr("a", i915="1"), ctr("b", i915="1"), **annotations)


def test_single_numa_keeps_the_whole_pod_in_one_group() -> None:
    usage = {"card0": {I915: 1}}  # one share per card: card0 is full
    assert placed(run(numa_node(), two_containers(), usage=usage)) == ("card1|card2", "")
    numa = two_containers(gas_allocate_single_numa="true")
    assert placed(run(numa_node(), numa, usage=usage)) == ("card2|card3", "")


def test_single_numa_first_group_that_fits_wins() -> None:
    numa = two_containers(gas_allocate_single_numa="")
    assert placed(run(numa_node("0-2.3_1-0.1"), numa)) == ("card2|card3", "")


def test_single_numa_pod_larger_than_any_group_is_unresolvable() -> None:
    numa = pod(ctr(i915="3"), gas_allocate_single_numa="1")
    assert "NUMA" in rejected(run(numa_node(), numa))


def test_single_numa_false_is_off() -> None:
    usage = {"card0": {I915: 1}}
    off = two_containers(gas_allocate_single_numa="false")
    assert placed(run(numa_node(), off, usage=usage)) == ("card1|card2", "")


def test_single_numa_without_map_uses_all_cards() -> None:
    numa = pod(ctr(i915="3"), gas_allocate_single_numa="true")
    assert placed(run(node("0.1.2.3", i915="4"), numa)) == ("card0,card1,card2", "")


@pytest.mark.parametrize("mapping", ["0-0.1_1", "0-0.1-2", "x-0.1", "0-0.a", "0-", "0-0.1_"])
def test_malformed_numa_map_fails_closed(mapping: str) -> None:
    gpu_node = numa_node(mapping)
    assert gpu_node.problem is None
    reason = rejected(run(gpu_node, two_containers(gas_allocate_single_numa="true")))
    assert "numa-gpu-map" in reason
    assert placed(run(gpu_node, two_containers())) == ("card0|card1", "")


# ---------------------------------------------------------------- node policy labels


def test_disabled_card_takes_no_new_pod() -> None:
    gpu_node = node("0.1", {f"{P}gas-disable-card0": "true"})
    assert gpu_node.disabled == {"card0"}
    assert placed(run(gpu_node, pod())) == ("card1", "")
    # Disabled cards still divide the allocatable: per-card capacity is unchanged.
    assert gpu_node.capacity == {I915: 4}


def test_all_cards_disabled_is_unresolvable() -> None:
    gpu_node = node("0", {f"{P}gas-disable-card0": ""})
    assert "disabled by node labels" in rejected(run(gpu_node, pod()))


def test_pci_group_disabling_disables_the_whole_group() -> None:
    gpu_node = node(
        "0.1.2.3.4",
        {"gpu.intel.com/pci-groups": "0.1_2.3.4", f"{P}gas-disable-card3": "PCI_GROUP"},
    )
    assert gpu_node.pci_groups == (
        frozenset({"card0", "card1"}),
        frozenset({"card2", "card3", "card4"}),
    )
    assert gpu_node.disabled == {"card2", "card3", "card4"}
    assert placed(run(gpu_node, pod(ctr(i915="2")))) == ("card0,card1", "")
    assert "only 2 usable" in rejected(run(gpu_node, pod(ctr(i915="3"))))


def test_pci_group_of_a_card_in_no_group_is_the_card_alone() -> None:
    gpu_node = node(
        "0.1.2", {"gpu.intel.com/pci-groups": "0.1", f"{P}gas-disable-card2": "PCI_GROUP"}
    )
    assert gpu_node.disabled == {"card2"}


def test_disable_by_any_other_value_is_the_card_alone() -> None:
    gpu_node = node("0.1", {"gpu.intel.com/pci-groups": "0.1", f"{P}gas-disable-card1": "yes"})
    assert gpu_node.disabled == {"card1"}


def test_pci_group_with_malformed_groups_fails_closed() -> None:
    gpu_node = node(
        "0.1", {"gpu.intel.com/pci-groups": "0.x", f"{P}gas-disable-card1": "PCI_GROUP"}
    )
    assert gpu_node.problem is not None and "pci-groups" in gpu_node.problem
    # Unused, a malformed pci-groups label harms nobody.
    assert node("0.1", {"gpu.intel.com/pci-groups": "0.x"}).problem is None


@pytest.mark.parametrize(
    "key", ["gas-disable-foocard1", "gas-disable-", "gas-deschedule-pods-gpu1"]
)
def test_policy_label_not_naming_a_card_fails_closed(key: str) -> None:
    gpu_node = node("0.1", {f"{P}{key}": "true"})
    assert gpu_node.problem is not None and key in gpu_node.problem


@pytest.mark.parametrize(
    "key",
    [
        "gas-disable-card0",
        "other.prefix/gas-disable-card0",
        "telemetry.aware.scheduling.a/b/gas-disable-card0",
    ],
)
def test_labels_outside_the_policy_namespace_have_no_effect(key: str) -> None:
    gpu_node = node("0.1", {key: "true"})
    assert gpu_node.disabled == frozenset()
    assert gpu_node.problem is None


def test_empty_policy_name_is_accepted_as_in_gas() -> None:
    gpu_node = node("0.1", {"telemetry.aware.scheduling./gas-disable-card0": "true"})
    assert gpu_node.disabled == {"card0"}


def test_preferred_card_is_tried_first_and_others_keep_their_order() -> None:
    gpu_node = node("0.1.2", {f"{P}gas-prefer-gpu": "card2"})
    assert gpu_node.preferred == "card2"
    assert placed(run(gpu_node, pod())) == ("card2", "")
    assert placed(run(gpu_node, pod(ctr(i915="2")))) == ("card2,card0", "")
    usage = {"card2": {I915: 4}}
    assert placed(run(gpu_node, pod(), usage=usage)) == ("card0", "")


def test_preference_for_a_missing_or_disabled_card_changes_nothing() -> None:
    assert node("0.1", {f"{P}gas-prefer-gpu": "card7"}).preferred is None
    assert node("0.1", {f"{P}gas-prefer-gpu": "gpu1"}).preferred is None
    disabled = node("0.1.2", {f"{P}gas-prefer-gpu": "card1", f"{P}gas-disable-card1": "1"})
    assert placed(run(disabled, pod())) == ("card0", "")


def test_several_preferences_pick_the_lowest_card() -> None:
    gpu_node = node(
        "0.1.2",
        {"telemetry.aware.scheduling.a/gas-prefer-gpu": "card2", f"{P}gas-prefer-gpu": "card1"},
    )
    assert gpu_node.preferred == "card1"


def test_descheduled_cards_are_node_data() -> None:
    gpu_node = node(
        "0.1.2.3",
        {
            "gpu.intel.com/pci-groups": "0.1_2.3",
            f"{P}gas-deschedule-pods-card0": "true",
            f"{P}gas-deschedule-pods-card3": "PCI_GROUP",
        },
    )
    assert gpu_node.descheduled == {"card0", "card2", "card3"}
    # As in GAS, descheduling labels pods; it does not stop new allocations.
    assert placed(run(gpu_node, pod())) == ("card0", "")


# ---------------------------------------------------------------- split labels


def test_split_labels_for_every_topology_label() -> None:
    gpu_node = tile_node(
        "0.1",
        2,
        **{
            "gpu.intel.com/gpu-numbers2": "Z.2.3",
            "gpu.intel.com/pci-groups": "0.1",
            "gpu.intel.com/pci-groups2": "Z_2.3",
            "gpu.intel.com/xe-links": "0.0-1.0",
            "gpu.intel.com/xe-links2": "Z_2.0-3.0",
            "gpu.intel.com/numa-gpu-map": "0-0.1",
            "gpu.intel.com/numa-gpu-map2": "Z_1-2.3",
        },
    )
    assert gpu_node.cards == ("card0", "card1", "card2", "card3")
    assert gpu_node.pci_groups == (frozenset({"card0", "card1"}), frozenset({"card2", "card3"}))
    assert len(gpu_node.xe_links) == 2
    assert gpu_node.numa_groups == (("card0", "card1"), ("card2", "card3"))


@pytest.mark.parametrize(
    ("label", "field"),
    [
        ("gpu.intel.com/xe-links", "xe_link_problem"),
        ("gpu.intel.com/numa-gpu-map", "numa_problem"),
    ],
)
def test_empty_continuation_is_a_clear_problem(label: str, field: str) -> None:
    gpu_node = tile_node("0.1", 2, **{label: "0.0-1.0", f"{label}2": ""})
    problem = getattr(gpu_node, field)
    assert problem is not None and f"{label}2 is empty" in problem


def test_empty_gpu_numbers_continuation_is_a_node_problem() -> None:
    gpu_node = node("0.1", {"gpu.intel.com/gpu-numbers2": ""})
    assert gpu_node.problem is not None and "gpu-numbers2 is empty" in gpu_node.problem


def test_empty_pci_groups_continuation_fails_closed_when_used() -> None:
    labels = {"gpu.intel.com/pci-groups": "0.1", "gpu.intel.com/pci-groups2": ""}
    assert node("0.1", labels).problem is None
    used = node("0.1", {**labels, f"{P}gas-disable-card0": "PCI_GROUP"})
    assert used.problem is not None and "pci-groups2 is empty" in used.problem


# ---------------------------------------------------------------- balanced resource


def test_balanced_resource_orders_cards_by_usage() -> None:
    gpu_node = tile_node("0.1.2", 4)
    usage = {"card0": {TILES: 2}, "card1": {TILES: 1}}
    policy = Policy(balanced_resource="tiles")
    assert placed(run(gpu_node, pod(), usage=usage, policy=policy)) == ("card2", "")
    assert placed(run(gpu_node, pod(), usage=usage)) == ("card0", "")
    prefixed = Policy(balanced_resource="gpu.intel.com/tiles")
    assert placed(run(gpu_node, pod(), usage=usage, policy=prefixed)) == ("card2", "")


def test_balanced_resource_ties_keep_numeric_order_and_spread_containers() -> None:
    gpu_node = tile_node("0.1.2.10", 4)
    policy = Policy(balanced_resource="i915")
    assert placed(run(gpu_node, two_containers(), policy=policy)) == ("card0|card1", "")
    usage = {"card0": {I915: 1}, "card1": {I915: 1}, "card2": {I915: 1}}
    assert placed(run(gpu_node, pod(), usage=usage, policy=policy)) == ("card10", "")


def test_balanced_resource_counts_unavailable_tiles_and_ignores_preference() -> None:
    gpu_node = tile_node(
        "0.1", 4, **{f"{P}gas-tile-disable-card0_gt0": "1", f"{P}gas-prefer-gpu": "card0"}
    )
    policy = Policy(balanced_resource="tiles")
    assert placed(run(gpu_node, pod(), policy=policy)) == ("card1", "")
    assert placed(run(gpu_node, pod())) == ("card0", "")


def test_unknown_balanced_resource_keeps_numeric_order() -> None:
    policy = Policy(balanced_resource="nonesuch")
    assert placed(run(node("0.1"), pod(), policy=policy)) == ("card0", "")
