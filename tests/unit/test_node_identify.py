"""Which pod and container a device-plugin request is for (gas.node.identify), and what the
node agent records having handed out (gas.node.handout)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, cast

import pytest

from gas.node.handout import format_segments, handed_out, parse_segments
from gas.node.identify import (
    AMBIGUOUS,
    GAS,
    MISMATCH,
    PROBLEM,
    UNIDENTIFIED,
    UNMANAGED,
    PodRecord,
    candidates,
    check_allocate,
    for_allocate,
    for_preferred,
    pod_record,
)

I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"


def container(name: str, i915: int = 0, env: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {I915: str(i915)} if i915 else {}
    item: dict[str, Any] = {"name": name, "resources": {"limits": limits}}
    if env:
        item["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return item


def pod(
    name: str,
    *containers: dict[str, Any],
    cards: str | None = None,
    tiles: str | None = None,
    created: str = "2025-01-01T00:00:00Z",
    phase: str = "Pending",
    namespace: str = "default",
) -> PodRecord:
    annotations = {}
    if cards is not None:
        annotations["gas-container-cards"] = cards
    if tiles is not None:
        annotations["gas-container-tiles"] = tiles
    obj = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": {"containers": list(containers) or [container("c", 1)]},
        "status": {"phase": phase},
    }
    record = pod_record(obj)
    assert record is not None
    return record


def listed(*pods: PodRecord, **held: dict[str, list[str]]) -> dict[Any, Any]:
    """Pod-resources as the plugin sees it: every listed pod, `held[name]` its devices."""
    return {p.key: {k: frozenset(v) for k, v in held.get(p.name, {}).items()} for p in pods}


AVAILABLE = [f"card{c}-{s}" for c in range(4) for s in range(3)]
OLD, NEW, A, B, TWO = (("default", n) for n in ("old", "new", "a", "b", "two"))


def test_pod_record_reads_cards_tiles_and_the_hierarchy() -> None:
    record = pod(
        "p",
        container("a", 1, env={"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}),
        container("side"),
        container("b", 2),
        cards="card1||card0,card2",
        tiles="card1:gt0+gt1||",
    )
    assert record.annotated and record.problem is None
    a, side, b = record.containers
    assert (a.cards, a.tiles, a.composite, a.devices) == (
        ("card1",),
        (("card1", (0, 1)),),
        True,
        {I915: 1},
    )
    assert side.devices == {} and side.cards == ()
    assert b.cards == ("card0", "card2") and b.devices == {I915: 2}
    assert pod_record({"metadata": {"name": "x"}}) is None


@pytest.mark.parametrize(
    ("gpus", "cards", "match"),
    [
        ((1, 1), "card0", "1 segments for 2 containers"),
        ((1, 0), "|card0", "no card"),
        ((1, 0), "card0,card1|", "2 card"),
        ((1, 0), "cardX|", "malformed"),
    ],
)
def test_unusable_annotations_are_a_problem_not_a_guess(
    gpus: tuple[int, int], cards: str, match: str
) -> None:
    record = pod("p", container("a", gpus[0]), container("b", gpus[1]), cards=cards)
    assert record.problem is not None
    assert re.search(match, record.problem)
    found = candidates([record], I915, listed(record))
    assert for_preferred(found, I915, 1, AVAILABLE).outcome == PROBLEM


def test_the_next_gpu_container_skips_those_served_and_those_without_gpus() -> None:
    p = pod(
        "p",
        container("a", 1),
        container("side"),
        container("b", 1),
        cards="card1||card0",
    )
    found = candidates([p], I915, listed(p))
    assert [c.container.name for c in found] == ["a"]
    found = candidates([p], I915, listed(p, p={"a": ["card1-0"]}))
    assert [c.container.name for c in found] == ["b"]
    decision = for_preferred(found, I915, 1, AVAILABLE)
    assert (decision.outcome, decision.preferred) == (GAS, ("card0-0",))
    assert candidates([p], I915, listed(p, p={"a": ["card1-0"], "b": ["card0-1"]})) == []


def test_only_the_pod_the_kubelet_listed_last_is_the_one_it_admits() -> None:
    old = pod("old", cards="card0", created="2025-01-01T00:00:01Z")
    new = pod("new", cards="card1", created="2025-01-01T00:00:02Z")
    unlisted = pod("b-later", cards="card2", created="2025-01-01T00:00:00Z")
    # `old` was listed first: its admission ended (the kubelet refused it), whatever its age
    found = candidates([new, unlisted, old], I915, listed(old, new), listed={OLD: 1, NEW: 2})
    decision = for_preferred(found, I915, 1, AVAILABLE)
    assert decision.candidate is not None and decision.candidate.pod.name == "new"
    assert decision.preferred == ("card1-0",)
    # ...also when it is the younger one
    found = candidates([new, old], I915, listed(old, new), listed={OLD: 3, NEW: 2})
    assert for_allocate(found, I915, ["card0-1"]).outcome == GAS
    # a pod the kubelet has not received yet is never the one it admits
    decision = for_preferred(candidates([unlisted], I915, listed(old)), I915, 1, AVAILABLE)
    assert decision.outcome == UNIDENTIFIED and "lists none" in decision.reason


def test_pods_first_listed_together_are_ambiguous_never_a_guess() -> None:
    # the same second and the same listing: the kubelet refused one of them, and nothing
    # says which yet
    a = pod("a", cards="card0")
    b = pod("b", cards="card1")
    found = candidates([b, a], I915, listed(a, b), listed={A: 4, B: 4})
    assert [c.pod.name for c in found] == ["a", "b"]
    decision = for_preferred(found, I915, 1, AVAILABLE)
    assert decision.outcome == AMBIGUOUS and decision.candidate is None
    assert "default/a" in decision.reason and "default/b" in decision.reason
    assert for_allocate(found, I915, ["card1-0"]).outcome == AMBIGUOUS
    # ...even when only one of them could have its cards: the other may be the one
    # admitted, and then it must be refused, not given the first one's card
    without_card0 = [i for i in AVAILABLE if not i.startswith("card0-")]
    assert for_preferred(found, I915, 1, without_card0).outcome == AMBIGUOUS
    # the device count tells them apart: only one of them can be asking
    two = pod("two", container("c", 2), cards="card2,card3")
    found = candidates([two, b], I915, listed(two, b), listed={TWO: 4, B: 4})
    decision = for_preferred(found, I915, 2, AVAILABLE)
    assert decision.candidate is not None and decision.candidate.pod.name == "two"


def test_the_candidates_cards_must_be_offered() -> None:
    first = pod("first", cards="card0")
    without_card0 = [i for i in AVAILABLE if not i.startswith("card0-")]
    decision = for_preferred(candidates([first], I915, listed(first)), I915, 1, without_card0)
    assert decision.outcome == MISMATCH and "card0" in decision.reason
    assert decision.candidate is not None and decision.candidate.pod.name == "first"


def test_no_candidate_asking_for_that_many_is_unidentified() -> None:
    p = pod("p", container("c", 2), cards="card0,card1")
    decision = for_preferred(candidates([p], I915, listed(p)), I915, 1, AVAILABLE)
    assert decision.outcome == UNIDENTIFIED and "asks for 2" in decision.reason
    decision = for_preferred([], I915, 1, AVAILABLE)
    assert decision.outcome == UNIDENTIFIED


def test_pods_that_are_not_pending_or_were_refused_are_not_candidates() -> None:
    running = pod("running", cards="card0", phase="Running")
    refused = pod("refused", cards="card1")
    assert candidates([running, refused], I915, listed(running, refused), {"uid-refused"}) == []


def test_a_pod_without_gas_annotations_is_unmanaged() -> None:
    p = pod("plain")
    decision = for_preferred(candidates([p], I915, listed(p)), I915, 1, AVAILABLE)
    assert decision.outcome == UNMANAGED and decision.preferred == ()
    decision = for_allocate(candidates([p], I915, listed(p)), I915, ["card3-1"])
    assert decision.outcome == UNMANAGED


def test_allocate_checks_the_kubelets_ids_against_gas() -> None:
    a = pod("a", cards="card0")
    found = candidates([a], I915, listed(a))
    assert for_allocate(found, I915, ["card0-2"]).outcome == GAS
    decision = for_allocate(found, I915, ["card3-0"])
    assert decision.outcome == MISMATCH and decision.candidate is not None
    assert "card3" in decision.reason and "card0" in decision.reason
    # identified by GetPreferredAllocation: the IDs must be its cards, nobody else's
    assert check_allocate(found[0], ["card1-0"]).outcome == MISMATCH
    assert check_allocate(found[0], ["card0-0"]).outcome == GAS


def test_handed_out_records_every_container_in_the_annotation_format() -> None:
    p = pod("p", container("a", 1), container("side"), container("b", 1), cards="card1||card0")
    first = handed_out(p, None, {}, 0, ["card1"])
    assert format_segments(first) == "card1||"
    second = handed_out(p, first, {}, 2, ["card0"])
    assert format_segments(second) == "card1||card0"
    # after a restart: from what the kubelet says the containers hold
    again = handed_out(p, None, {"a": ["card1-4"]}, 2, ["card0"])
    assert format_segments(again) == "card1||card0"
    assert parse_segments("card1||card0", 3) == [("card1",), (), ("card0",)]
    assert parse_segments("card1|", 3) == [(), (), ()]
    assert parse_segments("bad||", 3) == [(), (), ()]


def test_the_matcher_numbers_the_listing_that_first_showed_each_pod() -> None:
    from gas.node.matcher import PodMatcher

    matcher = PodMatcher(cast(Any, None), cast(Any, None))  # observe reads neither
    a, b = pod("a"), pod("b")
    assert matcher.observe(listed(a), [a, b]) == {A: 1}
    assert matcher.observe(listed(a, b), [a, b]) == {A: 1, B: 2}
    # a pod the kubelet no longer lists is forgotten; back, it is new again
    assert matcher.observe(listed(b), [a, b]) == {B: 2}
    assert matcher.observe(listed(a, b), [a, b]) == {A: 4, B: 2}
    # the same name with another UID: deleted and made again, so first shown now
    again = dataclasses.replace(b, uid="uid-b-2")
    assert matcher.observe(listed(a, again), [a, again]) == {A: 4, B: 5}
    # a pod the API server has not shown yet keeps its number once it does
    c = pod("c")
    assert matcher.observe(listed(a, c), [a]) == {A: 4, ("default", "c"): 6}
    assert matcher.observe(listed(a, c), [a, c]) == {A: 4, ("default", "c"): 6}


def test_init_containers_asking_for_gpus_come_first_and_gas_never_placed_them() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "uid": "uid-p", "namespace": "default"},
        "spec": {
            "initContainers": [container("setup"), container("warm", 1)],
            "containers": [container("app", 2)],
        },
        "status": {"phase": "Pending"},
    }
    record = pod_record(obj)
    assert record is not None and record.problem is None
    assert [(c.name, c.index, c.init) for c in record.init_containers] == [("warm", 1, True)]
    found = candidates([record], I915, listed(record))
    assert [c.container.name for c in found] == ["warm"]
    assert for_preferred(found, I915, 1, AVAILABLE).outcome == UNMANAGED
    found = candidates([record], I915, {record.key: {"warm": frozenset({"card0-0"})}})
    assert [c.container.name for c in found] == ["app"]
    obj["metadata"]["annotations"] = {"gas-container-cards": "card1"}
    placed = pod_record(obj)
    assert placed is not None and placed.problem is not None
    assert "init container 'warm'" in placed.problem
