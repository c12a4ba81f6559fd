"""Placement policies (first-fit, binpack, spread), the prioritize verb and the
fragmentation measure: pure functions first, then a real gas process and the emulator."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from gas.core.allocator import Placement, Policy, Rejection, dominant_resource, place
from gas.core.model import I915, NodeGpu, PodRequest, Usage, allocation_usage, pod_request
from gas.core.scoring import (
    POD_SIZES,
    cluster_placeable,
    fullness,
    node_score,
    placeable,
    placeable_pods,
    score,
)
from gas.tools.inspector.render import render_table, report_json
from gas.tools.inspector.report import build_report
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import ledger_of, wait_for_nodes
from tests.support.objects import MEM, MILLI, G, card_node, container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.promtext import metric
from tests.support.scheduler import SchedulerEmulator
from tests.support.scheduler import listed_scores as scores

BINPACK = Policy(placement="binpack")
SPREAD = Policy(placement="spread")
FIRST_FIT = Policy()
BIN = {"gas-policy": "binpack"}


def node(name: str = "n", cards: int = 2, mem: int = 8 * G, slots: int = 4) -> NodeGpu:
    """`cards` cards, each with `mem` memory.max and `slots` i915."""
    return card_node(cards, name, i915=slots, memory_max=mem)


def pod(memory: int, gpus: int = 1, annotations: dict[str, str] | None = None) -> PodRequest:
    return pod_request(
        gpu_pod("p", container(i915=str(gpus), memory_max=str(memory)), annotations=annotations)
    )


def cards_chosen(n: NodeGpu, usage: Usage, request: PodRequest, policy: Policy) -> Any:
    result = place(n, usage, request, policy=policy)
    assert isinstance(result, Placement), result
    return result.cards


def used(memory: int, slots: int = 1) -> dict[str, int]:
    return {MEM: memory, I915: slots}


# ---------------------------------------------------------------- card choice


def test_card_choice_per_policy() -> None:
    n = node(cards=3)
    usage = {"card1": used(6 * G), "card2": used(4 * G)}  # free: 8G, 2G, 4G
    three = pod(3 * G)
    assert cards_chosen(n, usage, three, FIRST_FIT) == (("card0",),)
    # binpack: the fitting card with the least free memory (card1 has only 2G: no fit).
    assert cards_chosen(n, usage, three, BINPACK) == (("card2",),)
    assert cards_chosen(n, usage, three, SPREAD) == (("card0",),)
    one = pod(1 * G)
    assert cards_chosen(n, usage, one, BINPACK) == (("card1",),)
    assert cards_chosen(n, usage, one, SPREAD) == (("card0",),)


def test_card_ties_keep_numeric_order() -> None:
    n = node(cards=4)
    usage = {"card1": used(2 * G), "card3": used(2 * G)}
    assert cards_chosen(n, usage, pod(G), BINPACK) == (("card1",),)
    assert cards_chosen(n, usage, pod(G), SPREAD) == (("card0",),)


def test_multi_card_container_takes_the_fullest_cards_that_fit() -> None:
    n = node(cards=4)
    usage = {"card0": used(1 * G), "card2": used(5 * G), "card3": used(3 * G)}
    two = pod(6 * G, gpus=2)  # 3G on each of two cards; free: 7G, 8G, 3G, 5G
    assert cards_chosen(n, usage, two, BINPACK) == (("card2", "card3"),)
    assert cards_chosen(n, usage, two, SPREAD) == (("card1", "card0"),)
    assert cards_chosen(n, usage, two, FIRST_FIT) == (("card0", "card1"),)


def test_dominant_resource_is_the_largest_share_of_a_card() -> None:
    n = NodeGpu("n", ("card0", "card1"), {I915: 4, MEM: 8 * G, MILLI: 1000})
    memory_heavy = pod_request(gpu_pod("p", container(i915="1", memory_max=str(6 * G))))
    assert dominant_resource(n, memory_heavy) == MEM
    compute_heavy = pod_request(
        gpu_pod("p", container(i915="1", memory_max=str(G), millicores="900"))
    )
    assert dominant_resource(n, compute_heavy) == MILLI
    # millicores dominant: binpack picks the card with the least free millicores.
    usage = {"card0": {MEM: 6 * G, MILLI: 0, I915: 1}, "card1": {MEM: 0, MILLI: 100, I915: 1}}
    assert cards_chosen(n, usage, compute_heavy, BINPACK) == (("card1",),)


# ---------------------------------------------------------------- node scores


def test_score_definition_on_a_known_node() -> None:
    n = node()  # 2 cards x (8G, 4 slots)
    usage = {"card0": used(4 * G)}
    request = pod(2 * G)
    # After placing: memory 6G of 16G, i915 2 of 8: mean of 3/8 and 1/4 = 5/16.
    result = place(n, usage, request, policy=BINPACK)
    assert isinstance(result, Placement)
    full = fullness(n, usage, request, result.cards)
    assert full is not None and full * 16 == 5
    assert node_score(n, usage, request, result.cards, BINPACK) == 3  # round(3.125)
    assert score(n, usage, request, BINPACK) == 3
    assert score(n, usage, request, SPREAD) == 7
    assert score(n, usage, request, FIRST_FIT) == 0


def test_binpack_prefers_the_fullest_node_that_fits_spread_the_emptiest() -> None:
    empty, half, full = node("empty"), node("half"), node("full")
    usages: dict[str, Usage] = {
        "empty": {},
        "half": {"card0": used(8 * G)},
        "full": {"card0": used(8 * G), "card1": used(7 * G)},
    }
    request = pod(4 * G)
    binpack = {n.name: score(n, usages[n.name], request, BINPACK) for n in (empty, half, full)}
    spread = {n.name: score(n, usages[n.name], request, SPREAD) for n in (empty, half, full)}
    assert binpack["full"] == 0 and spread["full"] == 0  # no fit
    assert binpack["half"] > binpack["empty"] > 0
    assert spread["empty"] > spread["half"] > 0
    assert score(empty, {}, request, BINPACK) == score(node("twin"), {}, request, BINPACK)


def _run(policy: Policy, pods: int, memory: int) -> dict[str, dict[str, dict[str, int]]]:
    """Place pods one by one on the highest scoring node (ties: name order), as the
    scheduler would with only gas's scores, and return the usage per node."""
    nodes = [node("node-a"), node("node-b")]
    usage: dict[str, dict[str, dict[str, int]]] = {"node-a": {}, "node-b": {}}
    request = pod(memory)
    for _ in range(pods):
        best = max(nodes, key=lambda n: (score(n, usage[n.name], request, policy), n.name < "b"))
        result = place(best, usage[best.name], request, policy=policy)
        assert isinstance(result, Placement)
        for card, resources in allocation_usage(request, result.cards).items():
            own = usage[best.name].setdefault(card, {})
            for res, amount in resources.items():
                own[res] = own.get(res, 0) + amount
    return usage


def test_binpack_fills_one_node_before_the_next() -> None:
    usage = _run(BINPACK, 4, 4 * G)
    assert usage["node-b"] == {}
    assert usage["node-a"] == {"card0": used(8 * G, 2), "card1": used(8 * G, 2)}


def test_spread_alternates_between_nodes() -> None:
    usage = _run(SPREAD, 4, 4 * G)
    for name in ("node-a", "node-b"):
        assert usage[name] == {"card0": used(4 * G), "card1": used(4 * G)}


def test_annotation_overrides_the_cluster_policy() -> None:
    n = node(cards=2)
    usage = {"card1": used(2 * G)}
    spread_pod = pod(G, annotations={"gas-policy": "spread"})
    assert spread_pod.policy == "spread"
    assert cards_chosen(n, usage, spread_pod, BINPACK) == (("card0",),)
    binpack_pod = pod(G, annotations={"gas-policy": " BinPack "})
    assert cards_chosen(n, usage, binpack_pod, SPREAD) == (("card1",),)
    first = pod(G, annotations={"gas-policy": "first-fit"})
    assert cards_chosen(n, usage, first, BINPACK) == (("card0",),)
    assert score(n, usage, first, BINPACK) == 0


def test_malformed_annotation_is_an_unresolvable_reason() -> None:
    request = pod(G, annotations={"gas-policy": "tightest"})
    result = place(node(), {}, request, policy=BINPACK)
    assert isinstance(result, Rejection)
    assert result.unresolvable
    assert "gas-policy" in result.reason and "tightest" in result.reason
    assert score(node(), {}, request, BINPACK) == 0


# ---------------------------------------------------------------- fragmentation


def test_placeable_counts_on_a_known_cluster() -> None:
    a, b = node("node-a"), node("node-b")  # 2 cards x (8G, 4 slots) each
    usage: dict[str, Usage] = {"node-a": {"card0": used(4 * G)}}
    per_node = placeable_pods([b, a], usage)
    assert per_node == {
        # card0: 4G and 3 slots free; card1: idle.
        "node-a": {"quarter-card": 2 + 4, "half-card": 1 + 2, "one-card": 1, "two-cards": 0},
        "node-b": {"quarter-card": 8, "half-card": 4, "one-card": 2, "two-cards": 1},
    }
    assert cluster_placeable(per_node) == {
        "quarter-card": 14,
        "half-card": 7,
        "one-card": 3,
        "two-cards": 1,
    }
    # Slots bound it too: 1 slot left on each card.
    tight = {"card0": {I915: 3}, "card1": {I915: 3}}
    assert placeable(b, tight, POD_SIZES[0]) == 2
    assert placeable(b, {}, POD_SIZES[2], blocked=frozenset({"card0"})) == 1
    assert placeable(b, {}, POD_SIZES[0], node_blocked=True) == 0


def held_pod() -> dict[str, Any]:
    """A running pod on node-a's card0: one i915 slot, 4 GiB."""
    return gpu_pod(
        "held",
        container(i915="1", memory_max=str(4 * G)),
        node="node-a",
        annotations={"gas-container-cards": "card0", "gas-ts": "1"},
        phase="Running",
    )


def test_inspect_reports_placeable_pods() -> None:
    nodes = [gpu_node("node-a", "0.1", i915="8", memory_max=str(16 * G))]
    pods = [held_pod()]
    pods[0]["metadata"]["uid"] = "uid-held"
    report = build_report(nodes, pods, placeable=True)
    data = report_json(report)
    assert data["placeable"] == {
        "nodes": {"node-a": {"quarter-card": 6, "half-card": 3, "one-card": 1, "two-cards": 0}},
        "total": {"quarter-card": 6, "half-card": 3, "one-card": 1, "two-cards": 0},
    }
    table = render_table(report)
    assert "PLACEABLE  quarter-card  half-card  one-card  two-cards" in table
    assert re.search(r"^node-a\s+6\s+3\s+1\s+0$", table, re.M)
    assert "placeable" not in report_json(build_report(nodes, pods))


# ---------------------------------------------------------------- a real gas process


@pytest.fixture
def start_policy_gas(
    start_gas: Callable[..., GasProcess], kubeconfig: str, tls_files: TLSFiles
) -> Callable[[str], GasProcess]:
    def start(policy: str) -> GasProcess:
        process = start_gas(["--kubeConfig", kubeconfig, "--policy", policy], tls=tls_files)
        process.wait_ready()
        return process

    return start


def two_nodes_one_busy(apiserver: ApiServerDouble) -> None:
    for name in ("node-a", "node-b"):
        apiserver.add_node(gpu_node(name, "0.1", i915="8", memory_max=str(16 * G)))
    apiserver.add_pod(held_pod())


def test_prioritize_wire_format_in_both_modes(
    start_policy_gas: Callable[[str], GasProcess], apiserver: ApiServerDouble
) -> None:
    two_nodes_one_busy(apiserver)
    gas = start_policy_gas("binpack")
    wait_for_nodes(gas, "node-a", "node-b")
    wait_for_held(gas)
    new = apiserver.add_pod(gpu_pod("new", container(i915="1", memory_max=str(2 * G))))
    response = gas.post(
        "/scheduler/prioritize", {"Pod": new, "NodeNames": ["node-b", "node-a", "ghost"]}
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    # In the order given, the unknown node left out (it scores 0).
    assert [entry["Host"] for entry in response.json()] == ["node-b", "node-a"]
    # node-a after: memory 6G/16G, i915 2/8 -> 5/16 -> 3; node-b: 2/16, 1/8 -> 1.
    assert scores(response.json(), ["node-b", "node-a", "ghost"]) == {
        "node-a": 3,
        "node-b": 1,
        "ghost": 0,
    }
    # Full Node objects (nodeCacheCapable: false), lower-case keys accepted.
    items = [n for n in apiserver.list_nodes() if n["metadata"]["name"] in ("node-a", "node-b")]
    spread_pod = apiserver.add_pod(
        gpu_pod(
            "spready",
            container(i915="1", memory_max=str(2 * G)),
            annotations={"gas-policy": "spread"},
        )
    )
    reply = gas.post(
        "/scheduler/prioritize", {"pod": spread_pod, "nodes": {"items": items}, "NodeNames": None}
    ).json()
    assert scores(reply, ["node-a", "node-b"]) == {"node-a": 7, "node-b": 9}
    # A pod that fits nowhere scores 0; bad requests get 400 as filter does.
    huge = apiserver.add_pod(gpu_pod("huge", container(i915="1", memory_max=str(9 * G))))
    reply = gas.post("/scheduler/prioritize", {"Pod": huge, "NodeNames": ["node-a"]}).json()
    assert reply == []
    assert gas.post("/scheduler/prioritize", {"Pod": "x", "NodeNames": []}).status_code == 400
    assert gas.post("/scheduler/prioritize", {"Pod": new}).status_code == 400
    # A malformed gas-policy annotation: filter says why, prioritize answers 0s.
    bad = apiserver.add_pod(
        gpu_pod("bad", container(i915="1"), annotations={"gas-policy": "tightest"})
    )
    reply = gas.post("/scheduler/prioritize", {"Pod": bad, "NodeNames": ["node-a", "node-b"]})
    assert reply.status_code == 200 and reply.json() == []
    filtered = gas.post("/scheduler/filter", {"Pod": bad, "NodeNames": ["node-a"]}).json()
    assert filtered["NodeNames"] == []
    assert "gas-policy" in filtered["FailedAndUnresolvableNodes"]["node-a"]
    # Prioritize reserves nothing.
    assert ledger_of(gas)["pods"].keys() == {apiserver_uid(apiserver, "held")}
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_requests_total", verb="prioritize", outcome="fit") == 2
    assert metric(text, "gas_requests_total", verb="prioritize", outcome="no_fit") == 2
    assert metric(text, "gas_requests_total", verb="prioritize", outcome="bad_request") == 2
    # node-a: 6 quarter, 3 half, 1 one-card, 0 two-cards; node-b: 8, 4, 2, 1.
    assert metric(text, "gas_placeable_pods", size="quarter-card") == 14
    assert metric(text, "gas_placeable_pods", size="half-card") == 7
    assert metric(text, "gas_placeable_pods", size="one-card") == 3
    assert metric(text, "gas_placeable_pods", size="two-cards") == 1


def test_first_fit_prioritize_scores_every_node_0(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    two_nodes_one_busy(apiserver)
    wait_for_nodes(gas, "node-a", "node-b")
    new = apiserver.add_pod(gpu_pod("new", container(i915="1", memory_max=str(2 * G))))
    reply = gas.post("/scheduler/prioritize", {"Pod": new, "NodeNames": ["node-a", "node-b"]})
    assert reply.json() == []  # every node scores 0: none is listed
    # The annotation alone turns binpack on for this pod.
    packed = apiserver.add_pod(
        gpu_pod("packed", container(i915="1", memory_max=str(2 * G)), annotations=BIN)
    )
    wait_for_held(gas)
    reply = gas.post("/scheduler/prioritize", {"Pod": packed, "NodeNames": ["node-a", "node-b"]})
    assert scores(reply.json(), ["node-a", "node-b"]) == {"node-a": 3, "node-b": 1}


def test_a_binpack_pod_bound_without_a_prioritize_is_told_of(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    """A scheduler configured without gas's prioritize verb: the binpack pod's node is
    kube-scheduler's choice. The Event, the metric and the log say so; the bind stands."""
    two_nodes_one_busy(apiserver)
    wait_for_nodes(gas, "node-a", "node-b")
    names = ["node-a", "node-b"]
    heard = apiserver.add_pod(gpu_pod("heard", container(i915="1"), annotations=BIN))
    assert (
        gas.post("/scheduler/filter", {"Pod": heard, "NodeNames": names}).json()["NodeNames"]
        == names
    )
    gas.post("/scheduler/prioritize", {"Pod": heard, "NodeNames": names})
    assert gas.bind(heard, "node-a") == ""
    unheard = apiserver.add_pod(gpu_pod("unheard", container(i915="1"), annotations=BIN))
    assert (
        gas.post("/scheduler/filter", {"Pod": unheard, "NodeNames": names}).json()["NodeNames"]
        == names
    )
    assert gas.bind(unheard, "node-b") == ""

    def warned() -> list[dict[str, Any]]:
        return [e for e in apiserver.events if e["reason"] == "GPUPolicyNotScored"]

    wait_for(warned, what="the GPUPolicyNotScored Event")
    (event,) = warned()
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "unheard"
    assert "binpack" in event["message"] and "node-b" in event["message"]
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_unscored_binds_total", policy="binpack") == 1
    log = gas.log()
    assert "pod default/unheard: placement policy binpack chose the cards on node-b" in log
    assert "pod default/heard:" not in log


def apiserver_uid(apiserver: ApiServerDouble, name: str) -> str:
    found = apiserver.get_pod("default", name)
    assert found is not None
    uid: str = found["metadata"]["uid"]
    return uid


def wait_for_held(gas: GasProcess) -> None:
    wait_for(lambda: ledger_of(gas)["usage"], what="held pod in the ledger")


# ---------------------------------------------------------------- the emulator end to end


@pytest.mark.parametrize(
    ("flag", "annotations", "big_fits"),
    [
        ("binpack", None, True),
        ("spread", None, False),
        ("spread", BIN, True),  # the annotation wins over the flag
    ],
)
def test_binpack_keeps_a_whole_node_free_for_a_big_pod(
    start_policy_gas: Callable[[str], GasProcess],
    apiserver: ApiServerDouble,
    emulators: Callable[[GasProcess], SchedulerEmulator],
    flag: str,
    annotations: dict[str, str] | None,
    big_fits: bool,
) -> None:
    for name in ("node-a", "node-b"):
        apiserver.add_node(gpu_node(name, "0.1", i915="8", memory_max=str(16 * G)))
    gas = start_policy_gas(flag)
    wait_for_nodes(gas, "node-a", "node-b")
    scheduler = emulators(gas)
    for index in range(4):
        half = gpu_pod(
            f"half-{index}", container(i915="1", memory_max=str(4 * G)), annotations=annotations
        )
        apiserver.add_pod(half)
        assert scheduler.schedule_now("default", f"half-{index}").bound
    placed = {
        found["spec"]["nodeName"]
        for found in apiserver.list_pods()
        if found["metadata"]["name"].startswith("half-")
    }
    assert len(placed) == (1 if big_fits else 2)
    apiserver.add_pod(gpu_pod("big", container(i915="2", memory_max=str(16 * G))))
    assert scheduler.schedule_now("default", "big").bound is big_fits
