"""Two `gas dra` of one node at once, as a rolling update runs them (the DaemonSet's
maxSurge): each with its pod's UID in its socket names, both registered, sharing one state
under the lock; and the node's slice kept by watches rather than polls, with cards kept
whole where the node's label asks. Real processes against the API-server double, fake
sysfs and DRA kubelet doubles over real gRPC."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.core.dra_claims import LABEL_EXCLUSIVE_CARDS
from gas.dra.driver import DRIVER
from tests.support.apiserver import ApiServerDouble
from tests.support.drakubelet import ClaimRef
from tests.support.draproc import DraRig, share
from tests.support.fakesysfs import FakeCard
from tests.support.polling import wait_for

CARDS = [FakeCard(0, tiles=4), FakeCard(1, tiles=4)]
NODE_READS = r"^/api/v1/nodes/n1$"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def slice_lists(apiserver: ApiServerDouble) -> int:
    """LISTs of slices that are not watches."""
    return sum(
        1
        for method, target in apiserver.request_targets
        if method == "GET" and target.startswith(SLICES + "?") and "watch=true" not in target
    )


@pytest.fixture
def rig(apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path) -> Iterator[DraRig]:
    made = DraRig(apiserver, kubeconfig, "n1", CARDS, tmp_path, pod_uid="pod-a")
    try:
        yield made
    finally:
        made.close()


def the_devices(rig: DraRig) -> dict[str, dict[str, Any]]:
    (found,) = rig.slices()
    return {d["name"]: d for d in found["spec"]["devices"]}


def tiles_in_state(rig: DraRig) -> list[tuple[str, int]]:
    state = json.loads((rig.state_dir / "prepared-claims.json").read_text())
    return sorted(
        (d["device"], t) for c in state["claims"].values() for d in c["devices"] for t in d["tiles"]
    )


def test_two_instances_serve_side_by_side_and_share_one_state(rig: DraRig, tmp_path: Path) -> None:
    rig.start_registered()
    assert rig.kubelet.info is not None
    assert rig.kubelet.info.endpoint.endswith(f"/plugins/{DRIVER}/dra-pod-a.sock")
    second = rig.twin("pod-b", tmp_path)
    try:
        second.start_registered()
        assert second.kubelet.info is not None
        assert second.kubelet.info.endpoint.endswith("/dra-pod-b.sock")
        names = sorted(p.name for p in rig.kubelet.registration_sockets())
        assert names == [f"{DRIVER}-pod-a-reg.sock", f"{DRIVER}-pod-b-reg.sock"]
        # 8 one-tile claims over two 4-tile cards, prepared through both at once: every tile
        # given once, as one driver would.
        claims = [
            rig.add_claim(f"t{i}", [share("gpu", f"card{i % 2}", tiles="1")]) for i in range(8)
        ]
        errors: list[str] = []

        def prepare(index: int, claim: ClaimRef) -> None:
            kubelet = (rig if index % 2 else second).kubelet
            errors.append(kubelet.prepare([claim]).claims[claim.uid].error)

        threads = [threading.Thread(target=prepare, args=item) for item in enumerate(claims)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == [""] * 8
        assert tiles_in_state(rig) == [(f"card{c}", t) for c in (0, 1) for t in range(4)]
        # Unprepared through the other instance than the one that prepared it.
        first = claims[0]
        assert second.kubelet.unprepare([first]).claims[first.uid].error == ""
        assert not (rig.cdi_dir / f"{DRIVER}-{first.uid}.json").exists()
        # The old one stops: its sockets go, the new one's stay and serve.
        rig.stop()
        names = sorted(p.name for p in second.kubelet.registration_sockets())
        assert names == [f"{DRIVER}-pod-b-reg.sock"]
        fresh = rig.add_claim("after", [share("gpu", "card0", tiles="1")])
        assert second.kubelet.prepare([fresh]).claims[fresh.uid].error == ""
        for claim in [*claims[1:], fresh]:
            assert second.kubelet.unprepare([claim]).claims[claim.uid].error == ""
        assert rig.spec_files() == []
        assert tiles_in_state(rig) == []
        for log in (rig.log(), second.log()):
            assert "ERROR gas.dra.plugin" not in log
    finally:
        second.close()


def test_the_slice_is_kept_by_watches_not_polls(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    rig = DraRig(apiserver, kubeconfig, "n1", [FakeCard(0)], tmp_path, ["--slice-resync", "600"])
    try:
        rig.start_registered()
        wait_for(lambda: rig.slices(), 20, "the slice")
        wait_for(lambda: apiserver.open_watch_count >= 2, 20, "the watches")
        # The registration's own check (a starting kubelet deletes the node's slices) reads
        # the API server directly; after it, nothing.
        idle = threading.Event()
        idle.wait(1.5)
        apiserver.clear_requests()
        idle.wait(4.0)
        # Idle: no node read, no slice list (a poll would have made them).
        assert apiserver.count_requests("GET", NODE_READS) == 0, apiserver.request_targets
        assert slice_lists(apiserver) == 0
        # Deleted by someone else (a kubelet that restarted): written again at once.
        (published,) = rig.slices()
        apiserver.delete_object("resourceslices", published["metadata"]["name"])
        wait_for(lambda: rig.slices(), 10, "the slice written again")
    finally:
        rig.close()


def test_the_safety_net_reads_the_api_server_at_its_period(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    rig = DraRig(apiserver, kubeconfig, "n1", [FakeCard(0)], tmp_path, ["--slice-resync", "1"])
    try:
        rig.start_registered()
        wait_for(lambda: rig.slices(), 20, "the slice")
        apiserver.clear_requests()
        wait_for(lambda: apiserver.count_requests("GET", NODE_READS) >= 3, 20, "three checks")
    finally:
        rig.close()


def test_cards_labelled_exclusive_are_published_whole_once_no_claim_shares_them(
    rig: DraRig, apiserver: ApiServerDouble
) -> None:
    rig.start_registered()
    wait_for(lambda: rig.slices(), 20, "the slice")
    shared = rig.add_claim("shared", [share("gpu", "card1")])
    assert rig.kubelet.prepare([shared]).claims[shared.uid].error == ""
    apiserver.patch_node("n1", {"metadata": {"labels": {LABEL_EXCLUSIVE_CARDS: "card0.card1"}}})
    # card0, shared by no claim, is whole at once (the node's watch, not a poll); card1
    # stays shareable under its claim, and the log says why.
    wait_for(lambda: "allowMultipleAllocations" not in the_devices(rig)["card0"], 10, "card0 whole")
    card0, card1 = the_devices(rig)["card0"], the_devices(rig)["card1"]
    assert all("requestPolicy" not in c for c in card0["capacity"].values())
    assert card0["capacity"]["memory"] == {"value": "64Gi"}
    assert card1["allowMultipleAllocations"] is True
    wait_for(lambda: "card1 is labelled exclusive but claims share it now" in rig.log(), 10)
    assert rig.kubelet.unprepare([shared]).claims[shared.uid].error == ""
    wait_for(lambda: "allowMultipleAllocations" not in the_devices(rig)["card1"], 10, "card1 whole")
    # A claim on a whole card holds it all: its share variables say so.
    whole = rig.add_claim("whole", [{"request": "gpu", "device": "card0"}])
    assert rig.kubelet.prepare([whole]).claims[whole.uid].error == ""
    spec = json.loads((rig.cdi_dir / f"{DRIVER}-{whole.uid}.json").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert env == ["GAS_CARD0_MEMORY_BYTES=68719476736", "GAS_CARD0_MILLICORES=1000"]
    # The label gone: shareable again.
    apiserver.patch_node("n1", {"metadata": {"labels": {LABEL_EXCLUSIVE_CARDS: None}}})
    wait_for(lambda: all(d.get("allowMultipleAllocations") for d in the_devices(rig).values()), 10)
    # A malformed label shares every card, and says why.
    apiserver.patch_node("n1", {"metadata": {"labels": {LABEL_EXCLUSIVE_CARDS: "gpu0"}}})
    wait_for(lambda: "is not card names joined by dots" in rig.log(), 10)


def test_an_instance_with_a_pod_uid_waits_for_one_without(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    """The first rolling update from a gas dra without pod UIDs: the old one neither takes
    the lock nor reads the state again, so the new one waits until it has stopped."""
    old = DraRig(apiserver, kubeconfig, "n1", CARDS, tmp_path)
    new = old.twin("pod-new", tmp_path)
    try:
        old.start_registered()
        new.start()
        wait_for(lambda: "waiting for the gas dra serving" in new.log(), 20, "the wait said")
        assert [p.name for p in old.kubelet.registration_sockets()] == [f"{DRIVER}-reg.sock"]
        old.stop()
        new.kubelet.register(timeout=30, socket=new.registration_name())
        claim = old.add_claim("after", [share("gpu", "card0")])
        assert new.kubelet.prepare([claim]).claims[claim.uid].error == ""
    finally:
        new.close()
        old.close()
