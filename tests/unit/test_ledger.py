"""Unit and property tests for gas.core.ledger: reservations, cluster truth, fail-closed."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gas.core.allocator import NODE_BLOCKED, Rejection
from gas.core.holdings import PodHolding, PodObservation, holding_from_annotation, observe_pod
from gas.core.ledger import Ledger
from gas.core.ledger_views import State
from gas.core.model import (
    I915,
    NodeGpu,
    PodRequest,
    allocation_usage,
    format_cards,
    node_from_object,
    pod_request,
)
from tests.support.objects import MEM, MILLI, G, ctr, make_node, pod_object

BLOCKED_CARDS = "gpu: cards are held by a pod with an unreadable gas-container-cards annotation"


# ---------------------------------------------------------------- helpers


def make_pod(name: str, *containers: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A pod in namespace ns (`fields` as pod_object takes them); without containers, one
    that asks for one i915."""
    return pod_object(name, *(containers or (ctr(i915="1"),)), namespace="ns", **fields)


def obs(pod: dict[str, Any]) -> PodObservation:
    observation = observe_pod(pod)
    assert observation is not None
    return observation


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def node_of(obj: dict[str, Any]) -> NodeGpu:
    node = node_from_object(obj)
    assert node.problem is None, node.problem
    return node


def ledger_with(
    *nodes: dict[str, Any], clock: FakeClock | None = None, pending_grace: float = 120.0
) -> Ledger:
    ledger = Ledger(clock=clock or FakeClock(), pending_grace=pending_grace)
    ledger.replace_nodes(node_of(n) for n in nodes)
    return ledger


def reserve_pod(ledger: Ledger, pod: dict[str, Any], node: str) -> Any:
    meta = pod["metadata"]
    result = ledger.reserve_placement(
        meta["uid"], meta["namespace"], meta["name"], pod_request(pod), node
    )
    return result if isinstance(result, Rejection) else result.cards


def bound_copy(pod: dict[str, Any], node: str, cards: str) -> dict[str, Any]:
    """The pod as the watch shows it after a successful bind."""
    return make_pod(
        pod["metadata"]["name"],
        *pod["spec"]["containers"],
        uid=pod["metadata"]["uid"],
        node=node,
        cards_annotation=cards,
    )


def states(ledger: Ledger) -> dict[str, State]:
    return {uid: state for uid, (_, state) in ledger.holdings().items()}


def gpu_pod(name: str, mem_g: int = 5) -> dict[str, Any]:
    return make_pod(name, ctr("main", i915="1", memory_max=f"{mem_g}G"))


def worked_nodes() -> tuple[dict[str, Any], dict[str, Any]]:
    # 2 cards with 8 pods each (shared-dev-num 8) and 8G of memory.max per card.
    return (
        make_node("n1", "0.1", i915="16", memory_max="16G"),
        make_node("n2", "0.1", i915="16", memory_max="16G"),
    )


# ---------------------------------------------------------------- the worked example


def test_worked_example_one_5g_pod_per_card() -> None:
    ledger = ledger_with(*worked_nodes())
    placed = []
    for i in range(4):
        pod = gpu_pod(f"p{i}")
        request = pod_request(pod)
        results = ledger.check(request, ["n1", "n2"])
        node = next(name for name, r in results.items() if not isinstance(r, Rejection))
        allocation = reserve_pod(ledger, pod, node)
        assert not isinstance(allocation, Rejection)
        ledger.commit(pod["metadata"]["uid"])
        placed.append((node, allocation))
    assert placed == [
        ("n1", (("card0",),)),
        ("n1", (("card1",),)),
        ("n2", (("card0",),)),
        ("n2", (("card1",),)),
    ]
    one_pod = {I915: 1, MEM: 5 * G}
    assert ledger.usage("n1") == {"card0": one_pod, "card1": one_pod}
    assert ledger.usage("n2") == {"card0": one_pod, "card1": one_pod}

    fifth = gpu_pod("p4")
    shortage = Rejection(
        "gpu: not enough free gpu.intel.com/memory.max on the node's cards", unresolvable=False
    )
    assert ledger.check(pod_request(fifth), ["n1", "n2"]) == {"n1": shortage, "n2": shortage}
    assert reserve_pod(ledger, fifth, "n1") == shortage
    assert reserve_pod(ledger, fifth, "n2") == shortage
    assert "uid-p4" not in ledger.holdings()


def test_worked_example_5g_pod_filtered_out_although_6g_free_in_total() -> None:
    ledger = ledger_with(*worked_nodes())
    for card in ("card0", "card1"):
        pod = make_pod(
            f"on-{card}",
            ctr("main", i915="1", memory_max="5G"),
            node="n1",
            cards_annotation=card,
        )
        ledger.observe(obs(pod))
    assert ledger.usage("n1") == {
        "card0": {I915: 1, MEM: 5 * G},
        "card1": {I915: 1, MEM: 5 * G},
    }
    results = ledger.check(pod_request(gpu_pod("new")), ["n1", "n2"])
    assert results == {
        "n1": Rejection(
            "gpu: not enough free gpu.intel.com/memory.max on the node's cards",
            unresolvable=False,
        ),
        "n2": (("card0",),),
    }
    # A 3G pod still fits on n1's first card.
    assert ledger.check(pod_request(gpu_pod("small", 3)), ["n1"]) == {"n1": (("card0",),)}


def test_worked_example_9g_pod_is_unresolvable() -> None:
    ledger = ledger_with(*worked_nodes())
    results = ledger.check(pod_request(gpu_pod("big", 9)), ["n1"])
    assert results == {
        "n1": Rejection(
            "gpu: container needs more gpu.intel.com/memory.max per card than a card has",
            unresolvable=True,
        )
    }


# ---------------------------------------------------------------- reserve / commit / cancel


def test_reserve_holds_the_last_card() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    a, b = make_pod("a"), make_pod("b")
    assert reserve_pod(ledger, a, "n1") == (("card0",),)
    assert states(ledger) == {"uid-a": State.RESERVED}
    assert ledger.usage("n1") == {"card0": {I915: 1}}
    assert reserve_pod(ledger, b, "n1") == Rejection(
        "gpu: not enough free gpu.intel.com/i915 on the node's cards", unresolvable=False
    )
    assert ledger.check(pod_request(b), ["n1"])["n1"] == Rejection(
        "gpu: not enough free gpu.intel.com/i915 on the node's cards", unresolvable=False
    )


def test_check_reserves_nothing() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    request = pod_request(make_pod("a"))
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",),)}
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",),)}
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}


def test_cancel_frees_a_reservation() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    a, b = make_pod("a"), make_pod("b")
    reserve_pod(ledger, a, "n1")
    ledger.cancel("uid-a")
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}
    assert reserve_pod(ledger, b, "n1") == (("card0",),)


def test_cancel_does_not_free_a_committed_reservation() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    reserve_pod(ledger, make_pod("a"), "n1")
    ledger.commit("uid-a")
    assert states(ledger) == {"uid-a": State.PENDING}
    ledger.cancel("uid-a")
    assert states(ledger) == {"uid-a": State.PENDING}
    assert ledger.usage("n1") == {"card0": {I915: 1}}


def test_cancel_does_not_free_a_bound_pod() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.observe(obs(bound_copy(pod, "n1", "card0")))
    ledger.cancel("uid-a")
    assert states(ledger) == {"uid-a": State.BOUND}
    assert ledger.usage("n1") == {"card0": {I915: 1}}


def test_cancel_and_commit_of_unknown_uid_are_harmless() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    ledger.cancel("nope")
    ledger.commit("nope")
    ledger.forget("nope")
    assert ledger.holdings() == {}


def test_commit_then_watch_keeps_exactly_one_entry() -> None:
    ledger = ledger_with(make_node("n1", "0.1", i915="2", memory_max="16G"))
    pod = gpu_pod("a")
    assert reserve_pod(ledger, pod, "n1") == (("card0",),)
    ledger.commit("uid-a")
    ledger.observe(obs(bound_copy(pod, "n1", "card0")))
    ledger.observe(obs(bound_copy(pod, "n1", "card0")))  # a later MODIFIED event
    assert states(ledger) == {"uid-a": State.BOUND}
    assert ledger.usage("n1") == {"card0": {I915: 1, MEM: 5 * G}}
    holding, _ = ledger.holdings()["uid-a"]
    assert holding.node == "n1"
    assert holding.allocation == (("card0",),)


def count_fits(ledger: Ledger) -> list[str]:
    """The names of the nodes the ledger fits a pod on afresh from now on (not from its
    kept answers or arrays), in order."""
    fitted: list[str] = []
    original = ledger._place

    def counting_place(node: NodeGpu, *rest: Any) -> Any:
        fitted.append(node.name)
        return original(node, *rest)

    ledger._place = counting_place  # type: ignore[method-assign,assignment]
    return fitted


def test_a_bind_confirmed_by_the_watch_keeps_the_nodes_kept_answers() -> None:
    # The watch event a bind causes changes nothing gas counts: the answers kept for the
    # node stay, so the next filter of the same shape does not fit the node again. (Two
    # GPU containers: a pod the kept answers decide, not the arrays.)
    ledger = ledger_with(make_node("n1", "0.1", i915="8", memory_max="32G"))
    pod = make_pod("a", ctr("x", i915="1", memory_max="2G"), ctr("y", i915="1", memory_max="2G"))
    request = pod_request(pod)
    assert reserve_pod(ledger, pod, "n1") == (("card0",), ("card0",))
    ledger.commit("uid-a")
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    fitted = count_fits(ledger)
    ledger.observe(obs(bound_copy(pod, "n1", "card0|card0")))
    assert states(ledger) == {"uid-a": State.BOUND}
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    assert fitted == []
    # Bound to other cards than gas counted: the node's answers go with the old usage.
    ledger.observe(obs(bound_copy(pod, "n1", "card1|card1")))
    assert ledger.usage("n1") == {"card1": {I915: 2, MEM: 4 * G}}
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    assert fitted == ["n1"]


def test_a_bind_confirmed_with_the_pods_priority_keeps_the_nodes_kept_answers() -> None:
    # gas reserves without the pod's priority (a bind does not need it) and the watch
    # brings it; no book counts it (only preemption reads it), so the node's kept answers
    # stay, and the holding takes the priority.
    ledger = ledger_with(make_node("n1", "0.1", i915="8", memory_max="32G"))
    pod = make_pod("a", ctr("x", i915="1", memory_max="2G"), ctr("y", i915="1", memory_max="2G"))
    pod["spec"]["priority"] = 1000
    request = pod_request(pod)
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a")
    assert ledger.holdings()["uid-a"][0].priority == 0
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    fitted = count_fits(ledger)
    bound = bound_copy(pod, "n1", "card0|card0")
    bound["spec"]["priority"] = 1000
    ledger.observe(obs(bound))
    holding, state = ledger.holdings()["uid-a"]
    assert (holding.priority, state) == (1000, State.BOUND)
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    assert fitted == []
    assert ledger.usage("n1") == {"card0": {I915: 2, MEM: 4 * G}}


class CountingLock:
    """A lock that counts how often it is taken."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self.lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


@pytest.mark.parametrize("containers", [1, 2])
def test_a_filter_the_arrays_cannot_judge_is_decided_under_one_hold_of_the_lock(
    containers: int,
) -> None:
    # The pod's own uncertain bind fills n1 but does not count against the pod there: the
    # arrays (one book per node) cannot judge that, and a pod with two card-asking
    # containers is never theirs. Either way the reply comes from one state of the
    # ledger, found under one hold of its lock.
    nodes = [make_node(n, "0", i915=str(containers)) for n in ("n1", "n2")]
    ledger = ledger_with(*nodes)
    pod = make_pod("a", *(ctr(f"c{i}", i915="1") for i in range(containers)))
    request = pod_request(pod)
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a", landed=False)
    lock = CountingLock()
    ledger._lock = lock  # type: ignore[assignment]
    assert ledger.judge_names(request, ["n1", "n2"], "uid-a").passed == ["n1", "n2"]
    assert lock.taken == 1
    # Any other pod of its kind finds n1 full.
    judged = ledger.judge_names(request, ["n1", "n2"])
    assert (judged.passed, list(judged.failed)) == (["n2"], ["n1"])
    assert lock.taken == 2


@pytest.mark.parametrize("landed", [False, None])
def test_the_watch_confirming_the_last_of_uncertain_binds_frees_the_others(
    landed: bool | None,
) -> None:
    # The pod shows bound exactly as gas counts its last attempt; the earlier attempts,
    # counted while any of them might have landed, are now known not to have (a pod is
    # bound once), and their cards go back. `landed` None: the last attempt's watch event
    # arrives before its bind returns.
    nodes = [make_node(n, "0", i915="1") for n in ("n1", "n2")]
    ledger = ledger_with(*nodes)
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a", landed=False)
    assert reserve_pod(ledger, pod, "n2") == (("card0",),)
    if landed is not None:
        ledger.commit("uid-a", landed=landed)
    assert ledger.usage("n1") == ledger.usage("n2") == {"card0": {I915: 1}}
    assert isinstance(ledger.check(pod_request(make_pod("b")), ["n1"])["n1"], Rejection)
    ledger.observe(obs(bound_copy(pod, "n2", "card0")))
    assert states(ledger) == {"uid-a": State.BOUND}
    assert "earlier" not in ledger.snapshot()["pods"]["uid-a"]
    assert ledger.usage("n1") == {}
    assert ledger.usage("n2") == {"card0": {I915: 1}}
    # And the answers kept for n1 went with its usage.
    assert ledger.check(pod_request(make_pod("b")), ["n1"]) == {"n1": (("card0",),)}


def test_watch_before_commit_wins_and_commit_keeps_bound() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="2"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.observe(obs(bound_copy(pod, "n1", "card0")))
    ledger.commit("uid-a")
    assert states(ledger) == {"uid-a": State.BOUND}
    assert ledger.usage("n1") == {"card0": {I915: 1}}


def test_watch_showing_pod_unbound_keeps_reservation() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.observe(obs(pod))  # the pre-bind pod, no node, no annotation
    assert states(ledger) == {"uid-a": State.RESERVED}
    ledger.commit("uid-a")
    ledger.observe(obs(pod))
    assert states(ledger) == {"uid-a": State.PENDING}
    assert ledger.usage("n1") == {"card0": {I915: 1}}


def test_reserve_for_bound_pod_is_rejected() -> None:
    ledger = ledger_with(make_node("n1", "0.1", i915="4"), make_node("n2", "0", i915="4"))
    pod = make_pod("a")
    ledger.observe(obs(bound_copy(pod, "n1", "card1")))
    assert reserve_pod(ledger, pod, "n2") == Rejection(
        "gpu: pod is already bound to n1", unresolvable=True
    )
    assert ledger.usage("n1") == {"card1": {I915: 1}}
    assert ledger.usage("n2") == {}


def test_reserve_twice_while_in_flight_is_rejected() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="4"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    assert reserve_pod(ledger, pod, "n1") == Rejection(
        "gpu: a bind for this pod is already in progress", unresolvable=False
    )
    assert ledger.usage("n1") == {"card0": {I915: 1}}


def test_reserve_replaces_a_pending_entry_of_the_same_pod() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"), make_node("n2", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a")
    assert reserve_pod(ledger, pod, "n2") == (("card0",),)
    assert states(ledger) == {"uid-a": State.RESERVED}
    # The earlier attempt may have landed: n1 stays held until this one is known.
    assert ledger.usage("n1") == {"card0": {I915: 1}}
    assert ledger.usage("n2") == {"card0": {I915: 1}}
    ledger.commit("uid-a")
    assert ledger.usage("n1") == {}
    assert ledger.usage("n2") == {"card0": {I915: 1}}


def test_refused_reservation_restores_the_pending_attempt_it_replaced() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"), make_node("n2", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a")
    reserve_pod(ledger, pod, "n2")
    ledger.cancel("uid-a")  # refused, e.g. because the first attempt did land on n1
    assert states(ledger) == {"uid-a": State.PENDING}
    assert ledger.usage("n1") == {"card0": {I915: 1}}
    assert ledger.usage("n2") == {}
    ledger.forget("uid-a")
    assert ledger.usage("n1") == {}


def test_uncertain_retry_keeps_every_attempt_that_may_have_landed() -> None:
    nodes = [make_node(n, "0", i915="1") for n in ("n1", "n2", "n3")]
    ledger = ledger_with(*nodes)
    pod = make_pod("a")
    one = {"card0": {I915: 1}}
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a", landed=False)
    reserve_pod(ledger, pod, "n2")
    ledger.commit("uid-a", landed=False)  # either Binding may be the one that landed
    reserve_pod(ledger, pod, "n3")
    ledger.cancel("uid-a")  # refused: restores the second attempt, with the first
    assert states(ledger) == {"uid-a": State.PENDING}
    assert [ledger.usage(n) for n in ("n1", "n2", "n3")] == [one, one, {}]
    earlier = ledger.snapshot()["pods"]["uid-a"]["earlier"]
    assert earlier == [{"node": "n1", "cards": [["card0"]]}]
    assert isinstance(reserve_pod(ledger, make_pod("b"), "n1"), Rejection)
    # The watch shows where the pod went: only that attempt stays.
    ledger.observe(obs(bound_copy(pod, "n1", "card0")))
    assert [ledger.usage(n) for n in ("n1", "n2", "n3")] == [one, {}, {}]


def test_attempts_of_an_uncertain_retry_go_together() -> None:
    nodes = [make_node(n, "0", i915="1") for n in ("n1", "n2", "n3")]
    clock = FakeClock(1.0)
    ledger = ledger_with(*nodes, clock=clock, pending_grace=10.0)
    pod = make_pod("a")
    for node in ("n1", "n2"):
        reserve_pod(ledger, pod, node)
        ledger.commit("uid-a", landed=False)
    # A relist within the grace keeps both; the grace then settles both at once.
    ledger.replace_pods([obs(pod)], listed_at=2.0)
    assert ledger.usage("n1") and ledger.usage("n2")
    clock.now = 20.0
    (stale,) = ledger.stale_pending()
    assert ledger.settle_pending(stale) is True
    assert ledger.usage("n1") == {} and ledger.usage("n2") == {}
    # A retry that is known to have landed frees the uncertain ones before it.
    for node in ("n1", "n2", "n3"):
        reserve_pod(ledger, pod, node)
        ledger.commit("uid-a", landed=node == "n3")
    assert [ledger.usage(n) for n in ("n1", "n2")] == [{}, {}]
    assert ledger.usage("n3") == {"card0": {I915: 1}}
    ledger.forget("uid-a")
    assert ledger.usage("n3") == {}


def test_pod_deleted_during_a_retried_bind_frees_both_attempts() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"), make_node("n2", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a")
    reserve_pod(ledger, pod, "n2")
    ledger.forget("uid-a")
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {} and ledger.usage("n2") == {}


def test_annotation_giving_a_gpu_container_no_card_fails_closed() -> None:
    ledger = ledger_with(make_node("n1", "0.1", i915="2"))
    pod = make_pod("a", node="n1", cards_annotation="")
    ledger.observe(obs(pod))
    assert isinstance(ledger.check(pod_request(make_pod("b")), ["n1"])["n1"], Rejection)


def test_reserve_on_unknown_node() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    assert reserve_pod(ledger, make_pod("a"), "ghost") == Rejection(
        "gpu: node is not known to gas", unresolvable=False
    )
    assert ledger.check(pod_request(make_pod("a")), ["ghost"]) == {
        "ghost": Rejection("gpu: node is not known to gas", unresolvable=False)
    }


def test_reserve_on_node_with_problem() -> None:
    ledger = Ledger(clock=FakeClock())
    ledger.set_node(node_from_object({"metadata": {"name": "plain"}}))
    assert reserve_pod(ledger, make_pod("a"), "plain") == Rejection(
        "gpu: node has no gpu.intel.com/gpu-numbers or gpu.intel.com/cards label",
        unresolvable=True,
    )
    assert ledger.holdings() == {}


def test_multi_container_reservation_usage() -> None:
    ledger = ledger_with(make_node("n1", "0.1.2.3", i915="8", millicores="4000"))
    pod = make_pod(
        "m",
        ctr("a", i915="2", millicores="1001"),
        ctr("side"),
        ctr("b", i915="1", millicores="200"),
    )
    assert reserve_pod(ledger, pod, "n1") == (("card0", "card1"), (), ("card0",))
    assert ledger.usage("n1") == {
        "card0": {I915: 2, MILLI: 701},
        "card1": {I915: 1, MILLI: 501},
    }


def test_check_accepts_node_objects() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    reserve_pod(ledger, make_pod("a"), "n1")
    other = node_of(make_node("n1", "0.1", i915="2"))  # a fresher view of n1
    assert ledger.check(pod_request(make_pod("b")), [other]) == {"n1": (("card1",),)}


# ---------------------------------------------------------------- cluster truth: observe / forget


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pod_frees_its_cards(phase: str) -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a", node="n1", cards_annotation="card0")
    ledger.observe(obs(pod))
    assert ledger.usage("n1") == {"card0": {I915: 1}}
    pod["status"]["phase"] = phase
    ledger.observe(obs(pod))
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}
    assert reserve_pod(ledger, make_pod("b"), "n1") == (("card0",),)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pod_is_never_counted(phase: str) -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    ledger.observe(obs(make_pod("a", node="n1", cards_annotation="card0", phase=phase)))
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}


def test_terminal_observation_drops_a_reservation() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    pod["status"]["phase"] = "Failed"
    ledger.observe(obs(pod))
    assert ledger.holdings() == {}


def test_terminating_pod_stays_counted() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a", node="n1", cards_annotation="card0")
    ledger.observe(obs(pod))
    ledger.observe(obs(make_pod("a", node="n1", cards_annotation="card0", deleting=True)))
    assert states(ledger) == {"uid-a": State.BOUND}
    assert ledger.usage("n1") == {"card0": {I915: 1}}


@pytest.mark.parametrize("state", ["reserved", "pending", "bound"])
def test_forget_frees_in_any_state(state: str) -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a")
    if state == "bound":
        ledger.observe(obs(bound_copy(pod, "n1", "card0")))
    else:
        reserve_pod(ledger, pod, "n1")
        if state == "pending":
            ledger.commit("uid-a")
    assert states(ledger) == {"uid-a": State(state)}
    ledger.forget("uid-a")
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}


def test_annotation_removed_from_bound_pod_frees_it() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    ledger.observe(obs(make_pod("a", node="n1", cards_annotation="card0")))
    ledger.observe(obs(make_pod("a", node="n1")))
    assert ledger.holdings() == {}


def test_bound_pod_without_annotation_is_not_counted() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    ledger.observe(obs(make_pod("a", node="n1")))
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}


def test_annotation_without_node_is_not_counted() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    ledger.observe(obs(make_pod("a", cards_annotation="card0")))
    assert ledger.holdings() == {}


def test_two_bound_pods_share_a_card() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="8", millicores="1000"))
    for name, milli in (("a", "600"), ("b", "300")):
        pod = make_pod(name, ctr(i915="1", millicores=milli), node="n1", cards_annotation="card0")
        ledger.observe(obs(pod))
    assert ledger.usage("n1") == {"card0": {I915: 2, MILLI: 900}}
    ledger.forget("uid-a")
    assert ledger.usage("n1") == {"card0": {I915: 1, MILLI: 300}}


def test_observe_pod_reduction() -> None:
    pod = make_pod(
        "a", ctr("x", i915="2"), node="n1", cards_annotation="card1,card3", phase="Running"
    )
    observation = observe_pod(pod)
    assert observation == PodObservation(
        uid="uid-a",
        namespace="ns",
        name="a",
        terminal=False,
        holding=PodHolding(
            "uid-a",
            "ns",
            "a",
            "n1",
            (("card1", "card3"),),
            {"card1": {I915: 1}, "card3": {I915: 1}},
        ),
    )


@pytest.mark.parametrize(
    "pod",
    [
        {},
        {"metadata": {"name": "x"}},
        {"metadata": {"name": "x", "uid": ""}},
        {"metadata": {"name": "x", "uid": 7}},
        {"metadata": None},
    ],
)
def test_observe_pod_without_uid_is_none(pod: dict[str, Any]) -> None:
    assert observe_pod(pod) is None


@pytest.mark.parametrize(
    ("phase", "terminal"),
    [
        ("Pending", False),
        ("Running", False),
        ("Unknown", False),
        ("Succeeded", True),
        ("Failed", True),
    ],
)
def test_observe_pod_terminal_phases(phase: str, terminal: bool) -> None:
    assert obs(make_pod("a", phase=phase)).terminal is terminal


def test_observe_pod_not_bound_has_no_holding() -> None:
    assert obs(make_pod("a")).holding is None
    assert obs(make_pod("a", node="")).holding is None
    assert obs(make_pod("a", node="n1")).holding is None


# ---------------------------------------------------------------- relist


def test_replace_pods_relist_semantics() -> None:
    clock = FakeClock(1.0)
    # The old bind's grace has run out by the list (1 + 5 <= 8): its Binding cannot land.
    ledger = ledger_with(
        make_node("n1", "0.1.2.3.4.5.6.7", i915="8"), clock=clock, pending_grace=5.0
    )
    pods = {name: make_pod(name) for name in ("reserved", "old", "new", "gone", "kept", "done")}

    reserve_pod(ledger, pods["old"], "n1")  # card0
    ledger.commit("uid-old")  # PENDING since 1.0
    ledger.observe(obs(bound_copy(pods["gone"], "n1", "card1")))
    ledger.observe(obs(bound_copy(pods["kept"], "n1", "card2")))
    ledger.observe(obs(bound_copy(pods["done"], "n1", "card3")))
    clock.now = 5.0
    reserve_pod(ledger, pods["reserved"], "n1")  # card4, RESERVED since 5.0
    clock.now = 10.0
    reserve_pod(ledger, pods["new"], "n1")  # card5
    ledger.commit("uid-new")  # PENDING since 10.0
    assert states(ledger) == {
        "uid-old": State.PENDING,
        "uid-gone": State.BOUND,
        "uid-kept": State.BOUND,
        "uid-done": State.BOUND,
        "uid-reserved": State.RESERVED,
        "uid-new": State.PENDING,
    }

    finished = bound_copy(pods["done"], "n1", "card3")
    finished["status"]["phase"] = "Succeeded"
    listing = [
        obs(pods["old"]),  # listed, but not (yet) bound
        obs(bound_copy(pods["kept"], "n1", "card2")),
        obs(finished),
        obs(make_pod("fresh", node="n1", cards_annotation="card6")),
        obs(make_pod("dead", node="n1", cards_annotation="card7", phase="Failed")),
        obs(pods["new"]),  # the list predates its binding
    ]
    ledger.replace_pods(listing, listed_at=8.0)

    assert states(ledger) == {
        "uid-reserved": State.RESERVED,
        "uid-new": State.PENDING,
        "uid-kept": State.BOUND,
        "uid-fresh": State.BOUND,
    }
    one = {I915: 1}
    assert ledger.usage("n1") == {"card2": one, "card4": one, "card5": one, "card6": one}


def test_replace_pods_keeps_pending_listed_unbound_within_the_grace() -> None:
    # A Binding that timed out may still be written after the list was taken: the pod is
    # listed unbound, yet the cards stay held until the grace has passed.
    clock = FakeClock(1.0)
    ledger = ledger_with(make_node("n1", "0", i915="1"), clock=clock, pending_grace=10.0)
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a")
    ledger.replace_pods([obs(pod)], listed_at=10.9)
    assert states(ledger) == {"uid-a": State.PENDING}
    assert isinstance(reserve_pod(ledger, make_pod("b"), "n1"), Rejection)
    ledger.replace_pods([obs(pod)], listed_at=11.0)
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}


def test_replace_pods_drops_pending_of_pod_gone_before_the_list() -> None:
    # Not listed though the list began after the commit: the pod was deleted, so its
    # Binding can never land, however young the entry.
    clock = FakeClock(1.0)
    ledger = ledger_with(make_node("n1", "0", i915="1"), clock=clock, pending_grace=100.0)
    reserve_pod(ledger, make_pod("a"), "n1")
    ledger.commit("uid-a")
    ledger.replace_pods([], listed_at=1.5)
    assert ledger.holdings() == {}


def test_stale_pending_and_settle() -> None:
    clock = FakeClock(1.0)
    ledger = ledger_with(make_node("n1", "0.1", i915="2"), clock=clock, pending_grace=10.0)
    for name in ("a", "b", "c"):
        reserve_pod(ledger, make_pod(name), "n1")
    ledger.commit("uid-a")
    ledger.commit("uid-b")
    ledger.cancel("uid-c")
    clock.now = 10.9
    assert ledger.stale_pending() == []
    clock.now = 11.0
    stale = {s.uid: s for s in ledger.stale_pending()}
    assert set(stale) == {"uid-a", "uid-b"}
    assert (stale["uid-a"].namespace, stale["uid-a"].name, stale["uid-a"].node) == ("ns", "a", "n1")
    # b is bound meanwhile (the watch took over): settling it must not release anything.
    ledger.observe(obs(bound_copy(make_pod("b"), "n1", "card1")))
    assert ledger.settle_pending(stale["uid-b"]) is False
    assert ledger.settle_pending(stale["uid-a"]) is True
    assert ledger.settle_pending(stale["uid-a"]) is False
    assert states(ledger) == {"uid-b": State.BOUND}
    assert ledger.usage("n1") == {"card1": {I915: 1}}


def test_settle_pending_loses_to_a_newer_bind_of_the_same_pod() -> None:
    clock = FakeClock(1.0)
    ledger = ledger_with(make_node("n1", "0.1", i915="2"), clock=clock, pending_grace=10.0)
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a")
    clock.now = 20.0
    (stale,) = ledger.stale_pending()
    # kube-scheduler retries the pod before the sweep settles the first attempt.
    assert not isinstance(reserve_pod(ledger, pod, "n1"), Rejection)
    assert ledger.settle_pending(stale) is False  # RESERVED now
    ledger.commit("uid-a")
    assert ledger.settle_pending(stale) is False  # a newer PENDING entry
    assert states(ledger) == {"uid-a": State.PENDING}
    # A refused third attempt restores the second, which is settled on its own grace.
    reserve_pod(ledger, pod, "n1")
    ledger.cancel("uid-a")
    assert ledger.stale_pending() == []
    clock.now = 30.0
    (restored,) = ledger.stale_pending()
    assert restored.since == 20.0
    assert ledger.settle_pending(stale) is False
    assert ledger.settle_pending(restored) is True
    assert ledger.holdings() == {}


def test_replace_pods_turns_pending_into_bound_when_listed() -> None:
    clock = FakeClock(1.0)
    ledger = ledger_with(make_node("n1", "0", i915="1"), clock=clock)
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    ledger.commit("uid-a")
    ledger.replace_pods([obs(bound_copy(pod, "n1", "card0"))], listed_at=5.0)
    assert states(ledger) == {"uid-a": State.BOUND}
    assert ledger.usage("n1") == {"card0": {I915: 1}}


def test_replace_pods_keeps_pending_at_exactly_the_list_time() -> None:
    clock = FakeClock(5.0)
    ledger = ledger_with(make_node("n1", "0", i915="1"), clock=clock)
    reserve_pod(ledger, make_pod("a"), "n1")
    ledger.commit("uid-a")
    ledger.replace_pods([], listed_at=5.0)
    assert states(ledger) == {"uid-a": State.PENDING}
    ledger.replace_pods([], listed_at=5.5)
    assert ledger.holdings() == {}


def test_replace_pods_drops_reservation_of_pod_listed_terminal() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    pod["status"]["phase"] = "Failed"
    ledger.replace_pods([obs(pod)], listed_at=0.0)
    assert ledger.holdings() == {}
    assert ledger.usage("n1") == {}


def test_replace_pods_counts_terminating_pods() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a", node="n1", cards_annotation="card0", deleting=True)
    ledger.replace_pods([obs(pod)], listed_at=0.0)
    assert states(ledger) == {"uid-a": State.BOUND}


def test_replace_pods_accepts_a_one_shot_iterable() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    pod = make_pod("a")
    reserve_pod(ledger, pod, "n1")
    pod["status"]["phase"] = "Failed"
    ledger.replace_pods((o for o in [obs(pod)]), listed_at=0.0)
    assert ledger.holdings() == {}


# ---------------------------------------------------------------- fail closed


@pytest.mark.parametrize(
    ("annotation", "blocked", "whole_node"),
    [
        ("card0|card1", {"card0", "card1"}, False),  # 2 segments for 1 container
        ("card1|", {"card1"}, False),
        ("gpu0", set(), True),
        ("card0,card0", {"card0"}, False),
        ("card1,gpu3", {"card1"}, False),
        ("card01", set(), True),
        (42, set(), True),
        (["card0"], set(), True),
        ({"card": "card0"}, set(), True),
    ],
)
def test_unparsable_annotation_fails_closed(
    caplog: pytest.LogCaptureFixture, annotation: Any, blocked: set[str], whole_node: bool
) -> None:
    pod = make_pod("bad", node="n1", cards_annotation=annotation)
    with caplog.at_level(logging.WARNING, logger="gas.core.ledger"):
        observation = obs(pod)
    holding = observation.holding
    assert holding is not None
    assert holding.blocked_cards == frozenset(blocked)
    assert holding.blocks_node is whole_node
    assert holding.allocation == ()
    assert holding.usage == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "ns/bad" in message
    assert "uid-bad" in message
    assert "cannot account gas-container-cards" in message
    assert ("the whole node" in message) is whole_node


def test_blocked_cards_are_not_handed_out() -> None:
    ledger = ledger_with(make_node("n1", "0.1.2", i915="24"))
    ledger.observe(obs(make_pod("bad", node="n1", cards_annotation="card0,card0")))
    assert reserve_pod(ledger, make_pod("a"), "n1") == (("card1",),)
    assert reserve_pod(ledger, make_pod("b", ctr(i915="3")), "n1") == Rejection(
        BLOCKED_CARDS, False
    )
    assert ledger.usage("n1") == {"card1": {I915: 1}}
    snapshot = ledger.snapshot()["pods"]["uid-bad"]
    assert snapshot["blocked_cards"] == ["card0"]
    assert snapshot["blocks_node"] is False


def test_whole_node_blocked_then_released() -> None:
    ledger = ledger_with(make_node("n1", "0.1", i915="16"), make_node("n2", "0", i915="8"))
    bad = make_pod("bad", node="n1", cards_annotation="gpu0")
    ledger.observe(obs(bad))
    request = pod_request(make_pod("a"))
    assert ledger.check(request, ["n1", "n2"]) == {
        "n1": Rejection(NODE_BLOCKED, unresolvable=False),
        "n2": (("card0",),),
    }
    bad["status"]["phase"] = "Succeeded"
    ledger.observe(obs(bad))
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",),)}


def test_two_pods_blocking_the_same_card_need_both_gone() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="8"))
    ledger.observe(obs(make_pod("x", node="n1", cards_annotation="card0|card0")))
    ledger.observe(obs(make_pod("y", node="n1", cards_annotation="card0,card0")))
    request = pod_request(make_pod("a"))
    ledger.forget("uid-x")
    assert ledger.check(request, ["n1"]) == {"n1": Rejection(BLOCKED_CARDS, False)}
    ledger.forget("uid-y")
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",),)}


def test_unreadable_pod_spec_blocks_its_annotated_cards(caplog: pytest.LogCaptureFixture) -> None:
    pod = make_pod("frac", ctr(i915="1", millicores="0.5"), node="n1", cards_annotation="card1")
    with caplog.at_level(logging.WARNING, logger="gas.core.ledger"):
        holding = holding_from_annotation("u", "ns", "frac", "n1", pod, "card1")
    assert holding.blocked_cards == frozenset({"card1"})
    assert holding.blocks_node is False
    assert "not a whole number" in caplog.text


def test_readable_annotation_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    pod = make_pod("ok", node="n1", cards_annotation="card0")
    with caplog.at_level(logging.DEBUG, logger="gas.core.ledger"):
        holding = holding_from_annotation("u", "ns", "ok", "n1", pod, "card0")
    assert holding.blocked_cards == frozenset()
    assert holding.blocks_node is False
    assert holding.usage == {"card0": {I915: 1}}
    assert caplog.records == []


# ---------------------------------------------------------------- nodes


def test_node_removed_and_re_added_keeps_usage() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    ledger.observe(obs(make_pod("a", node="n1", cards_annotation="card0")))
    ledger.remove_node("n1")
    assert ledger.node("n1") is None
    assert ledger.node_names() == []
    assert ledger.usage("n1") == {"card0": {I915: 1}}
    ledger.set_node(node_of(make_node("n1", "0", i915="1")))
    assert ledger.check(pod_request(make_pod("b")), ["n1"]) == {
        "n1": Rejection("gpu: not enough free gpu.intel.com/i915 on the node's cards", False)
    }


def test_replace_nodes_keeps_usage_and_swaps_the_node_set() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"), make_node("n2", "0", i915="1"))
    ledger.observe(obs(make_pod("a", node="n1", cards_annotation="card0")))
    ledger.replace_nodes([node_of(make_node("n1", "0.1", i915="2"))])
    assert ledger.node_names() == ["n1"]
    assert ledger.usage("n1") == {"card0": {I915: 1}}
    assert ledger.check(pod_request(make_pod("b")), ["n1", "n2"]) == {
        "n1": (("card1",),),
        "n2": Rejection("gpu: node is not known to gas", False),
    }


def test_set_node_updates_capacity() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="1"))
    reserve_pod(ledger, make_pod("a"), "n1")
    ledger.set_node(node_of(make_node("n1", "0", i915="2")))
    node = ledger.node("n1")
    assert node is not None
    assert node.capacity == {I915: 2}
    assert reserve_pod(ledger, make_pod("b"), "n1") == (("card0",),)


def test_usage_returns_a_copy() -> None:
    ledger = ledger_with(make_node("n1", "0", i915="2"))
    reserve_pod(ledger, make_pod("a"), "n1")
    view = ledger.usage("n1")
    view["card0"][I915] = 0
    assert ledger.usage("n1") == {"card0": {I915: 1}}


def test_snapshot() -> None:
    ledger = ledger_with(make_node("n1", "0.1", i915="4"))
    reserve_pod(ledger, make_pod("a"), "n1")
    assert ledger.snapshot() == {
        "nodes": {
            "n1": {"cards": ["card0", "card1"], "capacity": {I915: 2}, "problem": None},
        },
        "usage": {"n1": {"card0": {I915: 1}}},
        "pods": {
            "uid-a": {
                "namespace": "ns",
                "name": "a",
                "node": "n1",
                "cards": [["card0"]],
                "state": "reserved",
                "blocked_cards": [],
                "blocks_node": False,
            }
        },
    }


# ---------------------------------------------------------------- property: ledger invariants


class LedgerMachine(RuleBasedStateMachine):
    """Random reserve/commit/cancel/watch/terminal/forget/relist sequences on 1-3 nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.ledger = Ledger(clock=self.clock)
        self.nodes: dict[str, NodeGpu] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, PodRequest] = {}
        self.expected: dict[str, State] = {}
        self.placed: dict[str, tuple[str, str]] = {}  # uid -> (node, annotation)
        self.serial = 0

    @initialize(
        specs=st.lists(
            st.tuples(
                st.integers(min_value=1, max_value=8),  # cards
                st.integers(min_value=1, max_value=4),  # pods per card
                st.integers(min_value=0, max_value=16),  # memory per card
                st.integers(min_value=0, max_value=1000),  # millicores per card
            ),
            min_size=1,
            max_size=3,
        )
    )
    def make_nodes(self, specs: list[tuple[int, int, int, int]]) -> None:
        for i, (cards, share, mem, milli) in enumerate(specs):
            obj = make_node(
                f"n{i}",
                ".".join(str(c) for c in range(cards)),
                i915=str(cards * share),
                memory_max=str(cards * mem),
                millicores=str(cards * milli),
            )
            self.nodes[f"n{i}"] = node_of(obj)
        self.ledger.replace_nodes(self.nodes.values())

    def tick(self) -> None:
        self.clock.now += 1.0

    def pick(self, index: int, *wanted: State) -> str | None:
        uids = sorted(u for u, s in self.expected.items() if s in wanted)
        return uids[index % len(uids)] if uids else None

    @rule(
        node=st.integers(min_value=0, max_value=2),
        containers=st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=3),
                st.none() | st.integers(min_value=0, max_value=10),
                st.none() | st.integers(min_value=0, max_value=800),
            ),
            min_size=1,
            max_size=3,
        ),
    )
    def reserve(self, node: int, containers: list[tuple[int, int | None, int | None]]) -> None:
        self.tick()
        self.serial += 1
        name = f"p{self.serial}"
        specs = []
        for i, (gpus, mem, milli) in enumerate(containers):
            asks = {"i915": str(gpus)}
            if mem is not None:
                asks["memory_max"] = str(mem)
            if milli is not None:
                asks["millicores"] = str(milli)
            specs.append(ctr(f"c{i}", **asks))
        pod = make_pod(name, *specs)
        node_name = f"n{node % len(self.nodes)}"
        request = pod_request(pod)
        result = reserve_pod(self.ledger, pod, node_name)
        if isinstance(result, Rejection):
            assert name not in self.expected
            return
        uid = pod["metadata"]["uid"]
        self.pods[uid] = pod
        self.requests[uid] = request
        self.expected[uid] = State.RESERVED
        self.placed[uid] = (node_name, format_cards(result))

    @rule(index=st.integers(min_value=0, max_value=50))
    def commit(self, index: int) -> None:
        self.tick()
        uid = self.pick(index, State.RESERVED, State.PENDING, State.BOUND)
        if uid is None:
            return
        self.ledger.commit(uid)
        if self.expected[uid] is State.RESERVED:
            self.expected[uid] = State.PENDING

    @rule(index=st.integers(min_value=0, max_value=50))
    def cancel(self, index: int) -> None:
        uid = self.pick(index, State.RESERVED, State.PENDING, State.BOUND)
        if uid is None:
            return
        self.ledger.cancel(uid)
        if self.expected[uid] is State.RESERVED:
            del self.expected[uid]

    @rule(index=st.integers(min_value=0, max_value=50))
    def watch_bound(self, index: int) -> None:
        uid = self.pick(index, State.RESERVED, State.PENDING, State.BOUND)
        if uid is None:
            return
        node, cards = self.placed[uid]
        self.ledger.observe(obs(bound_copy(self.pods[uid], node, cards)))
        self.expected[uid] = State.BOUND

    @rule(
        index=st.integers(min_value=0, max_value=50), phase=st.sampled_from(["Succeeded", "Failed"])
    )
    def watch_terminal(self, index: int, phase: str) -> None:
        uid = self.pick(index, State.RESERVED, State.PENDING, State.BOUND)
        if uid is None:
            return
        node, cards = self.placed[uid]
        pod = bound_copy(self.pods[uid], node, cards)
        pod["status"]["phase"] = phase
        self.ledger.observe(obs(pod))
        del self.expected[uid]

    @rule(index=st.integers(min_value=0, max_value=50))
    def delete(self, index: int) -> None:
        uid = self.pick(index, State.RESERVED, State.PENDING, State.BOUND)
        if uid is None:
            return
        self.ledger.forget(uid)
        del self.expected[uid]

    @precondition(lambda self: bool(self.nodes))
    @rule()
    def relist(self) -> None:
        # The cluster has caught up: every committed or bound pod shows as bound.
        self.tick()
        listing = [
            obs(bound_copy(self.pods[uid], *self.placed[uid]))
            for uid, state in self.expected.items()
            if state in (State.PENDING, State.BOUND)
        ]
        self.ledger.replace_pods(listing, listed_at=self.clock.now)
        for uid, state in list(self.expected.items()):
            if state is State.PENDING:
                self.expected[uid] = State.BOUND

    @invariant()
    def states_match(self) -> None:
        assert states(self.ledger) == self.expected

    @invariant()
    def usage_within_capacity_and_equal_to_holdings(self) -> None:
        recomputed: dict[str, dict[str, dict[str, int]]] = {}
        for uid, (holding, _) in self.ledger.holdings().items():
            per_node = recomputed.setdefault(holding.node, {})
            for card, row in allocation_usage(self.requests[uid], holding.allocation).items():
                for r, amount in row.items():
                    if amount:
                        cell = per_node.setdefault(card, {})
                        cell[r] = cell.get(r, 0) + amount
        for name, node in self.nodes.items():
            usage = self.ledger.usage(name)
            assert usage == recomputed.get(name, {})
            for card, row in usage.items():
                assert card in node.cards
                for r, amount in row.items():
                    assert 0 < amount <= node.capacity[r], (name, card, r, amount)


# Each example is a whole run of up to 20 steps, so fewer runs than for the other properties.
LedgerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=20, deadline=None)
test_ledger_invariants = LedgerMachine.TestCase


def test_a_node_event_that_changes_nothing_keeps_the_nodes_kept_answers() -> None:
    # Two GPU containers: a pod the kept answers decide, not the arrays.
    ledger = ledger_with(make_node("n1", "0.1", i915="8", memory_max="32G"))
    request = pod_request(
        make_pod("a", ctr("x", i915="1", memory_max="2G"), ctr("y", i915="1", memory_max="2G"))
    )
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    fitted = count_fits(ledger)
    ledger.set_node(node_of(make_node("n1", "0.1", i915="8", memory_max="32G")))  # equal
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    assert fitted == []
    ledger.set_node(node_of(make_node("n1", "0.1", i915="8", memory_max="16G")))  # smaller
    assert ledger.check(request, ["n1"]) == {"n1": (("card0",), ("card0",))}
    assert fitted == ["n1"]
