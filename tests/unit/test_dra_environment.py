"""What each prepared device tells its containers (gas.dra.environment), and which
containers see which claims (gas.dra.consumers): one mask per container whatever its
claims, counted over every card it sees; the share variables of each card; nothing for an
administrator's access; and a refusal, naming the containers, where no mask is right."""

from __future__ import annotations

from typing import Any

import pytest

from gas.core.shares import Share, read_shares, share_environment
from gas.dra.consumers import ClaimUse, Consumer, consumers
from gas.dra.environment import AFFINITY, Carried, Held, mask_of, plan

GIB = 1024**3
TWO = {"card0": 2, "card1": 2, "card2": 2}


def held(claim: str, card: str, tiles: tuple[int, ...] = (), **kw: Any) -> Held:
    return Held(f"ns/{claim}", kw.pop("request", "gpu"), card, tiles, **kw)


def container(name: str, *claims: str, pod: str = "p") -> Consumer:
    return Consumer("ns", pod, name, tuple(ClaimUse(f"ns/{c}") for c in claims))


# ------------------------------------------------------------------------------- the mask


def test_no_mask_while_every_card_seen_is_whole() -> None:
    assert mask_of([held("a", "card0")], TWO) is None
    assert mask_of([held("a", "card0", (0, 1))], TWO) is None
    assert mask_of([held("a", "card0", (0,)), held("b", "card0", (1,))], TWO) is None
    assert mask_of([held("a", "card0", (0,)), held("b", "card0")], TWO) is None
    assert mask_of([held("a", "card0", (0,), admin=True)], TWO) is None
    assert mask_of([held("a", "card0", (0,))], {"card0": 1}) is None


def test_the_mask_counts_every_card_seen_in_number_order() -> None:
    assert mask_of([held("a", "card0", (1,))], TWO) == "1"
    # A tile of card1, the whole of card0 before it: 0,1 then 2+1.
    assert mask_of([held("a", "card1", (1,)), held("b", "card0")], TWO) == "0,1,3"
    # The container: one tile of card0 and the whole of card1.
    assert mask_of([held("t", "card0", (0,)), held("w", "card1")], TWO) == "0,2,3"
    assert mask_of([held("t", "card0", (1,)), held("w", "card1")], TWO) == "1,2,3"
    assert mask_of([held("a", "card10", (0,)), held("b", "card2")], {"card10": 2, "card2": 2}) == (
        "0,1,2"
    )


# ------------------------------------------------------------------------------ the plan


def test_one_container_with_a_tile_claim_and_a_whole_card_claim_gets_one_mask() -> None:
    tile = held("t", "card0", (0,), share=Share(GIB, 100, 1))
    whole = held("w", "card1", share=Share(2 * GIB, 200, 0))
    result = plan([tile, whole], [], [container("app", "t", "w")], TWO)
    assert result.errors == {}
    assert result.environment[("ns/t", "card0")] == {
        AFFINITY: "0,2,3",
        "GAS_CARD0_MEMORY_BYTES": str(GIB),
        "GAS_CARD0_MILLICORES": "100",
        "GAS_CARD0_TILES": "1",
    }
    # The whole card's device carries its share, and no mask: one mask in the container.
    assert result.environment[("ns/w", "card1")] == {
        "GAS_CARD1_MEMORY_BYTES": str(2 * GIB),
        "GAS_CARD1_MILLICORES": "200",
    }


def test_a_whole_card_claim_shared_with_a_container_of_another_view_stays_maskless() -> None:
    tile = held("t", "card0", (0,))
    whole = held("w", "card1")
    both, alone = container("both", "t", "w"), container("alone", "w")
    result = plan([tile, whole], [], [both, alone], TWO)
    assert result.errors == {}
    assert AFFINITY not in result.environment[("ns/w", "card1")]
    assert result.environment[("ns/t", "card0")][AFFINITY] == "0,2,3"


def test_a_tile_claim_seen_by_containers_of_different_views_is_refused() -> None:
    tile = held("t", "card0", (0,))
    whole = held("w", "card1")
    result = plan([tile, whole], [], [container("a", "t"), container("b", "t", "w")], TWO)
    assert "ns/t" in result.errors
    message = result.errors["ns/t"]
    assert "container a of pod ns/p (ZE_AFFINITY_MASK=0)" in message
    assert "container b of pod ns/p (ZE_AFFINITY_MASK=0,2,3)" in message
    assert ("ns/t", "card0") not in result.environment


def test_a_claim_prepared_earlier_that_fixed_another_mask_is_named() -> None:
    earlier = Carried((held("t", "card0", (0,)),), {AFFINITY: "0"})
    whole = held("w", "card1")
    result = plan([whole], [earlier], [container("app", "t", "w")], TWO)
    assert "ns/w" in result.errors
    assert "needs ZE_AFFINITY_MASK=0,2,3" in result.errors["ns/w"]
    assert "give it 0" in result.errors["ns/w"]
    # The same claim, earlier prepared with the right mask: fine.
    right = Carried((held("t", "card0", (0,)),), {AFFINITY: "0,2,3"})
    assert plan([whole], [right], [container("app", "t", "w")], TWO).errors == {}


def test_an_administrators_access_gets_device_nodes_only_and_counts_whole() -> None:
    admin = held("m", "card0", admin=True, share=Share(GIB, 100, 0))
    tile = held("t", "card1", (1,), share=Share(GIB, 100, 1))
    result = plan([admin, tile], [], [container("app", "m", "t")], TWO)
    assert result.environment[("ns/m", "card0")] == {}
    assert result.environment[("ns/t", "card1")][AFFINITY] == "0,1,3"
    monitor = plan([admin], [], [container("exporter", "m")], TWO)
    assert monitor.environment[("ns/m", "card0")] == {}


def test_shares_are_summed_per_card_and_left_out_where_containers_differ() -> None:
    a = held("a", "card0", share=Share(GIB, 100, 0))
    b = held("b", "card0", share=Share(2 * GIB, 300, 0))
    one = plan([a, b], [], [container("app", "a", "b")], TWO)
    assert read_shares(one.environment[("ns/a", "card0")]) == {"card0": Share(3 * GIB, 400, 0)}
    assert one.environment[("ns/a", "card0")] == one.environment[("ns/b", "card0")]
    # Containers seeing claim a hold different shares of card0: a carries none, and it is
    # said why.
    two = plan([a, b], [], [container("x", "a"), container("y", "a", "b")], TWO)
    assert two.errors == {}
    assert two.environment[("ns/a", "card0")] == {}
    assert any("claim ns/a: no share variables for card0" in w for w in two.warnings)


def test_a_device_no_known_container_sees_is_planned_as_its_claim_alone() -> None:
    tile = held("t", "card1", (1,), share=Share(GIB, 50, 1))
    other = held("t", "card0", request="other")
    result = plan([tile, other], [], [], TWO)
    assert result.environment[("ns/t", "card1")][AFFINITY] == "0,1,3"
    assert result.environment[("ns/t", "card1")]["GAS_CARD1_MILLICORES"] == "50"


def test_a_container_naming_one_request_sees_that_request_alone() -> None:
    first = held("c", "card0", (0,), request="first")
    second = held("c", "card1", request="second")
    only_first = Consumer("ns", "p", "app", (ClaimUse("ns/c", "first"),))
    result = plan([first, second], [], [only_first], TWO)
    assert result.environment[("ns/c", "card0")][AFFINITY] == "0"


def test_share_variable_names_are_one_set_per_card() -> None:
    assert share_environment("card12", Share(5, 6, 0)) == {
        "GAS_CARD12_MEMORY_BYTES": "5",
        "GAS_CARD12_MILLICORES": "6",
    }
    assert read_shares({"GAS_CARD1_TILES": "2", "GAS_CARD1_MEMORY_BYTES": "x", "PATH": "/"}) == {
        "card1": Share(0, 0, 2)
    }
    with pytest.raises(ValueError):
        share_environment("gpu0", Share())


# -------------------------------------------------------------------------- the consumers


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "resourceClaims": [
                {"name": "direct", "resourceClaimName": "shared-claim"},
                {"name": "templated", "resourceClaimTemplateName": "tmpl"},
                {"name": "pending", "resourceClaimTemplateName": "tmpl"},
            ],
            "initContainers": [
                {"name": "init", "resources": {"claims": [{"name": "direct"}]}},
            ],
            "containers": [
                {
                    "name": "app",
                    "resources": {
                        "claims": [
                            {"name": "direct", "request": "gpu"},
                            {"name": "templated"},
                            {"name": "pending"},
                        ]
                    },
                },
                {"name": "plain", "resources": {}},
                {"name": "mapped"},
            ],
        },
        "status": status,
    }


def test_consumers_follow_pod_claims_templates_and_the_extended_resource_mapping() -> None:
    pod = _pod(
        resourceClaimStatuses=[
            {"name": "templated", "resourceClaimName": "p-templated-x1"},
            {"name": "pending"},
        ],
        extendedResourceClaimStatus={
            "resourceClaimName": "p-extended-resources-q",
            "requestMappings": [
                {
                    "containerName": "mapped",
                    "resourceName": "gpu.intel.com/i915",
                    "requestName": "container-2-request-0",
                }
            ],
        },
    )
    found = {c.container: c.uses for c in consumers(pod)}
    assert found == {
        "init": (ClaimUse("ns/shared-claim"),),
        "app": (ClaimUse("ns/shared-claim", "gpu"), ClaimUse("ns/p-templated-x1")),
        "mapped": (ClaimUse("ns/p-extended-resources-q", "container-2-request-0"),),
    }
    app = next(c for c in consumers(pod) if c.container == "app")
    assert app.sees("ns/shared-claim", "gpu") and not app.sees("ns/shared-claim", "other")
    assert app.sees("ns/p-templated-x1", "anything")
    assert not app.sees("other/p-templated-x1", "anything")
