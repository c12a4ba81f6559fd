"""`gas dra` as a real process against the API-server double, fake sysfs and a DRA kubelet
double over real gRPC on unix sockets: registration, prepare and unprepare with their CDI
specs and state, two claims on one card, and the error paths (a claim not found or
replaced, a card the node lacks, concurrent calls, a state it cannot read or write, a
restart between prepare and unprepare)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.dra.driver import DRIVER
from tests.support.apiserver import ApiServerDouble
from tests.support.drakubelet import ClaimRef
from tests.support.draproc import DraRig, share
from tests.support.fakesysfs import FakeCard
from tests.support.polling import wait_for

CLAIM_GET = r"^/apis/resource\.k8s\.io/v1/namespaces/[^/]+/resourceclaims/"


@pytest.fixture
def rig(apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path) -> Iterator[DraRig]:
    cards = [FakeCard(0), FakeCard(1, driver="xe", tiles=2), FakeCard(2, tiles=4)]
    made = DraRig(apiserver, kubeconfig, "n1", cards, tmp_path)
    try:
        yield made
    finally:
        made.close()


def spec_of(rig: DraRig, claim: ClaimRef) -> dict[str, Any]:
    path = rig.cdi_dir / f"{DRIVER}-{claim.uid}.json"
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def device_paths(spec: dict[str, Any]) -> list[list[str]]:
    return [
        [n["path"] for n in device["containerEdits"]["deviceNodes"]] for device in spec["devices"]
    ]


def env_of(spec: dict[str, Any]) -> list[list[str]]:
    return [device["containerEdits"].get("env", []) for device in spec["devices"]]


def claim_status(rig: DraRig, claim: ClaimRef) -> list[dict[str, Any]]:
    stored = rig.api.get_object("resourceclaims", claim.name, claim.namespace)
    return list((stored or {}).get("status", {}).get("devices") or [])


def masks_of(spec: dict[str, Any]) -> list[list[str]]:
    """Each device's tile mask (its share variables aside)."""
    return [[e for e in env if e.startswith("ZE_AFFINITY_MASK=")] for env in env_of(spec)]


def test_registers_as_the_kubelet_expects(rig: DraRig) -> None:
    info = rig.start_registered().kubelet.info
    assert info is not None
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(rig.kubelet_root / "plugins" / DRIVER / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert rig.kubelet.service == "v1.DRAPlugin"
    assert (rig.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock").exists()
    assert "registered with the kubelet" in rig.log()


def test_prepare_writes_the_claims_cdi_spec_and_unprepare_removes_it(rig: DraRig) -> None:
    rig.start_registered()
    result = share("gpu", "card1")
    claim = rig.add_claim("c1", [result])
    answer = rig.kubelet.prepare([claim]).claims[claim.uid]
    assert answer.error == ""
    (device,) = answer.devices
    assert list(device.request_names) == ["gpu"]
    assert device.pool_name == "n1"
    assert device.device_name == "card1"
    assert list(device.cdi_device_ids) == [f"{DRIVER}/gpu={claim.uid}-card1"]
    assert device.share_id == result["shareID"]
    spec = spec_of(rig, claim)
    assert spec["kind"] == f"{DRIVER}/gpu"
    assert [d["name"] for d in spec["devices"]] == [f"{claim.uid}-card1"]
    assert device_paths(spec) == [["/dev/dri/card1", "/dev/dri/renderD129"]]
    host = [n["hostPath"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert host == [str(rig.devfs / "dri" / "card1"), str(rig.devfs / "dri" / "renderD129")]
    assert all(os.path.exists(p) for p in host)
    # No tiles asked: the whole card, no mask; its share of card1, as the result consumes.
    assert env_of(spec) == [["GAS_CARD1_MEMORY_BYTES=1073741824", "GAS_CARD1_MILLICORES=100"]]
    state = json.loads((rig.state_dir / "prepared-claims.json").read_text())
    assert list(state["claims"]) == [claim.uid]

    # What was prepared is in the claim's status (written beside the answer).
    status = wait_for(lambda: claim_status(rig, claim), 20, "the claim's status.devices")
    assert status == [
        {
            "driver": DRIVER,
            "pool": "n1",
            "device": "card1",
            "shareID": result["shareID"],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": "prepared on node n1",
                    "lastTransitionTime": status[0]["conditions"][0]["lastTransitionTime"],
                }
            ],
            "data": {
                "request": "gpu",
                "cdiDeviceID": f"{DRIVER}/gpu={claim.uid}-card1",
                "environment": {
                    "GAS_CARD1_MEMORY_BYTES": "1073741824",
                    "GAS_CARD1_MILLICORES": "100",
                },
            },
        }
    ]

    # The same call again (a kubelet retry, or after its restart) answers the same, from
    # the state, without reading the claim again.
    rig.api.clear_requests()
    again = rig.kubelet.prepare([claim]).claims[claim.uid]
    assert again == answer
    assert rig.api.count_requests("GET", CLAIM_GET) == 0

    assert rig.kubelet.unprepare([claim]).claims[claim.uid].error == ""
    assert rig.spec_files() == []
    assert json.loads((rig.state_dir / "prepared-claims.json").read_text())["claims"] == {}
    # Its entries leave the claim's status with it.
    wait_for(lambda: not claim_status(rig, claim), 20, "status.devices emptied")
    # Unprepare is idempotent, also for a claim never prepared here.
    never = ClaimRef("default", "ghost", "00000000-0000-4000-8000-00000000dead")
    assert rig.kubelet.unprepare([claim, never]).claims[never.uid].error == ""


def test_two_claims_on_one_card_are_told_apart_and_get_distinct_tiles(rig: DraRig) -> None:
    rig.start_registered()
    first = rig.add_claim("a", [share("gpu", "card2", tiles="1")])
    second = rig.add_claim("b", [share("gpu", "card2", tiles="2")])
    whole = rig.add_claim("c", [share("gpu", "card2")])
    answers = rig.kubelet.prepare([first, second, whole]).claims
    shares = {answers[c.uid].devices[0].share_id for c in (first, second, whole)}
    assert len(shares) == 3
    ids = {answers[c.uid].devices[0].cdi_device_ids[0] for c in (first, second, whole)}
    assert len(ids) == 3
    assert masks_of(spec_of(rig, first)) == [["ZE_AFFINITY_MASK=0"]]
    assert masks_of(spec_of(rig, second)) == [["ZE_AFFINITY_MASK=1,2"]]
    assert masks_of(spec_of(rig, whole)) == [[]]
    # Unpreparing one leaves the other's spec, and frees its tiles for the next claim.
    rig.kubelet.unprepare([first])
    assert spec_of(rig, second)["devices"][0]["name"] == f"{second.uid}-card2"
    third = rig.add_claim("d", [share("gpu", "card2", tiles="2")])
    assert rig.kubelet.prepare([third]).claims[third.uid].error == ""
    assert masks_of(spec_of(rig, third)) == [["ZE_AFFINITY_MASK=0,3"]]


def test_one_claim_with_two_requests_and_a_prioritized_subrequest(rig: DraRig) -> None:
    rig.start_registered()
    claim = rig.add_claim(
        "multi",
        [
            share("big/fast", "card1", tiles="1"),
            share("small", "card0"),
            {"request": "nic", "driver": "dra.net", "pool": "n1", "device": "eth0"},
        ],
    )
    answer = rig.kubelet.prepare([claim]).claims[claim.uid]
    assert answer.error == ""
    assert [(list(d.request_names), d.device_name) for d in answer.devices] == [
        (["big"], "card1"),
        (["small"], "card0"),
    ]
    spec = spec_of(rig, claim)
    assert device_paths(spec) == [
        ["/dev/dri/card0", "/dev/dri/renderD128"],
        ["/dev/dri/card1", "/dev/dri/renderD129"],
    ]
    # card0 (one tile, whole) is tile 0; card1's first tile comes after it. The mask goes
    # with the device that holds part of its card.
    assert masks_of(spec) == [[], ["ZE_AFFINITY_MASK=0,1"]]


def test_claim_errors_fail_that_claim_only(rig: DraRig) -> None:
    rig.start_registered()
    good = rig.add_claim("good", [share("gpu", "card0")])
    missing = ClaimRef("default", "nowhere", "11111111-1111-4111-8111-111111111111")
    foreign = rig.add_claim("foreign", [share("gpu", "card7")])
    replaced = rig.add_claim("replaced", [share("gpu", "card0")])
    stale = ClaimRef(replaced.namespace, replaced.name, "22222222-2222-4222-8222-222222222222")
    unallocated_obj = rig.api.add_object(
        "resourceclaims", {"metadata": {"name": "pending", "namespace": "default"}}
    )
    unallocated = ClaimRef("default", "pending", unallocated_obj["metadata"]["uid"])
    too_many_tiles = rig.add_claim("greedy", [share("gpu", "card1", tiles="3")])

    answers = rig.kubelet.prepare([good, missing, foreign, stale, unallocated, too_many_tiles])
    errors = {uid: answer.error for uid, answer in answers.claims.items()}
    assert errors[good.uid] == ""
    assert errors[missing.uid] == "ResourceClaim default/nowhere not found"
    assert errors[foreign.uid] == (
        "ResourceClaim default/foreign: request 'gpu' was allocated device 'card7', which "
        "node n1 does not have (its cards: card0, card1, card2)"
    )
    assert "it was replaced" in errors[stale.uid]
    assert errors[unallocated.uid] == "ResourceClaim default/pending is not allocated"
    assert "wants 3 tile(s) of card1, which has 2" in errors[too_many_tiles.uid]
    assert [p.name for p in rig.spec_files()] == [f"{DRIVER}-{good.uid}.json"]
    assert not answers.claims[foreign.uid].devices
    log = rig.log()
    assert "prepare claim default/foreign" in log and "card7" in log
    assert "Traceback" not in log
    assert rig.process is not None and rig.process.poll() is None


def test_concurrent_prepares_each_get_their_own_tiles(rig: DraRig) -> None:
    rig.start_registered()
    claims = [rig.add_claim(f"t{i}", [share("gpu", "card2", tiles="1")]) for i in range(4)]
    answers: dict[str, Any] = {}

    def call(claim: ClaimRef) -> None:
        answers[claim.uid] = rig.kubelet.prepare([claim]).claims[claim.uid]

    threads = [threading.Thread(target=call, args=(c,)) for c in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(answers[c.uid].error == "" for c in claims)
    masks = sorted(masks_of(spec_of(rig, c))[0][0] for c in claims)
    assert masks == [f"ZE_AFFINITY_MASK={t}" for t in range(4)]
    # A fifth finds every tile held.
    fifth = rig.add_claim("t4", [share("gpu", "card2", tiles="1")])
    error = rig.kubelet.prepare([fifth]).claims[fifth.uid].error
    assert "wants 1 tile(s) of card2, which has 4, 4 held by other claims" in error


def test_a_restart_between_prepare_and_unprepare(rig: DraRig) -> None:
    rig.start_registered()
    held = rig.add_claim("held", [share("gpu", "card1", tiles="1")])
    first = rig.kubelet.prepare([held]).claims[held.uid]
    rig.stop(signal.SIGKILL)
    # The CDI spec dir is a tmpfs on a real node: lost with a reboot, written again.
    shutil.rmtree(rig.cdi_dir)
    rig.start_registered()
    assert spec_of(rig, held)["devices"][0]["name"] == f"{held.uid}-card1"
    assert rig.kubelet.prepare([held]).claims[held.uid] == first
    # The tile held before the restart stays held.
    other = rig.add_claim("other", [share("gpu", "card1", tiles="1")])
    assert rig.kubelet.prepare([other]).claims[other.uid].error == ""
    assert masks_of(spec_of(rig, held)) == [["ZE_AFFINITY_MASK=0"]]
    assert masks_of(spec_of(rig, other)) == [["ZE_AFFINITY_MASK=1"]]
    # The claim is deleted from the API server before the kubelet unprepares it.
    rig.api.delete_object("resourceclaims", "held", "default")
    rig.stop()
    rig.start_registered()
    assert rig.kubelet.unprepare([held]).claims[held.uid].error == ""
    assert [p.name for p in rig.spec_files()] == [f"{DRIVER}-{other.uid}.json"]


def test_a_spec_left_by_a_crash_before_the_state_was_written_is_removed(rig: DraRig) -> None:
    rig.cdi_dir.mkdir(parents=True)
    orphan = rig.cdi_dir / f"{DRIVER}-33333333-3333-4333-8333-333333333333.json"
    orphan.write_text("{}")
    other_driver = rig.cdi_dir / "intel.com-gpu.json"
    other_driver.write_text("{}")
    rig.start_registered()
    assert not orphan.exists()
    assert other_driver.exists()


def test_an_unreadable_state_stops_the_start(rig: DraRig) -> None:
    rig.state_dir.mkdir(parents=True)
    (rig.state_dir / "prepared-claims.json").write_text('{"format": 1, "claims": [')
    assert rig.start().wait_exit() == 1
    log = rig.log()
    assert "not starting: the prepared claims cannot be read" in log
    assert "Traceback" not in log


def test_a_state_dir_that_cannot_be_written_fails_the_claim_cleanly(rig: DraRig) -> None:
    rig.start_registered()
    before = rig.add_claim("before", [share("gpu", "card0")])
    assert rig.kubelet.prepare([before]).claims[before.uid].error == ""
    shutil.rmtree(rig.state_dir)
    rig.state_dir.write_text("not a directory")
    claim = rig.add_claim("c", [share("gpu", "card0")])
    error = rig.kubelet.prepare([claim]).claims[claim.uid].error
    assert error.startswith(f"cannot record claim {claim.uid} in {rig.state_dir}/")
    # Nothing is left that the kubelet was not told of; the claim prepared before stands.
    assert [p.name for p in rig.spec_files()] == [f"{DRIVER}-{before.uid}.json"]
    error = rig.kubelet.unprepare([before]).claims[before.uid].error
    assert error.startswith(f"cannot record claim {before.uid}")
    # Once the directory is back, the kubelet's retries succeed.
    rig.state_dir.unlink()
    assert rig.kubelet.prepare([claim]).claims[claim.uid].error == ""
    assert rig.kubelet.unprepare([before]).claims[before.uid].error == ""
    assert [p.name for p in rig.spec_files()] == [f"{DRIVER}-{claim.uid}.json"]


def test_a_second_driver_on_the_node_is_refused(
    rig: DraRig, apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    rig.start_registered()
    assert rig.process is not None
    first = rig.process.pid
    second = DraRig(apiserver, kubeconfig, "n1", rig.cards, tmp_path / "second")
    second.command = rig.command  # type: ignore[method-assign]
    second.log_path = tmp_path / "second.log"
    try:
        assert second.start().wait_exit() == 1
        said = second.log()
        assert f"another process (pid {first}: " in said and "not starting" in said
    finally:
        second.close()
    # The first still serves.
    claim = rig.add_claim("after", [share("gpu", "card0")])
    assert rig.kubelet.prepare([claim]).claims[claim.uid].error == ""


def test_no_node_name_is_a_usage_error(rig: DraRig) -> None:
    rig.command = lambda: [  # type: ignore[method-assign]
        sys.executable,
        "-m",
        "gas.cli",
        "dra",
        "--kubeconfig",
        rig.kubeconfig,
        "--sysfs-root",
        str(rig.sysfs),
    ]
    assert rig.start().wait_exit() == 2
    assert "no node name: give --node-name or set NODE_NAME" in rig.log()
    assert rig.kubelet.registration_sockets() == []


def _reserve(rig: DraRig, claim: ClaimRef, pod: dict[str, Any]) -> None:
    """The claim reserved for `pod`, as kube-scheduler leaves it."""
    meta = pod["metadata"]
    reserved = [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]
    rig.api.patch_object("resourceclaims", claim.name, {"status": {"reservedFor": reserved}})


def _pod_with(rig: DraRig, name: str, containers: dict[str, list[str]]) -> dict[str, Any]:
    """A pod whose containers name claims (the pod's claim entries named as the claims)."""
    claims = sorted({c for names in containers.values() for c in names})
    return rig.api.add_pod(
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": "n1",
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
                "containers": [
                    {"name": n, "resources": {"claims": [{"name": c} for c in names]}}
                    for n, names in containers.items()
                ],
            },
        }
    )


def test_one_mask_per_container_over_the_claims_of_the_pod_it_is_reserved_for(
    rig: DraRig,
) -> None:
    """The pod's containers read from the API server: a container with a tile of card2 (4
    tiles) and card1 whole (2 tiles) gets one mask over both, carried by the tile claim's
    device; a second pod whose two containers would need different masks from one tile
    claim is refused, naming them; a pod that cannot be read fails its claims."""
    rig.start_registered()
    tile = rig.add_claim("tile", [share("gpu", "card2", tiles="1")])
    whole = rig.add_claim("whole", [share("gpu", "card1")])
    pod = _pod_with(rig, "app", {"main": ["tile", "whole"]})
    for claim in (tile, whole):
        _reserve(rig, claim, pod)
    answers = rig.kubelet.prepare([tile, whole]).claims
    assert answers[tile.uid].error == answers[whole.uid].error == ""
    # card1 (2 tiles, whole) comes first: 0,1; card2's first tile is 2+0.
    assert masks_of(spec_of(rig, tile)) == [["ZE_AFFINITY_MASK=0,1,2"]]
    assert masks_of(spec_of(rig, whole)) == [[]]

    shared = rig.add_claim("shared-tile", [share("gpu", "card2", tiles="1")])
    other = rig.add_claim("other", [share("gpu", "card0")])
    split = _pod_with(rig, "split", {"a": ["shared-tile"], "b": ["shared-tile", "other"]})
    for claim in (shared, other):
        _reserve(rig, claim, split)
    answers = rig.kubelet.prepare([shared, other]).claims
    error = answers[shared.uid].error
    assert "no one ZE_AFFINITY_MASK is right for all of them" in error
    assert "container a of pod default/split (ZE_AFFINITY_MASK=1)" in error
    assert "container b of pod default/split (ZE_AFFINITY_MASK=0,2)" in error
    assert not (rig.cdi_dir / f"{DRIVER}-{shared.uid}.json").exists()

    ghost = rig.add_claim("ghost-claim", [share("gpu", "card0")])
    _reserve(rig, ghost, {"metadata": {"name": "gone", "uid": "0000-gone"}})
    error = rig.kubelet.prepare([ghost]).claims[ghost.uid].error
    assert "is reserved for pod gone, which cannot be read" in error
    assert "Pod default/gone not found" in error
