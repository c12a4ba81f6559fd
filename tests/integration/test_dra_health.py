"""`gas dra`'s view of its cards' health, as a real process against the API-server double,
fake sysfs trees and the DRA kubelet double: the device health stream (v1 and v1alpha1),
the taint an unfit card carries in the slice, the cards kept while they matter (an unbound
driver, a claim still on it, across a restart) and dropped when not, and the liveness
answer that calls the plugin's own sockets."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.core.dra_claims import UNHEALTHY_TAINT
from tests.support.apiserver import ApiServerDouble
from tests.support.draproc import DraRig, share
from tests.support.fakesysfs import FakeCard, bind_card, remove_card, unbind_card, write_file
from tests.support.polling import wait_for
from tests.support.realk8s import free_port

CARDS = [FakeCard(0), FakeCard(1, driver="xe", tiles=2), FakeCard(2)]


@pytest.fixture
def rig(apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path) -> Iterator[DraRig]:
    made = DraRig(apiserver, kubeconfig, "n1", CARDS, tmp_path, metrics_port=free_port())
    try:
        yield made
    finally:
        made.close()


def devices(rig: DraRig) -> dict[str, dict[str, Any]]:
    found = rig.slices()
    assert len(found) <= 1, found
    return {d["name"]: d for d in found[0]["spec"]["devices"]} if found else {}


def taints(rig: DraRig) -> dict[str, list[tuple[str, str, str]]]:
    return {
        name: [(t["key"], t["value"], t["effect"]) for t in d.get("taints") or []]
        for name, d in devices(rig).items()
    }


def healthy(devices: dict[str, tuple[str, str]]) -> set[str]:
    return {name for name, (health, _) in devices.items() if health == "HEALTHY"}


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_an_unbound_card_is_unhealthy_and_tainted_until_bound_again(
    rig: DraRig, version: str
) -> None:
    rig.start_registered()
    watch = rig.kubelet.health(version)
    try:
        first = watch.until(lambda d: len(d) == 3)
        assert healthy(first) == {"card0", "card1", "card2"}
        unbind_card(rig.sysfs, CARDS[1])
        sick = watch.until(lambda d: d.get("card1", ("",))[0] == "UNHEALTHY")
        assert "card1 (0000:04:00.0) has no driver bound" in sick["card1"][1]
        assert healthy(sick) == {"card0", "card2"}
        # Kept in the slice, with a taint that keeps claims off it and evicts the pods on it.
        wait_for(lambda: taints(rig).get("card1"), 20, "card1 tainted")
        assert taints(rig) == {
            "card0": [],
            "card1": [(UNHEALTHY_TAINT, "Unbound", "NoExecute")],
            "card2": [],
        }
        bind_card(rig.sysfs, CARDS[1])
        back = watch.until(lambda d: d.get("card1", ("",))[0] == "HEALTHY")
        assert healthy(back) == {"card0", "card1", "card2"}
        wait_for(lambda: taints(rig).get("card1") == [], 20, "card1's taint removed")
    finally:
        watch.close()


def test_a_driver_exposing_the_cards_distress_makes_it_unhealthy(rig: DraRig) -> None:
    rig.start_registered()
    watch = rig.kubelet.health()
    try:
        watch.until(lambda d: healthy(d) == {"card0", "card1", "card2"})
        pci = rig.sysfs / "devices" / "pci0000:00"
        # xe's RAS indicator: critical is unhealthy, warning is not.
        write_file(pci / CARDS[1].pci_address / "gpu_health", "warning\n")
        warned = watch.until(lambda d: "warning" in d["card1"][1])
        assert warned["card1"][0] == "HEALTHY"
        write_file(pci / CARDS[1].pci_address / "gpu_health", "critical\n")
        watch.until(lambda d: d["card1"][0] == "UNHEALTHY")
        wait_for(lambda: taints(rig)["card1"] == [(UNHEALTHY_TAINT, "Critical", "NoExecute")], 20)
        # i915 wedged (debugfs), xe in survivability mode.
        write_file(rig.sysfs / "kernel" / "debug" / "dri" / "0" / "i915_wedged", "1\n")
        write_file(pci / CARDS[2].pci_address / "survivability_mode", "Runtime\n")
        sick = watch.until(lambda d: healthy(d) == set())
        assert "i915 reports it wedged" in sick["card0"][1]
        assert "survivability mode" in sick["card2"][1]
        write_file(rig.sysfs / "kernel" / "debug" / "dri" / "0" / "i915_wedged", "0\n")
        watch.until(lambda d: healthy(d) == {"card0"})
    finally:
        watch.close()


def test_a_vanished_card_stays_while_a_claim_holds_it_and_a_claim_on_it_is_refused(
    rig: DraRig,
) -> None:
    rig.start_registered()
    held = rig.add_claim("held", [share("gpu", "card2")])
    assert rig.kubelet.prepare([held]).claims[held.uid].error == ""
    remove_card(rig.sysfs, CARDS[2])
    remove_card(rig.sysfs, CARDS[0])
    # card0 held nothing: it goes; card2 stays, tainted, until its claim is unprepared.
    wait_for(lambda: set(devices(rig)) == {"card1", "card2"}, 20, "card0 dropped")
    assert taints(rig)["card2"] == [(UNHEALTHY_TAINT, "Vanished", "NoExecute")]
    late = rig.add_claim("late", [share("gpu", "card2")])
    error = rig.kubelet.prepare([late]).claims[late.uid].error
    assert "was allocated card2, which cannot be used now" in error
    assert "gone from the PCI bus" in error
    assert rig.kubelet.unprepare([held]).claims[held.uid].error == ""
    wait_for(lambda: set(devices(rig)) == {"card1"}, 20, "card2 dropped")


def test_a_restart_while_a_card_is_unbound_keeps_it_tainted(rig: DraRig) -> None:
    rig.start_registered()
    wait_for(lambda: len(devices(rig)) == 3, 20, "three cards")
    rig.stop()
    unbind_card(rig.sysfs, CARDS[0])
    rig.start_registered()
    wait_for(lambda: taints(rig).get("card0"), 20, "card0 tainted after the restart")
    assert taints(rig)["card0"] == [(UNHEALTHY_TAINT, "Unbound", "NoExecute")]
    assert (rig.state_dir / "cards.json").exists()


def test_the_taint_effect_can_be_no_schedule(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    rig = DraRig(
        apiserver,
        kubeconfig,
        "n2",
        [FakeCard(0)],
        tmp_path,
        ["--unhealthy-taint-effect", "NoSchedule"],
    )
    try:
        rig.start_registered()
        unbind_card(rig.sysfs, FakeCard(0))
        wait_for(
            lambda: taints(rig).get("card0") == [(UNHEALTHY_TAINT, "Unbound", "NoSchedule")], 20
        )
    finally:
        rig.close()


def test_liveness_calls_the_plugins_own_sockets(rig: DraRig) -> None:
    rig.start_registered()
    url = f"http://127.0.0.1:{rig.metrics_port}/healthz"

    def status() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert wait_for(lambda: status()[0] == 200, 20, "live") and status() == (200, "ok\n")
    # The DRA socket gone (removed under the process): the kubelet could not reach it, and
    # the probe says so.
    dra_socket = rig.kubelet_root / "plugins" / "gpu.gas.intel.com" / "dra.sock"
    dra_socket.unlink()
    code, reason = status()
    assert code == 503 and reason.startswith("UNAVAILABLE"), reason
    # Metrics are still served beside it.
    with urllib.request.urlopen(f"http://127.0.0.1:{rig.metrics_port}/metrics") as answer:
        assert b"gas_dra_card_health" in answer.read()
