"""The DRA nodes' cards for `gas inspect`, computed from ResourceSlices and allocated
ResourceClaims alone (`gas.tools.inspector.dra`): capacity, the sum of `consumedCapacity`
per card, what is free, the claims and pods on each, and the problems."""

from __future__ import annotations

from typing import Any

from gas.dra.driver import DRIVER
from gas.dra.slices import PciFacts, plain, resource_slice
from gas.host.cards import Card
from gas.tools.inspector.dra import dra_json, dra_report, over_committed, render_dra_table
from tests.support.objects import intel_cards

GI = 2**30
FLEX = PciFacts(device_id="0x56c0", pcie_root="pci0000:00")


def cards(count: int, memory: int = 16 * GI) -> list[Card]:
    return intel_cards(count, memory)


def node_slice(node: str, count: int, generation: int = 1, memory: int = 16 * GI) -> dict[str, Any]:
    made = cards(count, memory)
    return resource_slice(
        node, f"uid-{node}", plain(made, {c.name: FLEX for c in made}), generation
    )


def claim(
    name: str,
    results: list[tuple[str, str, dict[str, str]]],
    pods: tuple[str, ...] = (),
    namespace: str = "team",
    driver: str = DRIVER,
) -> dict[str, Any]:
    """A claim as kube-scheduler leaves it: each result (pool, card, consumedCapacity) with
    a shareID, reserved for `pods`."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": f"gpu{i}",
                            "driver": driver,
                            "pool": pool,
                            "device": device,
                            "shareID": f"share-{name}-{i}",
                            "consumedCapacity": consumed,
                        }
                        for i, (pool, device, consumed) in enumerate(results)
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods],
        },
    }


def test_consumed_is_the_sum_of_the_shares_on_each_card() -> None:
    slices = [node_slice("n1", 2), node_slice("n2", 1)]
    claims = [
        claim(
            "a", [("n1", "card0", {"memory": "4Gi", "millicores": "250", "tiles": "0"})], ("pa",)
        ),
        claim(
            "b", [("n1", "card0", {"memory": "8Gi", "millicores": "500", "tiles": "0"})], ("pb",)
        ),
        # Two cards of one claim: each card counts its own result.
        claim(
            "c",
            [
                ("n1", "card1", {"memory": "8Gi", "millicores": "500", "tiles": "0"}),
                ("n2", "card0", {"memory": "8Gi", "millicores": "500", "tiles": "0"}),
            ],
            ("pc1", "pc2"),
        ),
        claim("unallocated", []),
    ]
    report = dra_report(slices, claims)
    table = {(c.node, c.name): c for c in report.cards}
    assert list(table) == [("n1", "card0"), ("n1", "card1"), ("n2", "card0")]
    card0 = table[("n1", "card0")]
    assert card0.capacity == {"memory": 16 * GI, "millicores": 1000, "tiles": 1}
    assert card0.consumed == {"memory": 12 * GI, "millicores": 750, "tiles": 0}
    assert card0.free == {"memory": 4 * GI, "millicores": 250, "tiles": 1}
    assert card0.claims == ["team/a", "team/b"] and card0.pods == ["team/pa", "team/pb"]
    assert table[("n2", "card0")].pods == ["team/pc1", "team/pc2"]
    assert report.claims == 3 and report.problems == [] and over_committed(report) == []


def test_a_card_whose_shares_pass_its_capacity_is_flagged() -> None:
    slices = [node_slice("n1", 2)]
    claims = [
        claim("a", [("n1", "card1", {"memory": "10Gi", "millicores": "100", "tiles": "0"})]),
        claim("b", [("n1", "card1", {"memory": "8Gi", "millicores": "100", "tiles": "0"})]),
        claim("c", [("n1", "card0", {"memory": "16Gi", "millicores": "1000", "tiles": "1"})]),
    ]
    report = dra_report(slices, claims)
    (problem,) = report.problems
    assert (problem.kind, problem.node, problem.card) == ("over_capacity", "n1", "card1")
    assert problem.message == (
        "n1/card1: claims consume more than the card has (memory 18Gi of 16Gi): team/a, team/b"
    )
    assert over_committed(report) == [problem.message]
    over = {c.name: c.over_capacity for c in report.cards}
    # Filled exactly is full, not over.
    assert over == {"card0": [], "card1": ["memory"]}
    assert next(c for c in report.cards if c.name == "card1").free["memory"] == -2 * GI


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    # The driver rewrote the pool with a smaller card: the old slice is being replaced.
    slices = [node_slice("n1", 2, generation=1), node_slice("n1", 1, generation=2, memory=8 * GI)]
    slices[1]["metadata"]["name"] = "n1-other"
    claims = [claim("a", [("n1", "card0", {"memory": "12Gi", "millicores": "100", "tiles": "0"})])]
    report = dra_report(slices, claims)
    assert [(c.name, c.capacity["memory"]) for c in report.cards] == [("card0", 8 * GI)]
    assert [p.kind for p in report.problems] == ["over_capacity"]


def test_a_claim_on_a_card_no_slice_publishes_is_reported() -> None:
    claims = [claim("a", [("n1", "card7", {"memory": "4Gi", "millicores": "100"})], ("pa",))]
    report = dra_report([node_slice("n1", 1)], claims)
    card7 = next(c for c in report.cards if c.name == "card7")
    assert not card7.published and card7.capacity == {} and card7.pods == ["team/pa"]
    (problem,) = report.problems
    assert problem.kind == "unpublished" and problem.claim == "team/a"
    assert "no current slice of pool n1 publishes it" in problem.message


def test_other_drivers_and_other_nodes_are_left_out() -> None:
    other = node_slice("n1", 1)
    other["spec"]["driver"] = "gpu.intel.com"
    other["metadata"]["name"] = "n1-intel"
    slices = [other, node_slice("n1", 1), node_slice("n2", 1)]
    claims = [
        claim("intel", [("n1", "card0", {"memory": "16Gi"})], driver="gpu.intel.com"),
        claim("a", [("n2", "card0", {"memory": "4Gi", "millicores": "100", "tiles": "0"})]),
    ]
    report = dra_report(slices, claims)
    assert [(c.node, c.name, c.consumed["memory"]) for c in report.cards] == [
        ("n1", "card0", 0),
        ("n2", "card0", 4 * GI),
    ]
    only = dra_report(slices, claims, only_node="n1")
    assert [(c.node, c.name) for c in only.cards] == [("n1", "card0")] and only.claims == 0


def test_a_result_without_a_share_holds_the_whole_card() -> None:
    whole = claim("whole", [("n1", "card0", {})])
    del whole["status"]["allocation"]["devices"]["results"][0]["shareID"]
    report = dra_report([node_slice("n1", 1)], [whole])
    (card,) = report.cards
    assert card.free == {"memory": 0, "millicores": 0, "tiles": 0}


def test_unreadable_amounts_are_problems_not_crashes() -> None:
    broken = node_slice("n1", 1)
    broken["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    bad = claim("a", [("n1", "card0", {"memory": "1.5.Gi"})])
    report = dra_report([broken], [bad, {"metadata": None, "status": "garbage"}])
    assert [p.kind for p in report.problems] == ["unreadable", "unreadable"]


def test_table_and_json() -> None:
    slices = [node_slice("n1", 2)]
    claims = [
        claim(
            "a", [("n1", "card0", {"memory": "4Gi", "millicores": "250", "tiles": "0"})], ("pa",)
        ),
        claim("b", [("n1", "card0", {"memory": "2Gi", "millicores": "100", "tiles": "0"})]),
    ]
    report = dra_report(slices, claims)
    assert render_dra_table(report) == [
        "DRA NODE  CARD   STATUS  memory used/cap  millicores used/cap  tiles used/cap  "
        "memory free  millicores free  tiles free  CLAIMS (PODS)",
        "n1        card0  ok      6Gi/16Gi         350/1000             0/1             "
        "10Gi         650              1           team/a (team/pa), team/b (no pod)",
        "n1        card1  ok      0/16Gi           0/1000               0/1             "
        "16Gi         1000             1",
        f"DRA total: 1 node(s), 2 card(s) of {DRIVER}, 2 claim(s)",
    ]
    assert render_dra_table(dra_report([], [])) == []
    data = dra_json(report)
    first = data["cards"][0]
    assert first["consumed"] == {"memory": 6 * GI, "millicores": 350, "tiles": 0}
    assert first["free"]["memory"] == 10 * GI and first["over_capacity"] == []
    assert [c["claim"] for c in first["claims"]] == ["team/a", "team/b"]
    assert first["claims"][0] == {
        "claim": "team/a",
        "request": "gpu0",
        "pods": ["team/pa"],
        "share_id": "share-a-0",
        "consumed": {"memory": 4 * GI, "millicores": 250, "tiles": 0},
        "admin": False,
    }
    assert first["shareable"] is True and first["taints"] == []


def test_an_administrators_access_is_shown_but_left_out_of_the_books() -> None:
    shared = claim("share", [("n1", "card0", {"memory": "4Gi", "millicores": "250"})], ("app",))
    monitor = claim("monitor", [("n1", "card0", {})], ("exporter",))
    result = monitor["status"]["allocation"]["devices"]["results"][0]
    result["adminAccess"] = True
    del result["shareID"]
    report = dra_report([node_slice("n1", 1)], [shared, monitor])
    (card,) = report.cards
    assert card.consumed == {"memory": 4 * GI, "millicores": 250, "tiles": 0}
    assert [(s.claim, s.admin) for s in card.shares] == [
        ("team/share", False),
        ("team/monitor", True),
    ]
    assert report.problems == []
    assert "team/monitor admin (team/exporter)" in render_dra_table(report)[1]


def test_taints_and_whole_cards_are_shown() -> None:
    published = node_slice("n1", 2)
    sick, whole = published["spec"]["devices"]
    sick["taints"] = [
        {"key": "gpu.gas.intel.com/unhealthy", "value": "Unbound", "effect": "NoExecute"}
    ]
    del whole["allowMultipleAllocations"]
    report = dra_report([published], [])
    lines = render_dra_table(report)
    assert " ok tainted Unbound:NoExecute " in lines[1]
    assert " ok whole " in lines[2]
    data = dra_json(report)
    assert data["cards"][0]["taints"] == ["Unbound:NoExecute"]
    assert data["cards"][1]["shareable"] is False
