"""Preemption: gas keeps only victims whose eviction frees cards the preemptor fits on, and
adds lower-priority bound GPU pods where the proposed victims free none that fit.

Pure victim selection (`gas.core.preemption`) on crafted nodes and exhaustively with hypothesis,
then the `POST /scheduler/preempt` route through a real gas process against the API-server
double, and kube-scheduler's preemption end to end with the emulator.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from itertools import combinations
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gas.cluster.demo import DemoCluster
from gas.cluster.leader import ElectionConfig, Elector, LeaderGatedCluster, LeaseStore
from gas.cluster.protocol import Cluster
from gas.core import preemption
from gas.core.allocator import Placement, Policy, Rejection, place
from gas.core.holdings import PodHolding, PodObservation, observe_pod
from gas.core.ledger import Ledger
from gas.core.ledger_views import NodeState, State
from gas.core.model import I915, TILES, ContainerNeed, NodeGpu, PodRequest, tiles_by_card
from gas.core.preemption import Budget, Selection, Victim, select_all, select_victims
from gas.serving.extender import create_app
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess
from tests.support.ledger_checks import ledger_of, wait_for_nodes
from tests.support.objects import MEM, container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.scheduler import SchedulerEmulator

G = 1 << 30  # memory here is counted in Gi


# ---------------------------------------------------------------- helpers


# Not the shared card_node: memory in Gi, tiles, and other NodeGpu fields.
def node(cards: int = 2, mem: int = 8, name: str = "n1", tiles: int = 0, **extra: Any) -> NodeGpu:
    """`cards` cards with 8 i915 shares and `mem` G of memory each (and `tiles` tiles)."""
    capacity = {I915: 8, MEM: mem * G}
    if tiles:
        capacity[TILES] = tiles
    return NodeGpu(name, tuple(f"card{i}" for i in range(cards)), capacity, **extra)


def hold(
    uid: str,
    *cards: str,
    mem: int = 0,
    priority: int = 0,
    tiles: dict[str, tuple[int, ...]] | None = None,
    blocked: Iterable[str] = (),
    blocks_node: bool = False,
    on: str = "n1",
) -> PodHolding:
    """A pod holding `mem` G and one i915 share on each of `cards` (one container)."""
    usage: dict[str, dict[str, int]] = {}
    for card in cards:
        usage[card] = {I915: 1, MEM: mem * G}
        if tiles and card in tiles:
            usage[card][TILES] = len(tiles[card])
    tile_allocation = (tuple((c, tiles[c]) for c in cards if c in tiles),) if tiles else ()
    return PodHolding(
        uid,
        "default",
        uid,
        on,
        (tuple(cards),) if cards else (),
        usage,
        blocked_cards=frozenset(blocked),
        blocks_node=blocks_node,
        tiles=tile_allocation,
        priority=priority,
    )


def ask(mem: int, gpus: int = 1, tiles: int = 0) -> PodRequest:
    """A one-container pod asking `gpus` cards with `mem` G on each."""
    requests = {I915: gpus, MEM: mem * G * gpus}
    if tiles:
        requests[TILES] = tiles * gpus
    return PodRequest((ContainerNeed("app", gpus, requests),))


def victims(*uids: str, priority: int | None = None) -> list[Victim]:
    return [Victim(uid, priority) for uid in uids]


def chosen(result: Selection | Rejection) -> tuple[str, ...]:
    assert isinstance(result, Selection), result
    return result.victims


def fits_without(
    gpu: NodeGpu,
    holdings: Sequence[PodHolding],
    request: PodRequest,
    gone: Iterable[str],
    own: PodHolding | None = None,
) -> bool:
    """The oracle: the ledger's own fit check with the `gone` pods deleted."""
    ledger = Ledger()
    ledger.set_node(gpu)
    for holding in holdings:
        if holding.uid not in set(gone):
            ledger.observe(PodObservation(holding.uid, "default", holding.uid, False, holding))
    if own is not None:
        ledger.reserve_placement(own.uid, "default", own.uid, request, gpu.name)
        ledger.commit(own.uid)
    result = ledger.check(request, [gpu.name], own.uid if own is not None else None)[gpu.name]
    return not isinstance(result, Rejection)


# ---------------------------------------------------------------- crafted nodes


def two_cards_six_used_each() -> list[PodHolding]:
    """card0: a 2G and b 4G; card1: c 3G and d 3G. 4G free in total, at most 2G per card."""
    return [
        hold("a", "card0", mem=2),
        hold("b", "card0", mem=4),
        hold("c", "card1", mem=3),
        hold("d", "card1", mem=3),
    ]


def test_the_node_total_view_would_evict_uselessly_gas_takes_the_one_that_helps() -> None:
    # Evicting a and c frees 5G (9G free in total: enough by node totals), yet no card then
    # has 6G. Only b leaves a card with 6G.
    holdings = two_cards_six_used_each()
    result = select_victims(node(), holdings, ask(6), victims("a", "c", "b"))
    assert isinstance(result, Selection)
    assert result.victims == ("b",)
    assert result.spared == ("a", "c")
    assert result.outcome == preemption.TRIMMED and result.minimal
    assert fits_without(node(), holdings, ask(6), ["b"])


def test_no_victim_set_helps_and_the_node_is_dropped() -> None:
    # kube-scheduler's reprieve (equal priorities, oldest kept first) keeps a, b and c and
    # proposes d: card1 then has 5G free, which does not hold 6G.
    result = select_victims(node(), two_cards_six_used_each(), ask(6), victims("d"))
    assert isinstance(result, Rejection)
    assert "even with every proposed victim evicted" in result.reason
    assert "memory.max" in result.reason
    result = select_victims(node(), two_cards_six_used_each(), ask(6), victims("a", "c"))
    assert isinstance(result, Rejection)


def test_all_proposed_victims_are_kept_when_all_are_needed() -> None:
    result = select_victims(node(), two_cards_six_used_each(), ask(7), victims("c", "d"))
    assert isinstance(result, Selection)
    assert result.victims == ("c", "d") and result.outcome == preemption.AS_PROPOSED
    assert result.spared == () and result.minimal


def test_fewest_victims_win_over_lower_priorities() -> None:
    holdings = [
        hold("big", "card0", mem=4, priority=100),
        hold("x", "card1", mem=3),
        hold("y", "card1", mem=3),
    ]
    assert chosen(select_victims(node(), holdings, ask(6), victims("x", "y", "big"))) == ("big",)


def test_among_equally_many_the_lowest_priority_wins() -> None:
    holdings = [hold("p10", "card0", mem=4, priority=10), hold("p5", "card1", mem=4, priority=5)]
    assert chosen(select_victims(node(), holdings, ask(6), victims("p10", "p5"))) == ("p5",)
    # The priority a full-form request carries wins over the ledger's.
    proposed = [Victim("p10", 1), Victim("p5", 7)]
    assert chosen(select_victims(node(), holdings, ask(6), proposed)) == ("p10",)


def test_then_the_lowest_highest_priority_then_the_lowest_sum() -> None:
    # Two victims are needed on either card. card0: 9 and 0 (highest 9); card1: 5 and 5.
    holdings = [
        hold("a9", "card0", mem=4, priority=9),
        hold("a0", "card0", mem=4, priority=0),
        hold("b5", "card1", mem=4, priority=5),
        hold("c5", "card1", mem=4, priority=5),
        hold("d4", "card2", mem=4, priority=4),
        hold("e5", "card2", mem=4, priority=5),
    ]
    proposed = victims("a9", "a0", "b5", "c5")
    assert chosen(select_victims(node(3), holdings, ask(7), proposed)) == ("b5", "c5")
    # card2: highest 5 as well, but the sum is 9 instead of 10.
    proposed = victims("a9", "a0", "b5", "c5", "d4", "e5")
    assert chosen(select_victims(node(3), holdings, ask(7), proposed)) == ("d4", "e5")


def test_then_the_least_gpu_taken_away_then_the_scheduler_order() -> None:
    holdings = [hold("big", "card0", mem=5), hold("small", "card1", mem=3)]
    assert chosen(select_victims(node(), holdings, ask(6), victims("big", "small"))) == ("small",)
    same = [hold("first", "card0", mem=3), hold("second", "card1", mem=3)]
    assert chosen(select_victims(node(), same, ask(6), victims("second", "first"))) == ("second",)


def test_a_two_card_preemptor_needs_two_freed_cards() -> None:
    # Each of four cards has one 5G pod; the pod wants two cards with 6G each.
    holdings = [
        hold("p3", "card0", mem=5, priority=3),
        hold("p1", "card1", mem=5, priority=1),
        hold("p2", "card2", mem=5, priority=2),
        hold("p0", "card3", mem=5, priority=0),
    ]
    proposed = victims("p3", "p1", "p2", "p0")
    result = select_victims(node(4), holdings, ask(6, gpus=2), proposed)
    assert chosen(result) == ("p1", "p0")  # the scheduler's order
    assert fits_without(node(4), holdings, ask(6, gpus=2), ["p1", "p0"])
    # A pod on two cards frees both at once: one victim is enough.
    holdings = [*holdings[:2], hold("wide", "card2", "card3", mem=5, priority=50)]
    result = select_victims(node(4), holdings, ask(6, gpus=2), victims("p3", "p1", "wide"))
    assert chosen(result) == ("wide",)


def test_tiles_count_by_index_and_disabled_tiles_stay_unusable() -> None:
    gpu = node(1, tiles=4)
    holdings = [
        hold("keep", "card0", mem=1, tiles={"card0": (0, 1)}),
        hold("v", "card0", mem=1, tiles={"card0": (2,)}),
    ]
    assert chosen(select_victims(gpu, holdings, ask(1, tiles=2), victims("v"))) == ("v",)
    # With tile 3 disabled by the node's labels, evicting v frees one usable tile only.
    off = node(1, tiles=4, unavailable_tiles={"card0": frozenset({3})})
    result = select_victims(off, holdings, ask(1, tiles=2), victims("v"))
    assert isinstance(result, Rejection)
    # Tiles held by index count even where the tiles count says less: "over" names tiles 2
    # and 3 but counts one, so only evicting it frees two tiles.
    over = hold("over", "card0", mem=1, tiles={"card0": (2, 3)})
    over = dataclasses.replace(over, usage={"card0": {I915: 1, MEM: G, TILES: 1}})
    holdings = [hold("keep", "card0", mem=1, tiles={"card0": (0,)}), over]
    assert not fits_without(gpu, holdings, ask(1, tiles=2), [])
    assert chosen(select_victims(gpu, holdings, ask(1, tiles=2), victims("over"))) == ("over",)


def test_blocked_cards_free_up_only_when_their_holder_goes() -> None:
    # A pod whose annotation could not be read blocks card0; card1 holds a 5G pod.
    holdings = [hold("unreadable", blocked={"card0"}), hold("b", "card1", mem=5)]
    assert chosen(select_victims(node(), holdings, ask(6), victims("unreadable"))) == (
        "unreadable",
    )
    assert chosen(select_victims(node(), holdings, ask(6), victims("b"))) == ("b",)
    # One that blocks the whole node keeps it blocked unless it is evicted too.
    holdings = [hold("whole", blocks_node=True), hold("b", "card1", mem=5)]
    assert isinstance(select_victims(node(), holdings, ask(6), victims("b")), Rejection)
    assert chosen(select_victims(node(), holdings, ask(6), victims("b", "whole"))) == ("whole",)


def test_victims_gas_cannot_judge_are_kept_as_proposed() -> None:
    # "cpu-hog" holds no card here (a pod without GPUs, as far as gas knows); the scheduler
    # may need it gone for CPU or memory.
    holdings = two_cards_six_used_each()
    result = select_victims(node(), holdings, ask(6), victims("cpu-hog", "a", "b", "c"))
    assert isinstance(result, Selection)
    assert result.victims == ("cpu-hog", "b")
    assert result.judged == ("a", "b", "c") and result.spared == ("a", "c")
    # A pod the ledger has on another node frees nothing here either.
    elsewhere = [*holdings, hold("away", "card0", mem=8, on="n2")]
    result = select_victims(node(), elsewhere, ask(6), victims("away", "b"))
    assert chosen(result) == ("away", "b")
    # Unjudged victims alone cannot make room on the cards.
    assert isinstance(select_victims(node(), holdings, ask(6), victims("cpu-hog")), Rejection)


def test_a_pod_that_fits_the_cards_already_keeps_the_whole_proposal() -> None:
    # The cards are not what stops it: the scheduler needs the victims for something else.
    holdings = [hold("a", "card0", mem=2), hold("b", "card1", mem=7)]
    result = select_victims(node(), holdings, ask(6), victims("b", "other"))
    assert isinstance(result, Selection)
    assert result.victims == ("b", "other") and result.outcome == preemption.AS_PROPOSED
    assert result.spared == ()


def test_no_proposed_victim_drops_the_node_and_duplicates_count_once() -> None:
    result = select_victims(node(), two_cards_six_used_each(), ask(6), [])
    assert isinstance(result, Rejection) and result.reason == preemption.NO_VICTIMS
    # Nothing to evict would be an empty list, which kube-scheduler takes as an error.
    assert isinstance(select_victims(node(), [], ask(1), []), Rejection)
    duplicated = victims("b", "a", "b")
    assert chosen(select_victims(node(), two_cards_six_used_each(), ask(6), duplicated)) == ("b",)


def test_the_pods_own_uncertain_bind_does_not_count_against_it() -> None:
    # Its earlier bind may have landed on card0 (6G); at most one Binding of a pod lands.
    own = hold("me", "card0", mem=6)
    holdings = [own, hold("b", "card1", mem=5)]
    result = select_victims(node(), holdings, ask(6), victims("b"), own=own)
    assert isinstance(result, Selection) and result.outcome == preemption.AS_PROPOSED
    # Counted for anyone else: then b must go.
    assert chosen(select_victims(node(), holdings, ask(6), victims("b"))) == ("b",)
    assert fits_without(node(), [holdings[1]], ask(6), [], own=own)


def test_a_node_that_cannot_host_the_pod_at_all_is_dropped() -> None:
    cpu_only = NodeGpu("n1", problem="gpu: node has no gpu.intel.com/gpu-numbers label")
    result = select_victims(cpu_only, [], ask(1), victims("x"))
    assert isinstance(result, Rejection) and result.unresolvable
    result = select_victims(node(), two_cards_six_used_each(), ask(9), victims("a", "b"))
    assert isinstance(result, Rejection) and result.unresolvable


def test_select_all_keeps_the_order_and_drops_unknown_nodes() -> None:
    states = {
        "n1": NodeState(node(), tuple(two_cards_six_used_each())),
        "n2": NodeState(node(name="n2"), (hold("z", "card0", mem=8, on="n2"),)),
    }
    proposals = {
        "ghost": victims("a"),
        "n2": victims("z"),
        "n1": victims("a", "b"),
    }
    results = select_all(ask(6), proposals, states)
    assert list(results) == ["ghost", "n2", "n1"]
    ghost = results["ghost"]
    assert isinstance(ghost, Rejection) and ghost.reason == preemption.UNKNOWN_NODE
    # n2's other card is free: the pod fits there without evicting anyone.
    assert chosen(results["n2"]) == ("z",)
    assert chosen(results["n1"]) == ("b",)


def test_ledger_node_states_copy_holdings_and_priorities() -> None:
    ledger = Ledger()
    ledger.set_node(node())
    pods = []
    for name, card, mem, priority in (("a", "card0", "2", 7), ("b", "card1", "3", 0)):
        pod = gpu_pod(
            name,
            container(i915="1", memory_max=str(int(mem) * G)),
            node="n1",
            annotations={"gas-container-cards": card},
            phase="Running",
        )
        pod["metadata"]["uid"] = f"uid-{name}"
        pod["spec"]["priority"] = priority
        pods.append(pod)
    for pod in pods:
        observation = observe_pod(pod)
        assert observation is not None
        ledger.observe(observation)
    mine = ledger.reserve_placement("uid-me", "default", "me", ask(1), "n1")
    assert not isinstance(mine, Rejection)
    ledger.commit("uid-me")  # uncertain: PENDING
    states = ledger.node_states(["n1", "ghost"], "uid-me")
    assert list(states) == ["n1"]
    state = states["n1"]
    assert state.node == node()
    assert {h.uid: h.priority for h in state.holdings} == {"uid-a": 7, "uid-b": 0, "uid-me": 0}
    assert state.own is not None and state.own.uid == "uid-me"
    assert ledger.node_states(["n1"])["n1"].own is None
    # The entry state of each holding, in the same order.
    entries = dict(zip((h.uid for h in state.holdings), state.states, strict=True))
    assert entries == {"uid-a": State.BOUND, "uid-b": State.BOUND, "uid-me": State.PENDING}
    # A new bind of the pod reserves while its uncertain earlier one stays counted.
    retry = ledger.reserve_placement("uid-me", "default", "me", ask(1), "n1")
    assert not isinstance(retry, Rejection)
    again = ledger.node_states(["n1"])["n1"]
    pairs = [(h.uid, s) for h, s in zip(again.holdings, again.states, strict=True)]
    assert sorted(pairs, key=lambda p: (p[0], p[1].value)) == [
        ("uid-a", State.BOUND),
        ("uid-b", State.BOUND),
        ("uid-me", State.PENDING),
        ("uid-me", State.RESERVED),
    ]
    # A copy: later changes to the ledger do not show in it.
    ledger.forget("uid-a")
    assert len(state.holdings) == 3 and len(state.states) == 3


# ---------------------------------------------------------------- victims gas adds


def cards_of_the_scheduler_blind_spot() -> list[PodHolding]:
    """Two 8G cards: A 5G on card0 and B 5G on card1 (priority 1), C 2G on card0
    (priority 0). 4G free in all, at most 3G on a card."""
    return [
        hold("A", "card0", mem=5, priority=1),
        hold("B", "card1", mem=5, priority=1),
        hold("C", "card0", mem=2, priority=0),
    ]


ALL_BOUND = frozenset({"A", "B", "C"})


def test_a_useless_proposal_is_extended_with_the_pod_that_frees_a_card() -> None:
    # By node totals evicting C leaves 6G free for a 6G pod, but 5G and 3G per card.
    holdings = cards_of_the_scheduler_blind_spot()
    assert not fits_without(node(), holdings, ask(6), ["C"])
    result = select_victims(node(), holdings, ask(6), victims("C"), priority=10, bound=ALL_BOUND)
    assert isinstance(result, Selection)
    # One pod is fewer than two: C is spared, A (B's equal, first by UID) is added.
    assert result.victims == ("A",) and result.added == ("A",)
    assert result.judged == ("C",) and result.spared == ("C",)
    assert result.outcome == preemption.EXTENDED and result.minimal
    assert fits_without(node(), holdings, ask(6), ["A"])
    # Victims gas cannot judge stay, in the scheduler's order, before the added ones.
    result = select_victims(
        node(), holdings, ask(6), victims("cpu-hog", "C"), priority=10, bound=ALL_BOUND
    )
    assert chosen(result) == ("cpu-hog", "A")
    # Without the preemptor's priority, or with nothing known BOUND, nothing is added.
    for options in ({}, {"priority": 10}, {"bound": ALL_BOUND}):
        result = select_victims(node(), holdings, ask(6), victims("C"), **options)
        assert isinstance(result, Rejection), options
        assert result.reason.endswith("(even with every proposed victim evicted)")


def test_among_the_pods_gas_may_add_the_lowest_priority_one_wins() -> None:
    holdings = cards_of_the_scheduler_blind_spot()
    holdings[0] = dataclasses.replace(holdings[0], priority=3)
    result = select_victims(node(), holdings, ask(6), victims("C"), priority=10, bound=ALL_BOUND)
    assert chosen(result) == ("B",)


def test_only_pods_below_the_preemptor_are_added() -> None:
    holdings = cards_of_the_scheduler_blind_spot()
    holdings[0] = dataclasses.replace(holdings[0], priority=0)
    holdings[1] = dataclasses.replace(holdings[1], priority=9)
    # B is of lower priority than the preemptor (9 < 10), A of the same: never A.
    holdings[0] = dataclasses.replace(holdings[0], priority=10)
    result = select_victims(node(), holdings, ask(6), victims("C"), priority=10, bound=ALL_BOUND)
    assert chosen(result) == ("B",)
    # Both at the preemptor's priority: nothing may be added, and the node is dropped.
    holdings[1] = dataclasses.replace(holdings[1], priority=10)
    result = select_victims(node(), holdings, ask(6), victims("C"), priority=10, bound=ALL_BOUND)
    assert isinstance(result, Rejection)
    # Both above it neither.
    result = select_victims(node(), holdings, ask(6), victims("C"), priority=5, bound=ALL_BOUND)
    assert isinstance(result, Rejection)


def test_a_pod_without_priority_may_add_only_negative_priority_pods() -> None:
    # The route counts a preemptor without spec.priority as 0, as kube-scheduler does.
    holdings = cards_of_the_scheduler_blind_spot()
    for index in (0, 1):
        holdings[index] = dataclasses.replace(holdings[index], priority=0)
    result = select_victims(node(), holdings, ask(6), victims("C"), priority=0, bound=ALL_BOUND)
    assert isinstance(result, Rejection)
    holdings[1] = dataclasses.replace(holdings[1], priority=-1)
    result = select_victims(node(), holdings, ask(6), victims("C"), priority=0, bound=ALL_BOUND)
    assert chosen(result) == ("B",)


def test_reserved_and_pending_holdings_are_never_added() -> None:
    # A and B are binds in flight: kube-scheduler's cache may not have them on the node,
    # and a UID it does not have there fails its whole call.
    holdings = cards_of_the_scheduler_blind_spot()
    for a_state, b_state in (
        (State.RESERVED, State.PENDING),
        (State.PENDING, State.RESERVED),
        (State.PENDING, State.PENDING),
    ):
        state = NodeState(node(), tuple(holdings), None, (a_state, b_state, State.BOUND))
        result = select_all(ask(6), {"n1": victims("C")}, {"n1": state}, priority=10)["n1"]
        assert isinstance(result, Rejection), (a_state, b_state)
    # Once the watch shows B bound, it may be added.
    state = NodeState(node(), tuple(holdings), None, (State.PENDING, State.BOUND, State.BOUND))
    result = select_all(ask(6), {"n1": victims("C")}, {"n1": state}, priority=10)["n1"]
    assert isinstance(result, Selection) and result.added == ("B",)
    # A state that says nothing about the entries (no `states`) adds nothing.
    state = NodeState(node(), tuple(holdings))
    result = select_all(ask(6), {"n1": victims("C")}, {"n1": state}, priority=10)["n1"]
    assert isinstance(result, Rejection)


def test_the_pods_own_earlier_bind_is_never_added() -> None:
    # "me" is the preemptor's own uncertain earlier bind, which blocks card1 (its annotation
    # could not be read); only evicting it would free a card. A is above the pod.
    holdings = cards_of_the_scheduler_blind_spot()
    holdings[0] = dataclasses.replace(holdings[0], priority=20)
    own = hold("me", blocked={"card1"})
    holdings[1] = own
    bound = {*ALL_BOUND, "me"}
    result = select_victims(
        node(), holdings, ask(6), victims("C"), own=own, priority=10, bound=bound
    )
    assert isinstance(result, Rejection)


def test_a_proposal_that_helps_is_never_extended() -> None:
    # card0: three proposed 1G pods and a 3G pod gas could add; card1 is full. Evicting the
    # 3G pod alone would do with one victim, yet the scheduler's three do as well.
    holdings = [
        hold("v1", "card0", mem=1),
        hold("v2", "card0", mem=1),
        hold("v3", "card0", mem=1),
        hold("big", "card0", mem=3),
        hold("full", "card1", mem=8),
    ]
    bound = {h.uid for h in holdings}
    result = select_victims(
        node(), holdings, ask(5), victims("v1", "v2", "v3"), priority=10, bound=bound
    )
    assert isinstance(result, Selection)
    assert result.victims == ("v1", "v2", "v3") and result.added == ()
    assert result.outcome == preemption.AS_PROPOSED


def test_proposed_victims_win_ties_against_added_ones() -> None:
    # Two victims are needed on either card; card0: proposed p and added x, card1: added y
    # and z, all of the same priority and size. One added pod beats two.
    holdings = [
        hold("p", "card0", mem=4),
        hold("x", "card0", mem=4),
        hold("y", "card1", mem=4),
        hold("z", "card1", mem=4),
        hold("q", "card2", mem=8, priority=20),
    ]
    bound = {h.uid for h in holdings}
    result = select_victims(node(3), holdings, ask(7), victims("p"), priority=10, bound=bound)
    assert isinstance(result, Selection)
    assert result.victims == ("p", "x") and result.added == ("x",)
    # Priorities still come first: with p above the added pods, y and z win.
    holdings[0] = dataclasses.replace(holdings[0], priority=1)
    result = select_victims(node(3), holdings, ask(7), victims("p"), priority=10, bound=bound)
    assert isinstance(result, Selection)
    assert result.victims == ("y", "z") and result.spared == ("p",)


def test_a_node_no_addable_pod_helps_is_dropped_with_its_reason() -> None:
    # An 8G pod needs a whole card. card0 keeps A (above the pod), card1 keeps D (likewise)
    # even with B, which gas may add, gone.
    holdings = [*cards_of_the_scheduler_blind_spot(), hold("D", "card1", mem=1, priority=20)]
    holdings[0] = dataclasses.replace(holdings[0], priority=20)
    bound = {*ALL_BOUND, "D"}
    result = select_victims(node(), holdings, ask(8), victims("C"), priority=10, bound=bound)
    assert isinstance(result, Rejection) and not result.unresolvable
    assert result.reason.endswith(preemption.EVEN_EXTENDED)


def test_many_addable_pods_are_searched_greedily_and_still_fit() -> None:
    # 24 1G pods on four 8G cards, 6 on each; the scheduler proposed one. 6G on a card
    # needs four victims on it.
    holdings = [hold(f"v{i:02}", f"card{i % 4}", mem=1, priority=i % 5) for i in range(24)]
    bound = {h.uid for h in holdings}
    result = select_victims(node(4), holdings, ask(6), victims("v01"), priority=9, bound=bound)
    assert isinstance(result, Selection)
    assert result.outcome == preemption.EXTENDED and not result.minimal
    assert fits_without(node(4), holdings, ask(6), result.victims)
    for uid in result.victims:
        rest = [u for u in result.victims if u != uid]
        assert not fits_without(node(4), holdings, ask(6), rest)
    assert len(result.victims) == 4


# ---------------------------------------------------------------- the search bounds


def test_many_victims_are_trimmed_greedily_and_still_fit() -> None:
    # 24 1G pods on four 8G cards, 6 on each: the pod wants 6G on one card.
    holdings = [hold(f"v{i:02}", f"card{i % 4}", mem=1, priority=i % 5) for i in range(24)]
    proposed = victims(*(h.uid for h in holdings))
    result = select_victims(node(4), holdings, ask(6), proposed)
    assert isinstance(result, Selection)
    assert not result.minimal  # more than EXHAUSTIVE_VICTIMS: greedy
    assert fits_without(node(4), holdings, ask(6), result.victims)
    # Irreducible: sparing any one of them leaves no room.
    for uid in result.victims:
        rest = [u for u in result.victims if u != uid]
        assert not fits_without(node(4), holdings, ask(6), rest)
    assert len(result.victims) == 4  # 2G free on a card, 4 more needed


def card_of_small_pods(name: str = "n1") -> tuple[list[PodHolding], list[Victim]]:
    """Four cards, each with three 1G pods (proposed) and one 3G pod: 2G free on each,
    8G in all, so the node-total bound prunes nothing for a 5G pod."""
    holdings = [hold(f"{name}-v{i}", f"card{i % 4}", mem=1, on=name) for i in range(12)]
    holdings += [hold(f"{name}-w{i}", f"card{i}", mem=3, on=name) for i in range(4)]
    return holdings, victims(*(h.uid for h in holdings[:12]))


def test_a_small_budget_still_answers_a_set_that_fits() -> None:
    holdings, proposed = card_of_small_pods()
    budget = Budget(20)
    result = select_victims(node(4), holdings, ask(5), proposed, budget=budget)
    assert isinstance(result, Selection) and not result.minimal
    assert fits_without(node(4), holdings, ask(5), result.victims)
    assert budget.left == 0
    # With the default budget the search is exhaustive: the three 1G pods of one card.
    result = select_victims(node(4), holdings, ask(5), proposed)
    assert isinstance(result, Selection) and result.minimal
    assert result.victims == ("n1-v0", "n1-v4", "n1-v8")


def test_a_request_budget_is_shared_fairly_between_nodes() -> None:
    states = {}
    proposals = {}
    for n in range(5):
        name = f"n{n}"
        held, proposals[name] = card_of_small_pods(name)
        states[name] = NodeState(node(4, name=name), tuple(held))
    budget = Budget(200)
    results = select_all(ask(5), proposals, states, budget=budget)
    assert 0 <= budget.left < 200
    for name, result in results.items():
        assert isinstance(result, Selection), name
        assert fits_without(states[name].node, states[name].holdings, ask(5), result.victims)
    # Enough for all: every node's answer is the smallest.
    results = select_all(ask(5), proposals, states)
    assert all(isinstance(r, Selection) and r.minimal for r in results.values())


# ---------------------------------------------------------------- exhaustively


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[NodeGpu, list[PodHolding], PodRequest, list[Victim]]:
    cards = draw(st.integers(1, 4))
    mem = draw(st.integers(2, 8))
    tiles = draw(st.sampled_from([0, 0, 4]))
    gpu = node(cards, mem=mem, tiles=tiles)
    names = [f"card{i}" for i in range(cards)]
    holdings = []
    for index in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(["pod", "pod", "pod", "pod", "blocked", "elsewhere"]))
        uid = f"p{index}"
        priority = draw(st.integers(0, 3))
        if kind == "blocked":
            holdings.append(hold(uid, blocked=[draw(st.sampled_from(names))], priority=priority))
            continue
        wide = draw(st.integers(1, cards))
        on = draw(st.permutations(names))[:wide]
        held_tiles = None
        if tiles:
            held_tiles = {
                c: tuple(sorted(draw(st.sets(st.integers(0, 3), max_size=2)))) for c in on
            }
        holdings.append(
            hold(
                uid,
                *on,
                mem=draw(st.integers(1, mem)),
                priority=priority,
                tiles=held_tiles,
                on="n2" if kind == "elsewhere" else "n1",
            )
        )
    request = ask(draw(st.integers(1, mem)), gpus=draw(st.integers(1, cards)), tiles=0)
    if tiles and draw(st.booleans()):
        request = ask(draw(st.integers(1, mem)), gpus=1, tiles=draw(st.integers(1, 3)))
    pool = [h.uid for h in holdings] + ["stranger"]
    picked = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True))
    full_form = draw(st.booleans())
    proposed = [Victim(uid, draw(st.integers(0, 3)) if full_form else None) for uid in picked]
    return gpu, holdings, request, proposed


Scenario = tuple[NodeGpu, list[PodHolding], PodRequest, list[Victim], int, tuple[State, ...]]


@st.composite
def preemptions(draw: st.DrawFn) -> Scenario:
    """A scenario with the preemptor's priority and the entry state of each holding."""
    gpu, holdings, request, proposed = draw(scenarios())
    if draw(st.booleans()):
        # Short proposals are where the scheduler's totals miss the cards most often.
        proposed = proposed[:1]
    priority = draw(st.integers(-1, 4))
    kinds = st.sampled_from([State.BOUND, State.BOUND, State.PENDING, State.RESERVED])
    states = tuple(draw(kinds) for _ in holdings)
    return gpu, holdings, request, proposed, priority, states


def _rank(
    subset: Iterable[str], holdings: Sequence[PodHolding], proposed: Sequence[Victim]
) -> tuple[int, int, int]:
    """The ordering's priority part: highest, sum, then how many were not proposed."""
    given = {v.uid: v.priority for v in proposed}
    ledger = {h.uid: h.priority for h in holdings}
    priorities = []
    added = 0
    for u in subset:
        sent = given.get(u)
        priorities.append(sent if sent is not None else ledger.get(u, 0))
        added += u not in given
    return (max(priorities), sum(priorities), added)


@settings(max_examples=400, deadline=None)
@given(preemptions())
def test_any_answer_fits_and_no_smaller_set_of_candidates_does(scenario: Scenario) -> None:
    gpu, holdings, request, proposed, priority, states = scenario
    state = NodeState(gpu, tuple(holdings), None, states)
    result = select_all(request, {gpu.name: proposed}, {gpu.name: state}, priority=priority)[
        gpu.name
    ]
    uids = [v.uid for v in proposed]
    here = {h.uid for h in holdings if h.node == gpu.name}
    judged = [u for u in uids if u in here]
    unjudged = [u for u in uids if u not in here]
    bound = {h.uid for h, s in zip(holdings, states, strict=True) if s is State.BOUND}
    # What gas may add: BOUND holdings on this node, not proposed, below the preemptor.
    addable = [
        h.uid
        for h in holdings
        if h.node == gpu.name and h.uid in bound and h.uid not in uids and h.priority < priority
    ]
    fits_now = fits_without(gpu, holdings, request, [])
    if not uids:
        assert isinstance(result, Rejection)
        return
    if fits_now:
        assert isinstance(result, Selection) and result.victims == tuple(uids)
        assert result.added == ()
        return
    if fits_without(gpu, holdings, request, judged):
        candidates = judged  # a proposal that helps is never extended
    elif fits_without(gpu, holdings, request, judged + addable):
        candidates = judged + addable
    else:
        assert isinstance(result, Rejection)
        return
    assert isinstance(result, Selection)
    assert result.minimal
    kept = [u for u in result.victims if u in candidates]
    # Only proposed UIDs and addable ones; the proposed in the scheduler's order, every
    # unjudged one kept, then the added ones; never empty.
    assert set(result.victims) <= set(uids) | set(addable)
    assert set(result.added) == set(kept) - set(judged)
    assert list(result.victims) == [u for u in uids if u in kept or u in unjudged] + list(
        result.added
    )
    assert (result.outcome == preemption.EXTENDED) == bool(result.added)
    assert kept and set(result.spared) == set(judged) - set(kept)
    assert fits_without(gpu, holdings, request, kept)
    for size in range(len(kept)):
        for subset in combinations(candidates, size):
            assert not fits_without(gpu, holdings, request, subset), subset
    # Nothing of the same size that fits ranks better by priority, then by fewer added.
    best = _rank(kept, holdings, proposed)
    for subset in combinations(candidates, len(kept)):
        if fits_without(gpu, holdings, request, subset):
            assert _rank(subset, holdings, proposed) >= best, subset


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_the_node_total_bound_never_skips_a_set_that_fits(
    scenario: tuple[NodeGpu, list[PodHolding], PodRequest, list[Victim]],
) -> None:
    gpu, holdings, request, proposed = scenario
    judged = [v for v in proposed if v.uid in {h.uid for h in holdings if h.node == "n1"}]
    picked = {v.uid for v in proposed}
    extra = [Victim(h.uid, h.priority) for h in holdings if h.node == "n1" and h.uid not in picked]
    room = preemption._Room(gpu, tuple(holdings), request, Policy(), None, judged, extra)
    candidates = [*judged, *extra]
    for size in range(len(candidates) + 1):
        for subset in combinations(range(len(candidates)), size):
            evicted = frozenset(subset)
            if isinstance(room.fit(evicted), Placement):
                assert room.frees_enough(evicted)
            gone = {candidates[i].uid for i in subset}
            usage: dict[str, dict[str, int]] = {}
            tiles_used: dict[str, set[int]] = {}
            blocked: set[str] = set()
            for h in holdings:
                if h.node != "n1" or h.uid in gone:
                    continue
                blocked |= h.blocked_cards
                for card, resources in h.usage.items():
                    for res, amount in resources.items():
                        usage.setdefault(card, {})[res] = usage.get(card, {}).get(res, 0) + amount
                for card, indices in tiles_by_card(h.tiles).items():
                    tiles_used.setdefault(card, set()).update(indices)
            direct = place(
                gpu,
                usage,
                request,
                blocked=frozenset(blocked),
                tiles_used={c: frozenset(t) for c, t in tiles_used.items()},
            )
            assert isinstance(direct, Placement) == isinstance(room.fit(evicted), Placement)


# ---------------------------------------------------------------- through a real gas process


def crowd(apiserver: ApiServerDouble, node_name: str, *pods: tuple[str, str, int, int]) -> None:
    """A node with two 8G cards and bound GPU pods: (name, card, G, priority)."""
    apiserver.add_node(gpu_node(node_name, "0.1", i915="8", memory_max=str(16 * G)))
    for name, card, mem, priority in pods:
        pod = gpu_pod(
            name,
            container(i915="1", memory_max=str(mem * G)),
            node=node_name,
            annotations={"gas-container-cards": card, "gas-ts": "1"},
            phase="Running",
        )
        pod["spec"]["priority"] = priority
        apiserver.add_pod(pod)


SIX_USED_EACH = (("a", "card0", 2, 0), ("b", "card0", 4, 0), ("c", "card1", 3, 0))


def uid(apiserver: ApiServerDouble, name: str) -> str:
    found = apiserver.get_pod("default", name)
    assert found is not None
    value: str = found["metadata"]["uid"]
    return value


def preemptor(
    apiserver: ApiServerDouble,
    name: str = "urgent",
    mem: int = 6,
    priority: int | None = 100,
) -> dict[str, Any]:
    pod = gpu_pod(name, container(i915="1", memory_max=str(mem * G)))
    if priority is not None:
        pod["spec"]["priority"] = priority
    return apiserver.add_pod(pod)


def meta(*uids: str, pdbs: int = 0) -> dict[str, Any]:
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdbs}


def wait_for_pods(gas: GasProcess, count: int) -> None:
    wait_for(lambda: len(ledger_of(gas)["pods"]) == count, what=f"{count} pods in the ledger")


def decisions(gas: GasProcess, verb: str) -> list[dict[str, Any]]:
    found = []
    for line in gas.log().splitlines():
        if "gas.decisions" in line and f'"decision":"{verb}"' in line:
            found.append(json.loads(line[line.index("{") :]))
    return found


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_preempt_keeps_the_victim_that_frees_a_card_and_drops_useless_nodes(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    crowd(apiserver, "node-a", *SIX_USED_EACH, ("d", "card1", 3, 0))
    # e and g are of the preemptor's priority: gas may not add them.
    crowd(apiserver, "node-b", ("e", "card0", 5, 100), ("f", "card1", 3, 0), ("g", "card1", 3, 100))
    crowd(apiserver, "node-c")
    apiserver.add_pod(gpu_pod("cpu-hog", node="node-a", phase="Running"))
    wait_for_nodes(gas, "node-a", "node-b", "node-c")
    wait_for_pods(gas, 7)
    pod = preemptor(apiserver)
    a, b, c, e, f = (uid(apiserver, n) for n in "abcef")
    hog = uid(apiserver, "cpu-hog")
    body = {
        "Pod": pod,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            # By node totals a and c would do (9G free); only b leaves a card with 6G.
            "node-a": meta(a, hog, c, b, pdbs=3),
            # f alone leaves card1 with 5G: no help, and nothing else may go.
            "node-b": meta(f),
            "ghost": meta(e),
            "node-c": None,
        },
    }
    response = gas.post("/scheduler/preempt", body)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    pods = f'[{{"UID":"{hog}"}},{{"UID":"{b}"}}]'
    assert response.text == (
        f'{{"NodeNameToMetaVictims":{{"node-a":{{"Pods":{pods},"NumPDBViolations":2}}}}}}'
    )
    # Preempt reserves nothing and evicts nothing.
    assert len(ledger_of(gas)["pods"]) == 7
    records = wait_for(lambda: decisions(gas, "preempt"), what="a preempt decision")
    assert records[-1] == {
        "decision": "preempt",
        "pod": "default/urgent",
        "uid": pod["metadata"]["uid"],
        "nodes": 4,
        "kept": 1,
        "victims": {"node-a": [hog, b]},
        "spared": {"node-a": [a, c]},
        "added": {},
        "dropped": {
            "gpu: no victim proposed on this node": 1,
            "gpu: node is not known to gas": 1,
            "gpu: not enough free gpu.intel.com/memory.max on the node's cards "
            "(even with every proposed victim evicted)": 1,
        },
    }
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_requests_total", verb="preempt", outcome="fit") == 1
    assert metric(text, "gas_preempt_nodes_total", verdict="trimmed") == 1
    assert metric(text, "gas_preempt_nodes_total", verdict="dropped") == 3
    # No candidate left: an empty map, which kube-scheduler reads as "no node to nominate".
    body["NodeNameToMetaVictims"] = {"node-b": meta(f)}
    reply = gas.post("/scheduler/preempt", body)
    assert reply.status_code == 200 and reply.json() == {"NodeNameToMetaVictims": {}}


def test_preempt_full_form_reads_priorities_from_the_pods(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    crowd(apiserver, "node-c", ("x", "card0", 5, 3), ("y", "card1", 5, 1))
    wait_for_nodes(gas, "node-c")
    wait_for_pods(gas, 2)
    pod = preemptor(apiserver)
    x, y = (uid(apiserver, n) for n in "xy")
    # Meta form: the ledger knows the priorities (spec.priority of the bound pods).
    reply = gas.post(
        "/scheduler/preempt", {"Pod": pod, "NodeNameToMetaVictims": {"node-c": meta(x, y)}}
    ).json()
    assert reply == {"NodeNameToMetaVictims": {"node-c": meta(y)}}
    # Full form, keys in any case: the pods sent are what counts.
    victims_sent = []
    for name in ("x", "y"):
        found = apiserver.get_pod("default", name)
        assert found is not None
        found["spec"]["priority"] = {"x": 0, "y": 2}[name]
        victims_sent.append(found)
    body = {
        "pod": pod,
        "nodeNameToVictims": {"node-c": {"pods": victims_sent, "numPDBViolations": 0}},
        "NodeNameToMetaVictims": None,
    }
    reply = gas.post("/scheduler/preempt", body).json()
    assert reply == {"NodeNameToMetaVictims": {"node-c": meta(x)}}
    # A pod whose GPU asks cannot be read fits nowhere.
    bad = gpu_pod("bad", container(i915="1", memory_max="1.5"))
    reply = gas.post(
        "/scheduler/preempt", {"Pod": bad, "NodeNameToVictims": body["nodeNameToVictims"]}
    )
    assert reply.status_code == 200 and reply.json() == {"NodeNameToMetaVictims": {}}


def test_preempt_adds_a_lower_priority_pod_where_the_proposal_frees_no_card(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    # 4G free by node totals, 3G at most on a card: by totals evicting C makes room for a
    # 6G pod, yet only evicting A or B frees a card.
    crowd(apiserver, "node-x", ("A", "card0", 5, 1), ("B", "card1", 5, 2), ("C", "card0", 2, 0))
    apiserver.add_pod(gpu_pod("cpu-hog", node="node-x", phase="Running"))
    wait_for_nodes(gas, "node-x")
    wait_for_pods(gas, 3)
    pod = preemptor(apiserver, priority=10)
    a, c, hog = uid(apiserver, "A"), uid(apiserver, "C"), uid(apiserver, "cpu-hog")
    body = {"Pod": pod, "NodeNameToMetaVictims": {"node-x": meta(c, pdbs=1)}}
    response = gas.post("/scheduler/preempt", body)
    assert response.status_code == 200, response.text
    # A, the lowest-priority pod that frees a card, instead of C. The scheduler's count
    # was for C, which is spared; gas cannot count A's.
    assert response.text == (
        f'{{"NodeNameToMetaVictims":{{"node-x":{{"Pods":[{{"UID":"{a}"}}],"NumPDBViolations":0}}}}}}'
    )
    records = wait_for(lambda: decisions(gas, "preempt"), what="a preempt decision")
    assert records[-1] == {
        "decision": "preempt",
        "pod": "default/urgent",
        "uid": pod["metadata"]["uid"],
        "nodes": 1,
        "kept": 1,
        "victims": {"node-x": [a]},
        "spared": {"node-x": [c]},
        "added": {"node-x": [a]},
        "dropped": {},
    }
    # A victim gas cannot judge stays, with the scheduler's count for it.
    body["NodeNameToMetaVictims"] = {"node-x": meta(hog, c, pdbs=1)}
    reply = gas.post("/scheduler/preempt", body).json()
    assert reply == {"NodeNameToMetaVictims": {"node-x": meta(hog, a, pdbs=1)}}
    # Full form: the added pod's priority comes from the ledger all the same.
    sent = apiserver.get_pod("default", "C")
    full = {"Pod": pod, "NodeNameToVictims": {"node-x": {"Pods": [sent], "NumPDBViolations": 0}}}
    reply = gas.post("/scheduler/preempt", full).json()
    assert reply == {"NodeNameToMetaVictims": {"node-x": meta(a)}}
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_preempt_nodes_total", verdict="extended") == 3
    # Only pods strictly below the preemptor: at A's priority, or without one (0), none is
    # and the node is dropped.
    for name, priority in (("level", 1), ("plain", None)):
        other = preemptor(apiserver, name, priority=priority)
        body = {"Pod": other, "NodeNameToMetaVictims": {"node-x": meta(c)}}
        reply = gas.post("/scheduler/preempt", body).json()
        assert reply == {"NodeNameToMetaVictims": {}}, name
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_preempt_nodes_total", verdict="dropped") == 2


def test_preempt_never_adds_a_pod_whose_bind_is_in_flight(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    # B is above the preemptor; A's bind has an unknown outcome, so the ledger holds it as
    # PENDING on card0, where kube-scheduler's cache may not have it.
    crowd(apiserver, "node-x", ("B", "card1", 5, 20), ("C", "card0", 2, 0))
    wait_for_nodes(gas, "node-x")
    wait_for_pods(gas, 2)
    pending = gpu_pod("A", container(i915="1", memory_max=str(5 * G)))
    pending["spec"]["priority"] = 1
    pending = apiserver.add_pod(pending)
    apiserver.faults.add("POST", r"/pods/A/binding$", ("status", 500))
    assert "outcome unknown" in gas.bind(pending, "node-x")
    entry = ledger_of(gas)["pods"][pending["metadata"]["uid"]]
    assert (entry["state"], entry["cards"]) == ("pending", [["card0"]])
    pod = preemptor(apiserver, priority=10)
    body = {"Pod": pod, "NodeNameToMetaVictims": {"node-x": meta(uid(apiserver, "C"))}}
    reply = gas.post("/scheduler/preempt", body).json()
    assert reply == {"NodeNameToMetaVictims": {}}
    records = wait_for(lambda: decisions(gas, "preempt"), what="a preempt decision")
    assert records[-1]["added"] == {}
    assert list(records[-1]["dropped"]) == [
        "gpu: not enough free gpu.intel.com/memory.max on the node's cards "
        "(even with every proposed victim evicted)"
    ]


def test_malformed_preempt_requests_get_400_with_a_reason(gas: GasProcess) -> None:
    pod = gpu_pod("p", container(i915="1"))
    bodies: list[tuple[Any, str]] = [
        ({"Pod": "x", "NodeNameToMetaVictims": {}}, "Pod must be a Pod object"),
        ({"Pod": pod}, "neither"),
        ({"Pod": pod, "NodeNameToMetaVictims": None, "NodeNameToVictims": None}, "neither"),
        ({"Pod": pod, "NodeNameToMetaVictims": []}, "must be an object of nodes"),
        ({"Pod": pod, "NodeNameToMetaVictims": {"n": 7}}, "must be an object with Pods"),
        ({"Pod": pod, "NodeNameToMetaVictims": {"n": {"Pods": {}}}}, "Pods must be a list"),
        ({"Pod": pod, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 5}]}}}, "UID"),
        ({"Pod": pod, "NodeNameToMetaVictims": {"n": {"Pods": ["u"]}}}, "UID"),
        (
            {"Pod": pod, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": "1"}}},
            "NumPDBViolations must be an integer",
        ),
        (
            {"Pod": pod, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": True}}},
            "NumPDBViolations must be an integer",
        ),
        ({"Pod": pod, "NodeNameToVictims": {"n": {"Pods": [{"metadata": {}}]}}}, "metadata.uid"),
        ([], "must be a JSON object"),
    ]
    for body, words in bodies:
        response = gas.post("/scheduler/preempt", body)
        assert response.status_code == 400, (body, response.text)
        assert response.headers["Content-Type"] == "application/json"
        error = response.json()["Error"]
        assert error.startswith("bad request: ") and words in error, (body, error)
    response = gas.session.post(
        gas.url + "/scheduler/preempt",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
        timeout=5,
    )
    assert response.status_code == 400 and "not valid JSON" in response.json()["Error"]
    assert gas.session.get(gas.url + "/scheduler/preempt", timeout=5).status_code == 405
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_requests_total", verb="preempt", outcome="bad_request") == 13


class _NoLeaseStore:
    """Never asked: the elector below is not started, so this replica never leads."""


def test_preempt_answers_503_until_synced_and_on_followers() -> None:
    ledger = Ledger()
    demo = DemoCluster(ledger, {"nodes": [gpu_node("n1", "0.1", i915="2", memory_max="16Gi")]})
    body = {"Pod": gpu_pod("p", container(i915="1")), "NodeNameToMetaVictims": {"n1": meta("u")}}
    client = create_app(ledger, demo).test_client()
    response = client.post("/scheduler/preempt", json=body)
    assert response.status_code == 503 and "not synced" in response.get_json()["Error"]
    demo.start()
    assert client.post("/scheduler/preempt", json=body).status_code == 200
    elector = Elector(cast(LeaseStore, _NoLeaseStore()), ElectionConfig(identity="follower"))
    gated = LeaderGatedCluster(demo, elector)
    follower = create_app(ledger, cast(Cluster, gated)).test_client()
    response = follower.post("/scheduler/preempt", json=body)
    # Synced but not leading: the answer says which, not that gas is unsynced.
    error = response.get_json()["Error"]
    assert response.status_code == 503 and "not synced" not in error
    assert "does not answer the scheduler now" in error and "not acquired the Lease" in error
    # Malformed input is still a 400, as on the other routes.
    assert follower.post("/scheduler/preempt", json={"Pod": 1}).status_code == 400


@functools.cache
def _fuzz_client() -> Any:
    """In-process gas on two crowded nodes (pods u0..u5, priorities 0..2), made once: the
    route changes nothing, so examples cannot affect each other."""
    nodes = [gpu_node(n, "0.1", i915="8", memory_max=str(16 * G)) for n in ("n1", "n2")]
    pods = []
    for index in range(6):
        pod = gpu_pod(
            f"p{index}",
            container(i915="1", memory_max=str((2 + index % 3) * G)),
            node=f"n{1 + index % 2}",
            annotations={"gas-container-cards": f"card{index // 2 % 2}"},
            phase="Running",
        )
        pod["metadata"]["uid"] = f"u{index}"
        pod["spec"]["priority"] = index % 3
        pods.append(pod)
    ledger = Ledger()
    demo = DemoCluster(ledger, {"nodes": nodes, "pods": pods})
    demo.start()
    return create_app(ledger, demo).test_client()


JUNK = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.none(), max_size=1))
UIDS = st.sampled_from(["u0", "u1", "u2", "u3", "u4", "u5", "stranger"])


@st.composite
def preempt_bodies(draw: st.DrawFn) -> dict[str, Any]:
    full = draw(st.booleans())
    nodes: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(["n1", "n2", "ghost", ""]), unique=True)):
        uids = draw(st.lists(UIDS, max_size=5))
        if full:
            pods: Any = [
                {"metadata": {"uid": u}, "spec": {"priority": draw(st.integers(0, 3))}}
                for u in uids
            ]
        else:
            pods = [{draw(st.sampled_from(["UID", "uid"])): u} for u in uids]
        if draw(st.integers(0, 9)) == 0 and pods:
            pods[0] = draw(JUNK)
        entry: Any = {"Pods": pods, "NumPDBViolations": draw(st.integers(-1, 3))}
        if draw(st.integers(0, 9)) == 0:
            entry = draw(st.one_of(JUNK, st.just({"Pods": draw(JUNK)})))
        nodes[name] = entry
    mem = draw(st.integers(1, 9))
    body: dict[str, Any] = {"Pod": gpu_pod("urgent", container(i915="1", memory_max=f"{mem}Gi"))}
    priority = draw(st.sampled_from([None, 0, 1, 2, 3]))
    if priority is not None:
        body["Pod"]["spec"]["priority"] = priority
    body["NodeNameToVictims" if full else "NodeNameToMetaVictims"] = nodes
    if draw(st.integers(0, 19)) == 0:
        body["Pod"] = draw(JUNK)
    return body


# The fuzz client's pods: u<i> is bound on n<1 + i % 2> with priority i % 3.
FUZZ_PODS = {f"u{i}": (f"n{1 + i % 2}", i % 3) for i in range(6)}


@settings(max_examples=300, deadline=None)
@given(preempt_bodies())
def test_preempt_answers_only_asked_nodes_and_proposed_or_addable_uids(
    body: dict[str, Any],
) -> None:
    response = _fuzz_client().post("/scheduler/preempt", json=body)
    reply = response.get_json()
    assert response.status_code in (200, 400), response.status_code
    if response.status_code == 400:
        assert set(reply) == {"Error"} and reply["Error"].startswith("bad request: ")
        return
    assert set(reply) == {"NodeNameToMetaVictims"}
    asked = body.get("NodeNameToVictims") or body.get("NodeNameToMetaVictims") or {}
    for name, answer in reply["NodeNameToMetaVictims"].items():
        assert name in asked and name in ("n1", "n2")
        pods = asked[name]["Pods"]
        proposed = {
            (p.get("metadata") or {}).get("uid") or p.get("UID") or p.get("uid") for p in pods
        }
        # Besides the proposed: bound pods on that node strictly below the preemptor.
        below = body["Pod"]["spec"].get("priority", 0)
        addable = {u for u, (on, p) in FUZZ_PODS.items() if on == name and p < below}
        assert set(answer) == {"Pods", "NumPDBViolations"}
        assert answer["Pods"] and all(set(p) == {"UID"} for p in answer["Pods"])
        returned = [p["UID"] for p in answer["Pods"]]
        assert set(returned) <= proposed | addable
        assert 0 <= answer["NumPDBViolations"] <= len(set(returned) & proposed)


# ---------------------------------------------------------------- kube-scheduler end to end


@pytest.mark.parametrize(
    ("preempt_verb", "node_cache_capable"),
    [(True, True), (True, False), (False, True)],
    ids=["meta-form", "full-form", "without-gas-preempt"],
)
def test_the_scheduler_evicts_where_it_helps_the_cards(
    gas: GasProcess,
    apiserver: ApiServerDouble,
    emulators: Callable[..., SchedulerEmulator],
    preempt_verb: bool,
    node_cache_capable: bool,
) -> None:
    # node-a: 4G free by node totals, 2G on each card. a, b and c are of the preemptor's
    # priority, so d is the only victim, whose eviction still leaves 5G per card (and gas
    # may add none of the others). Its victim has the lowest priority, so kube-scheduler
    # alone picks node-a and evicts d for nothing.
    pinned = [(name, card, mem, 100) for name, card, mem, _ in SIX_USED_EACH]
    crowd(apiserver, "node-a", *pinned, ("d", "card1", 3, 0))
    # node-b: 2G free; evicting f frees a whole card.
    crowd(apiserver, "node-b", ("e", "card0", 7, 3), ("f", "card1", 7, 3))
    wait_for_nodes(gas, "node-a", "node-b")
    wait_for_pods(gas, 6)
    scheduler = emulators(
        gas,
        preemption=True,
        preempt_verb=preempt_verb,
        node_cache_capable=node_cache_capable,
    )
    preemptor(apiserver)
    f = uid(apiserver, "f")
    outcome = scheduler.schedule_now("default", "urgent")
    assert not outcome.bound and outcome.error == "unschedulable"
    assert outcome.candidates == {"node-a": ["d"], "node-b": ["f"]}
    if not preempt_verb:
        assert outcome.preempt_reply is None
        assert outcome.nominated == "node-a" and outcome.evicted == ["d"]
        wait_for_pods(gas, 5)
        again = scheduler.schedule_now("default", "urgent")
        assert not again.bound  # d is gone and the pod still fits no card
        return
    assert outcome.preempt_reply == {"NodeNameToMetaVictims": {"node-b": meta(f)}}
    assert outcome.nominated == "node-b" and outcome.evicted == ["f"]
    assert apiserver.get_pod("default", "d") is not None
    wait_for_pods(gas, 5)
    again = scheduler.schedule_now("default", "urgent")
    assert again.bound and again.node == "node-b"
    bound = apiserver.get_pod("default", "urgent")
    assert bound is not None
    assert bound["metadata"]["annotations"]["gas-container-cards"] == "card1"


@pytest.mark.parametrize("node_cache_capable", [True, False], ids=["meta-form", "full-form"])
def test_the_scheduler_evicts_the_pod_gas_adds_and_the_preemptor_binds(
    gas: GasProcess,
    apiserver: ApiServerDouble,
    emulators: Callable[..., SchedulerEmulator],
    node_cache_capable: bool,
) -> None:
    # By node totals evicting C makes room for the 6G pod, so C is all kube-scheduler
    # proposes (it reprieves B, then A, the more important); gas answers A instead, which
    # frees card0 but for C's 2G.
    crowd(apiserver, "node-x", ("A", "card0", 5, 1), ("B", "card1", 5, 2), ("C", "card0", 2, 0))
    wait_for_nodes(gas, "node-x")
    wait_for_pods(gas, 3)
    scheduler = emulators(gas, preemption=True, node_cache_capable=node_cache_capable)
    preemptor(apiserver, priority=10)
    a = uid(apiserver, "A")
    outcome = scheduler.schedule_now("default", "urgent")
    assert not outcome.bound and outcome.error == "unschedulable"
    assert outcome.candidates == {"node-x": ["C"]}
    assert outcome.preempt_reply == {"NodeNameToMetaVictims": {"node-x": meta(a)}}
    assert outcome.nominated == "node-x" and outcome.evicted == ["A"]
    assert apiserver.get_pod("default", "C") is not None
    wait_for_pods(gas, 2)
    again = scheduler.schedule_now("default", "urgent")
    assert again.bound and again.node == "node-x"
    bound = apiserver.get_pod("default", "urgent")
    assert bound is not None
    assert bound["metadata"]["annotations"]["gas-container-cards"] == "card0"
