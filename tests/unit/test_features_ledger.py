"""Feature bookkeeping in the ledger: what bind writes is what a restarted gas reads back."""

from __future__ import annotations

from typing import Any

import pytest

from gas.core.allocator import Placement, Policy, Rejection
from gas.core.holdings import observe_pod
from gas.core.ledger import Ledger
from gas.core.model import (
    I915,
    TILES,
    format_cards,
    format_tiles,
    node_from_object,
    pod_request,
)
from tests.support.objects import ctr, make_node, pod_object

P = "telemetry.aware.scheduling.policy/"


def node_obj(numbers: str = "0.1", tiles: int = 2, **labels: str) -> dict[str, Any]:
    """Node n1 with 4 i915 and `tiles` tiles per card."""
    cards = len(numbers.split("."))
    return make_node("n1", numbers, labels=labels, i915=str(4 * cards), tiles=str(tiles * cards))


def ledger_with(obj: dict[str, Any], policy: Policy | None = None) -> Ledger:
    ledger = Ledger(clock=lambda: 100.0, policy=policy)
    node = node_from_object(obj)
    assert node.problem is None, node.problem
    ledger.replace_nodes([node])
    return ledger


def make_pod(name: str, *containers: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """A Pending pod; annotation keywords spell `-` as `_`."""
    return pod_object(
        name,
        *(containers or (ctr(i915="1", tiles="1"),)),
        namespace="ns",
        annotations={k.replace("_", "-"): v for k, v in annotations.items()},
        phase="Pending",
    )


def reserve(ledger: Ledger, pod: dict[str, Any]) -> Placement:
    meta = pod["metadata"]
    result = ledger.reserve_placement(
        meta["uid"], meta["namespace"], meta["name"], pod_request(pod), "n1"
    )
    assert isinstance(result, Placement), result
    return result


def bound(pod: dict[str, Any], placement: Placement) -> dict[str, Any]:
    """The pod as the watch shows it after bind wrote its annotations."""
    annotations = dict(pod["metadata"].get("annotations") or {})
    annotations["gas-container-cards"] = format_cards(placement.cards)
    if pod_request(pod).wants_tiles:
        annotations["gas-container-tiles"] = format_tiles(placement.tiles)
    metadata = {**pod["metadata"], "annotations": annotations}
    return {
        **pod,
        "metadata": metadata,
        "spec": {**pod["spec"], "nodeName": "n1"},
        "status": {"phase": "Running"},
    }


def observe(ledger: Ledger, pod: dict[str, Any]) -> None:
    observation = observe_pod(pod)
    assert observation is not None
    ledger.observe(observation)


def restarted(obj: dict[str, Any], *pods: dict[str, Any], policy: Policy | None = None) -> Ledger:
    """A fresh ledger rebuilt from a pod list, as after a restart."""
    ledger = ledger_with(obj, policy)
    observations = [o for o in map(observe_pod, pods) if o is not None]
    ledger.replace_pods(observations, listed_at=100.0)
    return ledger


def tiles_of(placement: Placement) -> str:
    return format_tiles(placement.tiles)


# ---------------------------------------------------------------- tiles


def test_tiles_held_while_reserved_and_released_on_cancel() -> None:
    ledger = ledger_with(node_obj())
    a = reserve(ledger, make_pod("a"))
    assert tiles_of(a) == "card0:gt0"
    assert tiles_of(reserve(ledger, make_pod("b"))) == "card0:gt1"
    ledger.cancel("uid-a")
    assert tiles_of(reserve(ledger, make_pod("c"))) == "card0:gt0"


def test_tiles_read_back_from_annotations_after_a_restart() -> None:
    obj = node_obj()
    ledger = ledger_with(obj)
    mixed = make_pod(
        "mixed",
        ctr("a", i915="1", tiles="1"),
        ctr("plain", i915="1"),
        ctr("b", i915="1", tiles="1"),
    )
    placement = reserve(ledger, mixed)
    assert (format_cards(placement.cards), tiles_of(placement)) == (
        "card0|card0|card0",
        "card0:gt0||card0:gt1",
    )
    shown = bound(mixed, placement)
    observe(ledger, shown)
    again = restarted(obj, shown)
    for book in (ledger, again):
        assert book.snapshot()["tiles"] == {"n1": {"card0": [0, 1]}}
        assert book.usage("n1") == {"card0": {I915: 3, TILES: 2}}
        # card0 has two shares left but no tile.
        assert tiles_of(reserve(book, make_pod("next"))) == "card1:gt0"


def test_pod_released_frees_its_tiles() -> None:
    obj = node_obj()
    ledger = ledger_with(obj)
    placement = reserve(ledger, make_pod("a"))
    shown = bound(make_pod("a"), placement)
    observe(ledger, shown)
    observe(ledger, {**shown, "status": {"phase": "Succeeded"}})
    assert "tiles" not in ledger.snapshot()
    assert tiles_of(reserve(ledger, make_pod("b"))) == "card0:gt0"


def test_retry_of_an_uncertain_bind_does_not_count_its_own_tiles() -> None:
    ledger = ledger_with(node_obj("0", tiles=1))
    pod = make_pod("a")
    reserve(ledger, pod)
    ledger.commit("uid-a")  # outcome unknown: PENDING
    assert isinstance(ledger.reserve_placement("x", "ns", "x", pod_request(pod), "n1"), Rejection)
    assert tiles_of(reserve(ledger, pod)) == "card0:gt0"


def test_tiles_of_pods_bound_by_gas_before_tiles_existed_still_count() -> None:
    # GAS wrote the cards but (on a failure) an empty tile entry: the tiles count stays.
    obj = node_obj("0", tiles=2)
    old = make_pod("old", ctr(i915="1", tiles="1"))
    old["metadata"]["annotations"] = {"gas-container-cards": "card0"}
    old["spec"]["nodeName"] = "n1"
    ledger = restarted(obj, old)
    assert tiles_of(reserve(ledger, make_pod("new"))) == "card0:gt0"
    assert isinstance(
        ledger.reserve_placement("x", "ns", "x", pod_request(make_pod("x")), "n1"), Rejection
    )


@pytest.mark.parametrize(
    ("tiles", "blocked"),
    [
        ("card0:gtX", ["card0"]),
        ("card1:gt0", ["card1"]),  # a card the container was not given
        ("card0:gt0|card0:gt1", ["card0"]),  # two segments for one container
        ("garbage", ["card0"]),  # names no card: the pod's own cards
    ],
)
def test_unparsable_tiles_annotation_fails_closed_for_the_cards_it_names(
    tiles: str, blocked: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    obj = node_obj("0.1.2")
    pod = make_pod("bad")
    pod["metadata"]["annotations"] = {"gas-container-cards": "card0", "gas-container-tiles": tiles}
    pod["spec"]["nodeName"] = "n1"
    observation = observe_pod(pod)
    assert observation is not None and observation.holding is not None
    assert sorted(observation.holding.blocked_cards) == blocked
    assert not observation.holding.blocks_node
    assert "gas-container-tiles" in caplog.text
    ledger = restarted(obj, pod)
    # The cards annotation is still accounted.
    assert ledger.usage("n1") == {"card0": {I915: 1, TILES: 1}}
    free = next(c for c in ("card0", "card1", "card2") if c not in blocked)
    assert tiles_of(reserve(ledger, make_pod("next"))) == f"{free}:gt0"


def test_unavailable_tile_label_and_held_tiles_together() -> None:
    obj = node_obj("0", tiles=3, **{f"{P}gas-tile-deschedule-card0_gt1": "true"})
    ledger = ledger_with(obj)
    first = reserve(ledger, make_pod("a"))
    assert tiles_of(first) == "card0:gt0"
    assert tiles_of(reserve(ledger, make_pod("b"))) == "card0:gt2"
    assert isinstance(
        ledger.reserve_placement("c", "ns", "c", pod_request(make_pod("c")), "n1"), Rejection
    )


# ---------------------------------------------------------------- Xe link


def test_xe_link_tiles_survive_a_restart() -> None:
    obj = node_obj("0.1.2.3", tiles=2, **{"gpu.intel.com/xe-links": "0.0-1.0_1.1-0.1_2.0-3.0"})
    ledger = ledger_with(obj)
    xe = make_pod("x1", ctr(i915="2", tiles="2"), gas_allocate_xelink="true")
    placement = reserve(ledger, xe)
    assert tiles_of(placement) == "card0:gt0,card1:gt0"
    shown = bound(xe, placement)
    again = restarted(obj, shown)
    second = make_pod("x2", ctr(i915="2", tiles="2"), gas_allocate_xelink="true")
    # The reversed link 1.1-0.1 is found from its right-hand side.
    assert tiles_of(reserve(again, second)) == "card0:gt1,card1:gt1"
    third = make_pod("x3", ctr(i915="2", tiles="2"), gas_allocate_xelink="true")
    assert tiles_of(reserve(again, third)) == "card2:gt0,card3:gt0"
    fourth = make_pod("x4", ctr(i915="2", tiles="2"), gas_allocate_xelink="true")
    refused = again.reserve_placement("x4", "ns", "x4", pod_request(fourth), "n1")
    assert isinstance(refused, Rejection) and not refused.unresolvable


# ---------------------------------------------------------------- same GPU, allow/deny


def test_same_gpu_usage_after_a_restart() -> None:
    obj = node_obj("0.1")
    ledger = ledger_with(obj)
    group = make_pod("g", ctr("a", i915="1"), ctr("b", i915="1"), gas_same_gpu="a,b")
    placement = reserve(ledger, group)
    assert format_cards(placement.cards) == "card0|card0"
    again = restarted(obj, bound(group, placement))
    assert again.usage("n1") == {"card0": {I915: 2}}


def test_ledger_applies_its_policy() -> None:
    obj = node_obj("0.1")
    pod = make_pod("a", ctr(i915="1"), gas_deny="card0")
    on = ledger_with(obj, Policy(denylist=True))
    off = ledger_with(obj)
    assert on.check(pod_request(pod), ["n1"]) == {"n1": (("card1",),)}
    assert off.check(pod_request(pod), ["n1"]) == {"n1": (("card0",),)}
    bad = make_pod("b", ctr(i915="1"), gas_deny="card0,,")
    result = on.check(pod_request(bad), ["n1"])["n1"]
    assert isinstance(result, Rejection) and result.unresolvable and "gas-deny" in result.reason


def test_feature_annotations_do_not_affect_accounting_of_bound_pods() -> None:
    # A bound pod with a now-malformed feature annotation is accounted normally.
    obj = node_obj("0.1")
    pod = make_pod("a", ctr("a", i915="1"), gas_same_gpu="a", gas_allow="")
    pod["metadata"]["annotations"]["gas-container-cards"] = "card1"
    pod["spec"]["nodeName"] = "n1"
    ledger = restarted(obj, pod)
    assert ledger.usage("n1") == {"card1": {I915: 1}}
    assert ledger.snapshot()["pods"]["uid-a"]["blocked_cards"] == []
