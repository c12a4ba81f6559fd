"""The over-use state (gas.host.overuse) under an injected clock: a container over its
share is reported once it has been over for the grace period, once per episode; with
`evict`, only while its card is contended, the pod most over its share first; never a pod
within its share, one without a gas share on the card, or anything on partial data."""

from __future__ import annotations

from typing import Any

import pytest

from gas.host.containers import container_ids, holders
from gas.host.overuse import EVICT, REPORT, CardState, Observation, OverUse

GIB = 1024**3


def seen(
    pod: str, used: int | None, share: int | None, card: str = "card0", container: str = "app"
) -> Observation:
    return Observation(card, f"uid-{pod}", f"{pod}-{container}", "ns", pod, container, used, share)


def cards(used: int | None, capacity: int = 16 * GIB, card: str = "card0") -> list[CardState]:
    return [CardState(card, capacity, used)]


def test_over_is_reported_after_the_grace_and_once_per_episode() -> None:
    state = OverUse(grace=30)
    over = seen("a", 12 * GIB, 4 * GIB)
    assert state.step(0, [over], cards(12 * GIB)).exceeding == []
    assert state.step(29, [over], cards(12 * GIB)).exceeding == []
    (first,) = state.step(30, [over], cards(12 * GIB)).exceeding
    assert first.since == 0
    assert first.describe(30) == (
        "container app uses 12Gi of card0's memory, over its share of 4.0Gi for 30s"
    )
    assert state.step(60, [over], cards(12 * GIB)).exceeding == []  # said already
    # Back within its share: the episode ends, and a new one starts the grace again.
    back = state.step(70, [seen("a", 3 * GIB, 4 * GIB)], cards(3 * GIB))
    assert [o.pod for o in back.ended] == ["a"]
    assert state.step(80, [over], cards(12 * GIB)).exceeding == []
    assert len(state.step(110, [over], cards(12 * GIB)).exceeding) == 1


def test_a_container_gone_ends_its_episode_quietly() -> None:
    state = OverUse(grace=0)
    state.step(0, [seen("a", 5 * GIB, 4 * GIB)], cards(5 * GIB))
    gone = state.step(10, [], cards(0))
    assert gone.ended == [] and state.since == {} and state.said == set()


@pytest.mark.parametrize(
    "observation",
    [
        seen("a", 4 * GIB, 4 * GIB),  # exactly its share
        seen("a", 12 * GIB, None),  # no gas share on the card
        seen("a", None, 4 * GIB),  # its use not read whole
    ],
    ids=["within", "no-share", "partial"],
)
def test_never_reported_nor_evicted(observation: Observation) -> None:
    state = OverUse(grace=0, policy=EVICT)
    for now in (0, 10, 20):
        result = state.step(now, [observation], cards(32 * GIB))
        assert result.exceeding == [] and result.evictions == []


def test_evict_only_while_the_card_is_contended_the_most_over_pod_first() -> None:
    state = OverUse(grace=10, policy=EVICT)
    a = seen("a", 9 * GIB, 4 * GIB)  # 5 GiB over
    b = seen("b", 6 * GIB, 4 * GIB)  # 2 GiB over
    c = seen("c", 2 * GIB, 4 * GIB)  # within
    state.step(0, [a, b, c], cards(17 * GIB))
    # Over the grace, but the card has room: reported, not evicted.
    calm = state.step(10, [a, b, c], cards(15 * GIB))
    assert sorted(e.observation.pod for e in calm.exceeding) == ["a", "b"]
    assert calm.evictions == []
    # Contended: a, the most over, goes; b waits for the next round's look.
    (eviction,) = state.step(20, [a, b, c], cards(17 * GIB)).evictions
    assert (eviction.pod, eviction.pod_uid, eviction.card) == ("a", "uid-a", "card0")
    assert "card0 is contended (17Gi held of 16Gi)" in eviction.reason
    assert "most over its share there, by 5.0Gi" in eviction.reason
    # a is not asked again while its eviction is under way; b is next if still contended.
    (next_one,) = state.step(21, [a, b, c], cards(17 * GIB)).evictions
    assert next_one.pod == "b"


def test_a_card_whose_clients_are_not_all_read_is_not_contended() -> None:
    state = OverUse(grace=0, policy=EVICT)
    over = seen("a", 20 * GIB, 4 * GIB)
    state.step(0, [over], cards(None))
    assert state.step(1, [over], cards(None)).evictions == []


def test_report_never_evicts() -> None:
    state = OverUse(grace=0, policy=REPORT)
    over = seen("a", 20 * GIB, 4 * GIB)
    state.step(0, [over], cards(20 * GIB))
    assert state.step(1, [over], cards(20 * GIB)).evictions == []


def test_a_pods_containers_over_on_one_card_add_up() -> None:
    state = OverUse(grace=0, policy=EVICT)
    small = [seen("a", 5 * GIB, 4 * GIB, container=f"c{i}") for i in range(3)]  # 3 GiB in all
    big = seen("b", 6 * GIB, 4 * GIB)  # 2 GiB
    state.step(0, [*small, big], cards(21 * GIB))
    (eviction,) = state.step(1, [*small, big], cards(21 * GIB)).evictions
    assert eviction.pod == "a"


def test_holders_name_containers_by_runtime_id_with_the_extender_share() -> None:
    pod: dict[str, Any] = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "annotations": {"gas-container-cards": "card0,card1|"},
        },
        "spec": {
            "containers": [
                {
                    "name": "gpu",
                    "resources": {
                        "limits": {
                            "gpu.intel.com/i915": "2",
                            "gpu.intel.com/memory.max": "8Gi",
                            "gpu.intel.com/millicores": "300",
                        }
                    },
                },
                {"name": "side"},
            ]
        },
        "status": {
            "containerStatuses": [
                {"name": "gpu", "containerID": "containerd://" + "a" * 64},
                {"name": "side", "containerID": "cri-o://" + "b" * 64},
                {"name": "waiting"},
            ]
        },
    }
    assert container_ids(pod) == {"a" * 64: "gpu", "b" * 64: "side"}
    found = holders(pod, extender=True)
    gpu = found["a" * 64]
    assert (gpu.namespace, gpu.pod, gpu.pod_uid, gpu.container) == ("ns", "p", "u-1", "gpu")
    assert gpu.shares is not None
    assert {card: (s.memory, s.millicores) for card, s in gpu.shares.items()} == {
        "card0": (4 * GIB, 150),
        "card1": (4 * GIB, 150),
    }
    assert found["b" * 64].shares == {}
    # The DRA way: the share is the container's own environment's, not the pod's.
    assert holders(pod, extender=False)["a" * 64].shares is None
    # Unreadable annotations: no share, never judged.
    broken = {**pod, "metadata": {**pod["metadata"], "annotations": {"gas-container-cards": "x"}}}
    assert holders(broken, extender=True)["a" * 64].shares == {}
