"""Unit and property tests for gas.core.allocator: card choice and rejection reasons."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import combinations, product
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gas.core import allocator
from gas.core.allocator import NODE_BLOCKED, Placement, Rejection, place
from gas.core.model import (
    I915,
    TILES,
    XE,
    Allocation,
    ContainerNeed,
    NodeGpu,
    PodRequest,
    allocation_usage,
    node_from_object,
    pod_request,
)
from tests.support.objects import MEM, MILLI, G, res
from tests.support.objects import card_node as gpu_node

MODEST = settings(max_examples=200, deadline=None)


def need(gpus: int = 1, name: str = "c", **requests: int) -> ContainerNeed:
    amounts = {res(k): v for k, v in requests.items()}
    if gpus and XE not in amounts:
        amounts.setdefault(I915, gpus)
    return ContainerNeed(name, gpus, amounts)


def pod(*needs: ContainerNeed) -> PodRequest:
    return PodRequest(tuple(needs))


def used(**cards: dict[str, int]) -> dict[str, dict[str, int]]:
    return {card: {res(k): v for k, v in r.items()} for card, r in cards.items()}


def cards_of(result: Placement | Rejection) -> Allocation | Rejection:
    """The cards `place` chose (these tests are about card choice), or its rejection."""
    return result if isinstance(result, Rejection) else result.cards


# ---------------------------------------------------------------- basic placement


def test_one_card_node() -> None:
    node = gpu_node(1, i915=8, memory_max=8 * G)
    assert cards_of(place(node, {}, pod(need(memory_max=5 * G)))) == (("card0",),)


def test_first_fit_prefers_lowest_card() -> None:
    node = gpu_node(4, i915=8)
    assert cards_of(place(node, {}, pod(need()))) == (("card0",),)


def test_full_card_is_skipped() -> None:
    node = gpu_node(2, i915=1)
    assert cards_of(place(node, used(card0={"i915": 1}), pod(need()))) == (("card1",),)


def test_numeric_order_card2_before_card10() -> None:
    node = node_from_object(
        {
            "metadata": {"name": "n", "labels": {"gpu.intel.com/gpu-numbers": "10.2"}},
            "status": {"allocatable": {I915: "2"}},
        }
    )
    assert cards_of(place(node, {}, pod(need()))) == (("card2",),)


def test_multi_gpu_container_gets_distinct_cards() -> None:
    node = gpu_node(4, i915=8, memory_max=8 * G)
    request = pod(need(2, memory_max=8 * G))
    assert cards_of(place(node, {}, request)) == (("card0", "card1"),)


def test_multi_gpu_container_skips_busy_cards() -> None:
    node = gpu_node(4, i915=1)
    usage = used(card1={"i915": 1}, card2={"i915": 1})
    assert cards_of(place(node, usage, pod(need(2)))) == (("card0", "card3"),)


def test_four_gpu_container_on_four_card_node() -> None:
    node = gpu_node(4, i915=1)
    assert cards_of(place(node, {}, pod(need(4)))) == (("card0", "card1", "card2", "card3"),)


def test_container_asking_more_cards_than_node_has_is_unresolvable() -> None:
    node = gpu_node(2, i915=8)
    assert cards_of(place(node, {}, pod(need(3)))) == Rejection(
        "gpu: container asks for 3 cards, node has 2", unresolvable=True
    )


def test_multi_gpu_need_is_rounded_up_per_card() -> None:
    node = gpu_node(2, i915=1, memory_max=5)
    assert cards_of(place(node, {}, pod(need(2, memory_max=9)))) == (("card0", "card1"),)
    # 11 over 2 cards is 6 per card, more than 5.
    result = cards_of(place(node, {}, pod(need(2, memory_max=11))))
    assert result == Rejection(
        "gpu: container needs more gpu.intel.com/memory.max per card than a card has",
        unresolvable=True,
    )


def test_xe_is_the_gpu_count() -> None:
    node = gpu_node(2, xe=4, i915=4)
    request = pod(ContainerNeed("c", 2, {XE: 2, I915: 1}))
    assert cards_of(place(node, {}, request)) == (("card0", "card1"),)


def test_xe_request_needs_xe_capacity() -> None:
    node = gpu_node(2, i915=4)
    assert cards_of(place(node, {}, pod(ContainerNeed("c", 1, {XE: 1})))) == Rejection(
        "gpu: node has no gpu.intel.com/xe per card", unresolvable=True
    )


# ---------------------------------------------------------------- multi-container pods


def test_later_container_sees_earlier_usage() -> None:
    node = gpu_node(2, i915=8, memory_max=8 * G)
    request = pod(need(name="a", memory_max=5 * G), need(name="b", memory_max=5 * G))
    assert cards_of(place(node, {}, request)) == (("card0",), ("card1",))


def test_containers_of_one_pod_may_share_a_card() -> None:
    node = gpu_node(2, i915=8, tiles=2)
    request = pod(need(name="a", tiles=1), need(name="b", tiles=1))
    assert cards_of(place(node, {}, request)) == (("card0",), ("card0",))


def test_container_without_gpu_gets_no_card() -> None:
    node = gpu_node(1, i915=1)
    request = pod(need(0, name="side"), need(name="main"), ContainerNeed("x", 0, {MILLI: 9}))
    assert cards_of(place(node, {}, request)) == ((), ("card0",), ())


def test_pod_without_gpu_need_gets_empty_allocation_even_on_full_node() -> None:
    node = gpu_node(1, i915=1)
    request = pod(ContainerNeed("a", 0, {I915: 0}), ContainerNeed("b", 0, {MEM: 5}))
    full = used(card0={"i915": 1})
    assert cards_of(place(node, full, request)) == ((), ())
    assert cards_of(place(node, full, request, node_blocked=True)) == ((), ())


def test_zero_i915_container_needs_no_card_and_no_capacity() -> None:
    node = gpu_node(1, i915=1)  # no memory.max on this node
    request = pod(ContainerNeed("a", 0, {I915: 0, MEM: 10 * G}))
    assert cards_of(place(node, {}, request)) == ((),)


def test_two_containers_that_cannot_share_the_only_card_is_unresolvable() -> None:
    node = gpu_node(1, i915=8, memory_max=8)
    request = pod(need(name="a", memory_max=5), need(name="b", memory_max=5))
    assert cards_of(place(node, {}, request)) == Rejection(
        "gpu: pod does not fit on this node even with all its cards idle", unresolvable=True
    )


# ---------------------------------------------------------------- exact fits, off by one


def test_capacity_exactly_met_on_idle_card() -> None:
    node = gpu_node(1, i915=8, memory_max=8 * G)
    assert cards_of(place(node, {}, pod(need(memory_max=8 * G)))) == (("card0",),)


def test_one_unit_over_card_capacity_is_unresolvable() -> None:
    node = gpu_node(1, i915=8, memory_max=8 * G)
    assert cards_of(place(node, {}, pod(need(memory_max=8 * G + 1)))) == Rejection(
        "gpu: container needs more gpu.intel.com/memory.max per card than a card has",
        unresolvable=True,
    )


def test_capacity_exactly_met_with_usage() -> None:
    node = gpu_node(2, i915=8, memory_max=8 * G)
    usage = used(card0={"i915": 1, "memory_max": 3 * G})
    assert cards_of(place(node, usage, pod(need(memory_max=5 * G)))) == (("card0",),)


def test_one_unit_over_remaining_goes_to_next_card() -> None:
    node = gpu_node(2, i915=8, memory_max=8 * G)
    usage = used(card0={"i915": 1, "memory_max": 3 * G})
    assert cards_of(place(node, usage, pod(need(memory_max=5 * G + 1)))) == (("card1",),)


def test_one_unit_over_remaining_everywhere_is_resolvable() -> None:
    node = gpu_node(2, i915=8, memory_max=8 * G)
    usage = used(card0={"i915": 1, "memory_max": 3 * G}, card1={"i915": 1, "memory_max": 3 * G})
    assert cards_of(place(node, usage, pod(need(memory_max=5 * G)))) == (("card0",),)
    assert cards_of(place(node, usage, pod(need(memory_max=5 * G + 1)))) == Rejection(
        "gpu: not enough free gpu.intel.com/memory.max on the node's cards", unresolvable=False
    )


def test_i915_share_count_limits_pods_per_card() -> None:
    node = gpu_node(1, i915=2, memory_max=8 * G)
    assert cards_of(place(node, used(card0={"i915": 1}), pod(need()))) == (("card0",),)
    assert cards_of(place(node, used(card0={"i915": 2}), pod(need()))) == Rejection(
        "gpu: not enough free gpu.intel.com/i915 on the node's cards", unresolvable=False
    )


# ---------------------------------------------------------------- missing or mismatched capacity


def test_node_problem_is_unresolvable() -> None:
    node = node_from_object({"metadata": {"name": "plain"}, "status": {"allocatable": {}}})
    assert cards_of(place(node, {}, pod(need()))) == Rejection(
        "gpu: node has no gpu.intel.com/gpu-numbers or gpu.intel.com/cards label",
        unresolvable=True,
    )


def test_node_problem_applies_even_to_a_pod_without_gpu_need() -> None:
    node = NodeGpu("bad", problem="gpu: node label gpu.intel.com/gpu-numbers is malformed")
    assert cards_of(place(node, {}, pod(need(0)))) == Rejection(
        "gpu: node label gpu.intel.com/gpu-numbers is malformed", unresolvable=True
    )


def test_resource_missing_on_node_is_unresolvable() -> None:
    node = gpu_node(2, i915=8)
    assert cards_of(place(node, {}, pod(need(millicores=100)))) == Rejection(
        "gpu: node has no gpu.intel.com/millicores per card", unresolvable=True
    )


def test_zero_request_of_missing_resource_still_needs_capacity() -> None:
    node = gpu_node(2, i915=8)
    assert cards_of(place(node, {}, pod(need(millicores=0)))) == Rejection(
        "gpu: node has no gpu.intel.com/millicores per card", unresolvable=True
    )


def test_more_cards_than_i915_leaves_no_share_per_card() -> None:
    obj = {
        "metadata": {"name": "n", "labels": {"gpu.intel.com/gpu-numbers": "0.1.2.3"}},
        "status": {"allocatable": {I915: "2"}},
    }
    node = node_from_object(obj)
    assert cards_of(place(node, {}, pod(need()))) == Rejection(
        "gpu: node has no gpu.intel.com/i915 per card", unresolvable=True
    )


def test_label_allocatable_mismatch_uses_truncated_share() -> None:
    obj = {
        "metadata": {"name": "n", "labels": {"gpu.intel.com/gpu-numbers": "0.1"}},
        "status": {"allocatable": {I915: "3"}},
    }
    node = node_from_object(obj)
    assert node.capacity == {I915: 1}
    assert cards_of(place(node, used(card0={"i915": 1}), pod(need()))) == (("card1",),)
    full = used(card0={"i915": 1}, card1={"i915": 1})
    assert cards_of(place(node, full, pod(need()))) == Rejection(
        "gpu: not enough free gpu.intel.com/i915 on the node's cards", unresolvable=False
    )


def test_huge_memory_ask_is_unresolvable() -> None:
    node = gpu_node(2, i915=8, memory_max=8 * G)
    assert cards_of(place(node, {}, pod(need(memory_max=2**63 - 1)))) == Rejection(
        "gpu: container needs more gpu.intel.com/memory.max per card than a card has",
        unresolvable=True,
    )


def test_from_pod_dict_end_to_end() -> None:
    node = node_from_object(
        {
            "metadata": {"name": "n1", "labels": {"gpu.intel.com/gpu-numbers": "0.1"}},
            "status": {
                "allocatable": {I915: "16", MILLI: "2000", TILES: "4", "cpu": "8"},
            },
        }
    )
    usage = used(card0={"i915": 1, "millicores": 600})
    pod_a = pod_request(
        {
            "spec": {
                "containers": [{"name": "a", "resources": {"limits": {I915: "1", MILLI: "500"}}}]
            }
        }
    )
    assert cards_of(place(node, usage, pod_a)) == (("card1",),)
    pod_c = pod_request(
        {
            "spec": {
                "containers": [
                    {"name": "x", "resources": {"requests": {I915: "1", TILES: "1"}}},
                    {"name": "y", "resources": {"requests": {I915: "1", TILES: "1"}}},
                ]
            }
        }
    )
    assert cards_of(place(node, usage, pod_c)) == (("card0",), ("card0",))


# ---------------------------------------------------------------- backtracking


def test_backtracking_finds_assignment_first_fit_misses() -> None:
    # card0 has 9 free, card1 has 5 free: A (4) must go to card1 so B (9) fits on card0.
    node = gpu_node(2, i915=8, memory_max=10)
    usage = used(card0={"memory_max": 1}, card1={"memory_max": 5})
    request = pod(need(name="a", memory_max=4), need(name="b", memory_max=9))
    assert cards_of(place(node, usage, request)) == (("card1",), ("card0",))


def test_backtracking_across_multi_gpu_containers() -> None:
    # First fit puts A (4 per card) on card0+card1, leaving no card with 9 free for B;
    # A on card0+card2 leaves card1 idle for B.
    node = gpu_node(3, i915=8, memory_max=10)
    usage = used(card2={"memory_max": 5})
    request = pod(need(2, name="a", memory_max=8), need(1, name="b", memory_max=9))
    assert cards_of(place(node, usage, request)) == (("card0", "card2"), ("card1",))


def test_first_fit_result_is_kept_when_it_works() -> None:
    node = gpu_node(4, i915=8, memory_max=10)
    request = pod(need(name="a", memory_max=4), need(2, name="b", memory_max=12))
    # First fit: a -> card0, b -> card0 (4+6 <= 10) and card1.
    assert cards_of(place(node, {}, request)) == (("card0",), ("card0", "card1"))


def test_backtracking_failure_is_resolvable_when_idle_fits() -> None:
    node = gpu_node(2, i915=8, memory_max=10)
    usage = used(card0={"memory_max": 2}, card1={"memory_max": 6})
    request = pod(need(name="a", memory_max=4), need(name="b", memory_max=9))
    result = cards_of(place(node, usage, request))
    assert result == Rejection(
        "gpu: not enough free gpu.intel.com/memory.max on the node's cards", unresolvable=False
    )


def test_all_cards_fit_alone_but_not_together_reason() -> None:
    node = gpu_node(1, i915=2, memory_max=10)
    usage = used(card0={"memory_max": 3})
    request = pod(need(name="a", memory_max=4), need(name="b", memory_max=4))
    assert cards_of(place(node, usage, request)) == Rejection(
        "gpu: not enough free cards for every container of the pod", unresolvable=False
    )


def test_search_budget_exhaustion_rejects_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator, "SEARCH_BUDGET", 2)
    node = gpu_node(2, i915=8, memory_max=10)
    usage = used(card0={"memory_max": 1}, card1={"memory_max": 5})
    request = pod(need(name="a", memory_max=4), need(name="b", memory_max=9))
    result = cards_of(place(node, usage, request))
    assert isinstance(result, Rejection)
    assert result.unresolvable is False


# ---------------------------------------------------------------- blocked cards and order


def test_blocked_card_is_skipped() -> None:
    node = gpu_node(2, i915=8)
    assert cards_of(place(node, {}, pod(need()), blocked=frozenset({"card0"}))) == (("card1",),)


def test_all_cards_blocked_is_resolvable() -> None:
    node = gpu_node(2, i915=8)
    result = cards_of(place(node, {}, pod(need()), blocked=frozenset({"card0", "card1"})))
    assert result == Rejection(
        "gpu: cards are held by a pod with an unreadable gas-container-cards annotation",
        unresolvable=False,
    )


def test_node_blocked_is_resolvable() -> None:
    node = gpu_node(2, i915=8)
    assert cards_of(place(node, {}, pod(need()), node_blocked=True)) == Rejection(
        NODE_BLOCKED, unresolvable=False
    )
    assert "unreadable gas-container-cards annotation" in NODE_BLOCKED


def test_node_blocked_does_not_hide_unresolvable_reasons() -> None:
    node = gpu_node(2, i915=8)
    assert cards_of(place(node, {}, pod(need(3)), node_blocked=True)) == Rejection(
        "gpu: container asks for 3 cards, node has 2", unresolvable=True
    )


def test_order_overrides_numeric_order() -> None:
    node = gpu_node(3, i915=8)
    assert cards_of(place(node, {}, pod(need(2)), order=("card2", "card0", "card1"))) == (
        ("card2", "card0"),
    )


def test_usage_of_cards_not_on_node_is_ignored() -> None:
    node = gpu_node(1, i915=1)
    assert cards_of(place(node, used(card7={"i915": 5}), pod(need()))) == (("card0",),)


def test_order_naming_a_foreign_card_is_not_used() -> None:
    node = gpu_node(2, i915=1)
    result = cards_of(place(node, {}, pod(need()), order=("card5", "card0", "card1")))
    assert result == (("card0",),)


def test_order_with_repeated_card_keeps_cards_distinct() -> None:
    node = gpu_node(2, i915=2)
    result = cards_of(place(node, {}, pod(need(2)), order=("card0", "card0", "card1")))
    assert result == (("card0", "card1"),)


# ---------------------------------------------------------------- properties

RESOURCES = (I915, MEM, MILLI)


def fits(
    capacity: Mapping[str, int], usage: Mapping[str, int], per_card: Mapping[str, int]
) -> bool:
    return all(
        capacity.get(r, 0) > 0 and usage.get(r, 0) + a <= capacity.get(r, 0)
        for r, a in per_card.items()
    )


def add(
    usage: dict[str, dict[str, int]], cards: tuple[str, ...], per_card: Mapping[str, int]
) -> None:
    for card in cards:
        row = usage.setdefault(card, {})
        for r, a in per_card.items():
            row[r] = row.get(r, 0) + a


def copy_usage(usage: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {c: dict(r) for c, r in usage.items()}


def brute_force(
    node: NodeGpu, usage: Mapping[str, Mapping[str, int]], request: PodRequest
) -> Iterator[Allocation]:
    """Every valid allocation, in lexicographic (first-fit) order."""
    choices = [
        list(combinations(node.cards, n.gpus)) if n.gpus else [()] for n in request.containers
    ]
    for candidate in product(*choices):
        working = copy_usage(usage)
        ok = True
        for n, cards in zip(request.containers, candidate, strict=True):
            if not cards:
                continue
            per_card = n.per_card()
            if not all(fits(node.capacity, working.get(c, {}), per_card) for c in cards):
                ok = False
                break
            add(working, cards, per_card)
        if ok:
            yield tuple(candidate)


def greedy_first_fit(
    node: NodeGpu, usage: Mapping[str, Mapping[str, int]], request: PodRequest
) -> Allocation | None:
    """GAS's search: per container, per pick, the first fitting card not yet taken."""
    working = copy_usage(usage)
    result = []
    for n in request.containers:
        picked: list[str] = []
        per_card = n.per_card()
        for _ in range(n.gpus):
            for card in node.cards:
                if card not in picked and fits(node.capacity, working.get(card, {}), per_card):
                    picked.append(card)
                    add(working, (card,), per_card)
                    break
            else:
                return None
        result.append(tuple(picked))
    return tuple(result)


@st.composite
def scenarios(
    draw: st.DrawFn, max_cards: int, max_containers: int, max_gpus: int
) -> tuple[NodeGpu, dict[str, dict[str, int]], PodRequest]:
    n_cards = draw(st.integers(min_value=1, max_value=max_cards))
    capacity = {
        r: draw(st.integers(min_value=0, max_value=12))
        for r in RESOURCES
        if r == I915 or draw(st.booleans())
    }
    node = NodeGpu("n", tuple(f"card{i}" for i in range(n_cards)), capacity)
    usage: dict[str, dict[str, int]] = {}
    for card in node.cards:
        row = {r: draw(st.integers(min_value=0, max_value=c)) for r, c in capacity.items()}
        usage[card] = {r: v for r, v in row.items() if v}
    containers = []
    for i in range(draw(st.integers(min_value=1, max_value=max_containers))):
        gpus = draw(st.integers(min_value=0, max_value=max_gpus))
        requests = {I915: gpus} if gpus else {}
        for r in (MEM, MILLI):
            if draw(st.booleans()):
                requests[r] = draw(st.integers(min_value=0, max_value=20))
        containers.append(ContainerNeed(f"c{i}", gpus, requests))
    return node, usage, PodRequest(tuple(containers))


def assert_valid(
    node: NodeGpu,
    usage: Mapping[str, Mapping[str, int]],
    request: PodRequest,
    allocation: Allocation,
) -> None:
    assert len(allocation) == len(request.containers)
    for n, cards in zip(request.containers, allocation, strict=True):
        assert len(cards) == n.gpus
        assert len(set(cards)) == len(cards)
        assert set(cards) <= set(node.cards)
    after = copy_usage(usage)
    for card, row in allocation_usage(request, allocation).items():
        for r, a in row.items():
            after.setdefault(card, {})[r] = after.get(card, {}).get(r, 0) + a
    for card, row in after.items():
        if card not in node.cards:
            continue
        for r, a in row.items():
            assert a <= node.capacity.get(r, 0), (card, r, a)


@MODEST
@given(scenarios(max_cards=8, max_containers=3, max_gpus=4))
def test_any_allocation_is_valid(
    scenario: tuple[NodeGpu, dict[str, dict[str, int]], PodRequest],
) -> None:
    node, usage, request = scenario
    result = cards_of(place(node, usage, request))
    if isinstance(result, Rejection):
        assert result.reason.startswith("gpu: ")
    else:
        assert_valid(node, usage, request, result)


@MODEST
@given(scenarios(max_cards=4, max_containers=3, max_gpus=3))
def test_allocate_agrees_with_exhaustive_search(
    scenario: tuple[NodeGpu, dict[str, dict[str, int]], PodRequest],
) -> None:
    node, usage, request = scenario
    result = cards_of(place(node, usage, request))
    first_valid = next(brute_force(node, usage, request), None)
    if first_valid is None:
        assert isinstance(result, Rejection)
        idle_fits = next(brute_force(node, {}, request), None) is not None
        assert result.unresolvable is not idle_fits
    else:
        assert not isinstance(result, Rejection), result
        assert_valid(node, usage, request, result)
    greedy = greedy_first_fit(node, usage, request)
    if greedy is not None:
        assert result == greedy


@MODEST
@given(scenarios(max_cards=4, max_containers=3, max_gpus=3))
def test_blocked_cards_are_never_chosen(
    scenario: tuple[NodeGpu, dict[str, dict[str, int]], PodRequest],
) -> None:
    node, usage, request = scenario
    blocked = frozenset(node.cards[::2])
    result = cards_of(place(node, usage, request, blocked=blocked))
    if not isinstance(result, Rejection):
        assert all(not (set(cards) & blocked) for cards in result)
        assert_valid(node, usage, request, result)


def test_helpers_agree_on_the_worked_backtracking_case() -> None:
    node = gpu_node(2, i915=8, memory_max=10)
    usage: dict[str, Any] = used(card0={"memory_max": 1}, card1={"memory_max": 5})
    request = pod(need(name="a", memory_max=4), need(name="b", memory_max=9))
    assert greedy_first_fit(node, usage, request) is None
    assert list(brute_force(node, usage, request)) == [(("card1",), ("card0",))]
