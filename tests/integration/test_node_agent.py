"""`gas node` as a process against the kubelet double (real gRPC on unix sockets) and the
API-server double: registration, the device list and its health, what each container is
given, refusals and their reports, kubelet and agent restarts."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard, add_card, remove_card
from tests.support.kubelet import Admission, response_cards
from tests.support.nodeproc import NodeRig
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for

I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"


@pytest.fixture
def rigs(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> Iterator[Callable[..., NodeRig]]:
    made: list[NodeRig] = []

    def make(node: str, cards: list[FakeCard], **options: Any) -> NodeRig:
        if apiserver.get_node(node) is None:
            numbers = ".".join(str(c.number) for c in cards)
            apiserver.add_node(gpu_node(node, numbers))
        rig = NodeRig(apiserver, kubeconfig, node, cards, tmp_path, **options)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def annotated(name: str, *containers: dict[str, Any], node: str, **notes: str) -> dict[str, Any]:
    annotations = {f"gas-container-{k}": v for k, v in notes.items()}
    return gpu_pod(name, *containers, node=node, annotations=annotations)


def given(admission: Admission) -> dict[str, tuple[tuple[str, ...], dict[str, str]]]:
    """Container -> (cards whose device nodes it got, its envs)."""
    return {
        name: (response_cards(response), dict(response.envs))
        for name, by_resource in admission.responses.items()
        for response in by_resource.values()
    }


def pod(apiserver: ApiServerDouble, name: str) -> dict[str, Any]:
    found = apiserver.get_pod("default", name)
    assert found is not None, name
    return found


def node_cards(apiserver: ApiServerDouble, name: str) -> str | None:
    value = pod(apiserver, name)["metadata"].get("annotations", {}).get("gas-node-cards")
    return value if isinstance(value, str) else None


def events(apiserver: ApiServerDouble, reason: str) -> list[dict[str, Any]]:
    return [e for e in apiserver.events if e.get("reason") == reason]


def test_registers_and_lists_shares_with_numa_and_health(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    cards = [FakeCard(0, numa=1), FakeCard(1, driver="xe", numa=-1), FakeCard(2)]
    rig = rigs("n1", cards, run=False, extra=["-shared-dev-num", "3"])
    rig.wait_registered(shares=3)
    assert sorted(rig.kubelet.registrations) == [(I915, "gas-i915.sock"), (XE, "gas-xe.sock")]
    assert sorted(rig.kubelet.devices(I915)) == [f"card{c}-{s}" for c in (0, 2) for s in range(3)]
    assert sorted(rig.kubelet.devices(XE)) == ["card1-0", "card1-1", "card1-2"]
    node = wait_for(
        lambda: (
            (apiserver.get_node("n1") or {}).get("status", {}).get("allocatable", {}).get(I915)
            == "6"
            and apiserver.get_node("n1")
        ),
        what="i915 allocatable from the kubelet",
    )
    assert node["status"]["allocatable"][XE] == "3"

    remove_card(rig.sysfs, cards[2])
    wait_for(
        lambda: (
            rig.kubelet.devices(I915)
            == {**{f"card0-{s}": True for s in range(3)}, **{f"card2-{s}": False for s in range(3)}}
        ),
        what="card2 unhealthy",
    )
    add_card(rig.sysfs, cards[2])
    wait_for(lambda: all(rig.kubelet.devices(I915).values()), what="card2 healthy again")


def test_each_container_gets_gas_cards_and_tiles(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    rig = rigs("n1", [FakeCard(0), FakeCard(1, tiles=2), FakeCard(2, tiles=2)], run=False)
    rig.wait_registered()
    apiserver.add_pod(
        annotated(
            "multi",
            container("a", i915="1", tiles="1"),
            container("sidecar"),
            container("b", i915="2", tiles="2"),
            node="n1",
            cards="card2||card1,card0",
            tiles="card2:gt1||card1:gt0,card0:gt0",
        )
    )
    (result,) = rig.kubelet.sync()
    assert result.error == ""
    assert given(result) == {
        "a": (("card2",), {"ZE_AFFINITY_MASK": "1"}),
        # card0 has one tile, card1 two: FLAT numbering counts card0's tile first
        "b": (("card0", "card1"), {"ZE_AFFINITY_MASK": "0,1"}),
    }
    devices = [d.host_path for d in result.responses["a"][I915].devices]
    assert devices == [str(rig.devfs / "dri/card2"), str(rig.devfs / "dri/renderD130")]
    assert rig.kubelet.allocated(result.uid) == {
        "a": {I915: ["card2-0"]},
        "b": {I915: ["card0-0", "card1-0"]},
    }
    wait_for(lambda: node_cards(apiserver, "multi") == "card2||card0,card1", what="gas-node-cards")


def test_a_pod_gas_did_not_place_gets_the_kubelets_choice_and_is_reported(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    rig = rigs("n1", [FakeCard(0)], run=False)
    rig.wait_registered()
    apiserver.add_pod(gpu_pod("plain", container("c", i915="1"), node="n1"))
    (result,) = rig.kubelet.sync()
    assert result.error == "" and given(result)["c"][0] == ("card0",)
    wait_for(lambda: events(apiserver, "GasPodUnmanaged"), what="GasPodUnmanaged event")
    (event,) = events(apiserver, "GasPodUnmanaged")
    assert event["involvedObject"]["name"] == "plain" and event["type"] == "Warning"


def test_cards_gas_chose_but_the_node_cannot_give_are_refused_and_reported(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    cards = [FakeCard(0), FakeCard(1)]
    rig = rigs("n1", cards, run=False)
    rig.wait_registered()
    remove_card(rig.sysfs, cards[1])
    wait_for(lambda: not rig.kubelet.devices(I915)["card1-0"], what="card1 unhealthy")
    apiserver.add_pod(annotated("gone", container("c", i915="1"), node="n1", cards="card1"))
    apiserver.add_pod(annotated("bad", container("c", i915="1"), node="n1", cards="card0|card0"))
    results = {r.name: r for r in rig.kubelet.sync()}
    assert "card1" in results["gone"].error and "FAILED_PRECONDITION" in results["gone"].error
    assert "segments" in results["bad"].error
    assert rig.kubelet.allocated(results["gone"].uid) == {}
    wait_for(lambda: len(events(apiserver, "GasAllocationMismatch")) == 2, what="two events")
    assert {e["involvedObject"]["name"] for e in events(apiserver, "GasAllocationMismatch")} == {
        "gone",
        "bad",
    }
    assert pod(apiserver, "gone")["status"]["phase"] == "Failed"


def test_pods_reaching_the_kubelet_together_each_get_their_own_cards(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    rig = rigs("n1", [FakeCard(i) for i in range(4)], run=False, seed=3)
    rig.wait_registered()
    # created in one order, given cards in another: each pod must get its own
    for index, number in enumerate((3, 1, 0, 2, 1, 3)):
        apiserver.add_pod(
            annotated(f"p{index}", container("c", i915="1"), node="n1", cards=f"card{number}")
        )
    results = rig.kubelet.sync()
    assert len(results) == 6 and not [r.error for r in results if r.error]
    for result in results:
        wanted = pod(apiserver, result.name)["metadata"]["annotations"]
        assert given(result)["c"][0] == (wanted["gas-container-cards"],)


def test_registers_again_after_a_kubelet_restart(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    rig = rigs("n1", [FakeCard(0), FakeCard(1)], run=False)
    rig.wait_registered()
    apiserver.add_pod(annotated("before", container("c", i915="1"), node="n1", cards="card1"))
    (before,) = rig.kubelet.sync()
    rig.kubelet.restart()
    assert rig.kubelet.devices(I915) == {}
    rig.wait_registered()
    assert len(rig.kubelet.registrations) == 2
    apiserver.add_pod(annotated("after", container("c", i915="1"), node="n1", cards="card0"))
    (after,) = rig.kubelet.sync()
    assert (before.error, after.error) == ("", "")
    assert given(after)["c"][0] == ("card0",)


def test_an_agent_restart_loses_nothing(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    rig = rigs("n1", [FakeCard(0), FakeCard(1)], run=False)
    rig.wait_registered()
    apiserver.add_pod(
        annotated(
            "two",
            container("a", i915="1"),
            container("b", i915="1"),
            node="n1",
            cards="card1|card0",
        )
    )
    # the API server turns the gas-node-cards patches away until the agent is killed
    refusing = apiserver.faults.add("PATCH", r"/pods/two$", ("status", 503), times=None)
    (first,) = rig.kubelet.sync()
    assert first.error == ""
    wait_for(lambda: refusing.hits > 0, what="a gas-node-cards write turned away")
    registered = len(rig.kubelet.registrations)
    assert rig.agent.stop(signal.SIGKILL) == -signal.SIGKILL
    assert node_cards(apiserver, "two") is None  # lost with the agent
    apiserver.faults.clear()
    rig.agent.start()
    # The killed agent's endpoint may still look connected until its stream's end is
    # seen: wait for the new agent's own registration, not just a connected plugin.
    wait_for(lambda: len(rig.kubelet.registrations) > registered, what="a new registration")
    rig.wait_registered()
    apiserver.add_pod(annotated("next", container("c", i915="1"), node="n1", cards="card1"))
    (result,) = rig.kubelet.sync()
    assert result.error == "" and given(result)["c"][0] == ("card1",)
    # made good from what the kubelet says the containers hold
    wait_for(lambda: node_cards(apiserver, "two") == "card1|card0", what="gas-node-cards")
    wait_for(lambda: node_cards(apiserver, "next") == "card1", what="the next pod's")


def _created(pod_obj: dict[str, Any], second: int) -> dict[str, Any]:
    pod_obj["metadata"]["creationTimestamp"] = f"2025-01-01T00:00:{second:02d}Z"
    return pod_obj


@pytest.mark.parametrize("before_container", [0, 1])
def test_a_pod_the_kubelet_refused_for_other_reasons_never_lends_its_cards(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig], before_container: int
) -> None:
    """The kubelet refuses an older pod (eviction before its devices, or the CPU manager
    between its containers) and writes Failed late: the pod after it in the batch gets its
    own cards, never the refused pod's (first listed together, the two are read again until
    the Failed status arrives; listed apart, the later one is the pod being admitted)."""
    rig = rigs("n1", [FakeCard(i) for i in range(4)], run=False, status_lag=0.5)
    rig.wait_registered()
    apiserver.add_pod(
        _created(
            annotated(
                "older",
                container("a", i915="1"),
                container("b", i915="1"),
                node="n1",
                cards="card2|card0",
            ),
            1,
        )
    )
    apiserver.add_pod(
        _created(annotated("newer", container("c", i915="1"), node="n1", cards="card1"), 2)
    )
    rig.kubelet.reject("older", "OutOfcpu", before_container=before_container)
    older, newer = rig.kubelet.sync()
    assert (older.name, older.reason) == ("older", "OutOfcpu")
    assert newer.name == "newer"
    assert newer.error == "", newer.error
    assert given(newer)["c"][0] == ("card1",)
    # refused before its devices, the older pod was first listed with the newer one
    assert ("reading this node's pods again" in rig.agent.log()) == (before_container == 0)


def test_registers_again_when_the_kubelet_drops_its_stream(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    """A 1.28 kubelet may disconnect a plugin's fresh client when an older stream ends (its
    runClient disconnects whichever client is registered): the devices turn unhealthy and
    nothing else tells the plugin. It must notice the lost stream and register again."""
    rig = rigs("n1", [FakeCard(0)], run=False)
    rig.wait_registered()
    rig.kubelet.drop_stream(I915)
    wait_for(lambda: rig.kubelet.disconnects == [I915], what="the kubelet's disconnect")
    assert not any(rig.kubelet.devices(I915).values())
    rig.wait_registered(timeout=20)
    assert len(rig.kubelet.registrations) == 2
    apiserver.add_pod(annotated("p", container("c", i915="1"), node="n1", cards="card0"))
    (result,) = rig.kubelet.sync()
    assert result.error == "" and given(result)["c"][0] == ("card0",)


def test_init_containers_with_gpus(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    """The kubelet allocates init containers first and lets the app containers reuse their
    devices. gas never places them (it refuses such pods), so a pod gas did not place gets
    the kubelet's choice for both, and a pod with gas annotations is refused."""
    rig = rigs("n1", [FakeCard(0), FakeCard(1)], run=False)
    rig.wait_registered()
    plain = gpu_pod("plain", container("side"), container("app", i915="2"), node="n1")
    plain["spec"]["initContainers"] = [container("warm", i915="1")]
    apiserver.add_pod(plain)
    (result,) = rig.kubelet.sync()
    assert result.error == ""
    held = rig.kubelet.allocated(result.uid)
    # the app container reuses the init container's device and gets one more
    assert len(held["app"][I915]) == 2 and set(held["warm"][I915]) < set(held["app"][I915])
    assert result.preferred_calls == 2  # the second with the reused device as must-include
    wait_for(lambda: len(events(apiserver, "GasPodUnmanaged")) == 2, what="both reported")
    placed = annotated("placed", container("app", i915="1"), node="n1", cards="card1")
    placed["spec"]["initContainers"] = [container("warm", i915="1")]
    apiserver.add_pod(placed)
    (result,) = rig.kubelet.sync()
    assert "init container 'warm'" in result.error
    wait_for(lambda: events(apiserver, "GasAllocationMismatch"), what="the refusal's Event")
