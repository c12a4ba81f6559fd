"""`gas dra`'s ResourceSlice on the API-server double: written at start, owned by the
node, left alone (same generation) when nothing changed, written again when the kubelet
deleted it, rewritten with a new generation when a card goes, retried when the API server
fails, and the slices of other drivers and nodes never touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.dra.driver import DRIVER
from tests.support.apiserver import ApiServerDouble
from tests.support.draproc import DraRig, share
from tests.support.fakesysfs import GIB, FakeCard, remove_card
from tests.support.polling import wait_for

SLICES = r"^/apis/resource\.k8s\.io/v1/resourceslices"
NAME = f"n1-{DRIVER}"


@pytest.fixture
def make_rig(apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path) -> Iterator[Any]:
    rigs: list[DraRig] = []

    def make(cards: list[FakeCard], node: str = "n1", extra: tuple[str, ...] = ()) -> DraRig:
        rig = DraRig(apiserver, kubeconfig, node, cards, tmp_path, extra)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def the_slice(rig: DraRig) -> dict[str, Any]:
    found = wait_for(lambda: rig.slices(), timeout=20, what="the node's slice")
    assert len(found) == 1, found
    slice_: dict[str, Any] = found[0]
    return slice_


def generation(slice_: dict[str, Any]) -> int:
    value: int = slice_["spec"]["pool"]["generation"]
    return value


def test_published_at_start_owned_by_the_node(make_rig: Any, apiserver: ApiServerDouble) -> None:
    rig = make_rig([FakeCard(0), FakeCard(1, driver="xe", tiles=2, numa=1)]).start_registered()
    slice_ = the_slice(rig)
    node_uid = apiserver.get_node("n1")["metadata"]["uid"]  # type: ignore[index]
    assert slice_["metadata"]["name"] == NAME
    assert slice_["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": node_uid, "controller": True}
    ]
    spec = slice_["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    card0, card1 = spec["devices"]
    assert (card0["name"], card1["name"]) == ("card0", "card1")
    assert card1["allowMultipleAllocations"] is True
    assert card1["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert card1["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:04:00.0"}
    assert card1["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    assert card1["attributes"]["driver"] == {"string": "xe"}
    assert card1["attributes"]["tileCount"] == {"int": 2}
    assert card1["capacity"]["memory"]["value"] == "32Gi"
    assert card1["capacity"]["tiles"]["value"] == "2"


def test_memory_reserved_is_left_out_of_the_capacity(make_rig: Any) -> None:
    rig = make_rig([FakeCard(0, lmem_per_tile=8 * GIB)], extra=("--memory-reserved", "1Gi"))
    rig.start_registered()
    assert the_slice(rig)["spec"]["devices"][0]["capacity"]["memory"]["value"] == "7Gi"


def test_a_bad_memory_amount_is_refused_at_start(make_rig: Any) -> None:
    rig = make_rig([FakeCard(0)], extra=("--memory-reserved", "lots"))
    assert rig.start().wait_exit() == 2
    assert "memory reserved" in rig.log()


def test_a_restart_with_the_same_cards_keeps_the_generation(
    make_rig: Any, apiserver: ApiServerDouble
) -> None:
    rig = make_rig([FakeCard(0)]).start_registered()
    before = the_slice(rig)
    rig.stop()
    apiserver.clear_requests()
    rig.start_registered()
    wait_for(lambda: apiserver.count_requests("GET", SLICES), timeout=20, what="a slice check")
    after = the_slice(rig)
    assert generation(after) == 1
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert apiserver.count_requests("PUT", SLICES) == apiserver.count_requests("POST", SLICES) == 0


def test_a_slice_the_kubelet_deleted_is_written_again(
    make_rig: Any, apiserver: ApiServerDouble
) -> None:
    rig = make_rig([FakeCard(0)]).start_registered()
    the_slice(rig)
    # A starting kubelet deletes the node's slices, then registers the driver again.
    apiserver.delete_object("resourceslices", NAME)
    rig.kubelet.register()
    assert generation(the_slice(rig)) == 1
    # A restart writes it at once.
    apiserver.delete_object("resourceslices", NAME)
    rig.stop()
    rig.start()
    assert the_slice(rig)["spec"]["devices"][0]["name"] == "card0"


def test_a_card_that_goes_is_taken_out_with_a_new_generation(make_rig: Any) -> None:
    cards = [FakeCard(0), FakeCard(1)]
    rig = make_rig(cards).start_registered()
    assert generation(the_slice(rig)) == 1
    remove_card(rig.sysfs, cards[1])
    # A rescan in the middle of the unplug may publish a half-gone card1 first: each change
    # of the devices is a new generation.
    changed = wait_for(
        lambda: [s for s in rig.slices() if [d["name"] for d in s["spec"]["devices"]] == ["card0"]],
        timeout=20,
        what="card1 gone from the slice",
    )
    assert generation(changed[0]) >= 2
    claim = rig.add_claim("late", [share("gpu", "card1")])
    error = rig.kubelet.prepare([claim]).claims[claim.uid].error
    assert "which node n1 does not have (its cards: card0)" in error


def test_other_drivers_and_nodes_slices_are_left_alone_and_obsolete_ones_deleted(
    make_rig: Any, apiserver: ApiServerDouble
) -> None:
    def slice_obj(name: str, driver: str, node: str, generation: int) -> dict[str, Any]:
        pool = {"name": node, "generation": generation, "resourceSliceCount": 1}
        return {
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": pool, "devices": []},
        }

    apiserver.add_object("resourceslices", slice_obj("intel", "gpu.intel.com", "n1", 9))
    apiserver.add_object("resourceslices", slice_obj("n2-gas", DRIVER, "n2", 3))
    apiserver.add_object("resourceslices", slice_obj("n1-old-name", DRIVER, "n1", 5))
    rig = make_rig([FakeCard(0)]).start_registered()

    def names() -> list[str]:
        return sorted(s["metadata"]["name"] for s in apiserver.list_objects("resourceslices"))

    # The obsolete slice is deleted before the node's own is written: the two are not seen
    # at once, so the test waits for both.
    expected = sorted(["intel", "n2-gas", NAME])
    wait_for(lambda: names() == expected, timeout=20, what="the obsolete slice replaced")
    # Above the highest generation the pool had, so consumers drop what they saw before.
    assert generation(the_slice(rig)) == 6


def test_api_failures_at_start_are_retried(make_rig: Any, apiserver: ApiServerDouble) -> None:
    apiserver.faults.add("POST", SLICES, ("status", 500), times=2)
    rig = make_rig([FakeCard(0)]).start_registered()
    assert the_slice(rig)["spec"]["devices"][0]["name"] == "card0"
    assert "ResourceSlice not written" in rig.log()
    # Prepares are served while the slice is still being written.
    claim = rig.add_claim("early", [share("gpu", "card0")])
    assert rig.kubelet.prepare([claim]).claims[claim.uid].error == ""


def test_xe_link_groups_come_from_the_nodes_label(
    make_rig: Any, apiserver: ApiServerDouble
) -> None:
    rig = make_rig([FakeCard(0), FakeCard(1), FakeCard(2)])
    apiserver.patch_node("n1", {"metadata": {"labels": {"gpu.intel.com/xe-links": "0.0-2.0"}}})
    rig.start_registered()
    devices = {d["name"]: d["attributes"] for d in the_slice(rig)["spec"]["devices"]}
    assert devices["card0"]["xeLinkGroup"] == devices["card2"]["xeLinkGroup"] == {"int": 0}
    assert "xeLinkGroup" not in devices["card1"]


def test_a_malformed_xe_link_label_publishes_no_groups_and_says_why(
    make_rig: Any, apiserver: ApiServerDouble
) -> None:
    rig = make_rig([FakeCard(0), FakeCard(1)])
    apiserver.patch_node("n1", {"metadata": {"labels": {"gpu.intel.com/xe-links": "0.0-9.0"}}})
    rig.start_registered()
    devices = the_slice(rig)["spec"]["devices"]
    assert [d for d in devices if "xeLinkGroup" in d["attributes"]] == []
    wait_for(lambda: "node n1: no Xe Link groups published" in rig.log(), 20, "the warning")
