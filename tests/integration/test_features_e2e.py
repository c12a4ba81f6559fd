"""GAS features end to end: the kube-scheduler emulator calls a real gas process over mutual
TLS, against the API-server double, and the Binding's annotations are checked."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import assert_consistent, ledger_of, wait_for_nodes
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.scheduler import Outcome, SchedulerEmulator

P = "telemetry.aware.scheduling.policy/"


def emulator_for(gas: GasProcess, apiserver: ApiServerDouble, tls: TLSFiles) -> SchedulerEmulator:
    return SchedulerEmulator(
        apiserver, gas.url, cert=(tls.client_cert, tls.client_key), verify=tls.ca
    )


@pytest.fixture
def scheduler(
    gas: GasProcess, apiserver: ApiServerDouble, tls_files: TLSFiles
) -> Iterator[SchedulerEmulator]:
    emulator = emulator_for(gas, apiserver, tls_files)
    yield emulator
    emulator.close()


def labelled(node: dict[str, Any], **labels: str) -> dict[str, Any]:
    node["metadata"]["labels"].update(labels)
    return node


def pod_annotations(apiserver: ApiServerDouble, name: str) -> tuple[str | None, dict[str, str]]:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    return pod["spec"].get("nodeName"), dict(pod["metadata"].get("annotations") or {})


def placed(apiserver: ApiServerDouble, name: str) -> tuple[str | None, str | None, str | None]:
    node, notes = pod_annotations(apiserver, name)
    return node, notes.get("gas-container-cards"), notes.get("gas-container-tiles")


def schedule(
    scheduler: SchedulerEmulator, apiserver: ApiServerDouble, pod: dict[str, Any]
) -> Outcome:
    apiserver.add_pod(pod)
    return scheduler.schedule_now("default", pod["metadata"]["name"])


def tile_node(
    name: str, numbers: str = "0.1", tiles: int = 2, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    cards = len(numbers.split("."))
    node = gpu_node(name, numbers, i915=str(4 * cards), tiles=str(tiles * cards))
    return labelled(node, **(labels or {}))


# ---------------------------------------------------------------- tiles


def test_tiles_written_at_bind_and_read_back_after_a_restart(
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    apiserver: ApiServerDouble,
) -> None:
    apiserver.add_node(tile_node("t1", labels={f"{P}gas-tile-disable-card1_gt0": "true"}))
    first = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    first.wait_ready()
    wait_for_nodes(first, "t1")
    emulator = emulator_for(first, apiserver, tls_files)
    try:
        mixed = gpu_pod(
            "mixed",
            container("a", i915="1", tiles="2"),
            container("plain", i915="1"),
            container("b", i915="1", tiles="1"),
        )
        assert schedule(emulator, apiserver, mixed).bound
        # card1's tile 0 is disabled, so b gets tile 1.
        assert placed(apiserver, "mixed") == ("t1", "card0|card0|card1", "card0:gt0+gt1||card1:gt1")
        plain = gpu_pod("plain", container(i915="1"))
        assert schedule(emulator, apiserver, plain).bound
        assert placed(apiserver, "plain") == ("t1", "card0", None)
    finally:
        emulator.close()
    wait_for(lambda: "tiles" in ledger_of(first), what="tiles in the ledger")
    held = ledger_of(first)["tiles"]
    assert held == {"t1": {"card0": [0, 1], "card1": [1]}}
    first.stop()

    second = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    second.wait_ready()
    assert ledger_of(second)["tiles"] == held
    emulator = emulator_for(second, apiserver, tls_files)
    try:
        # No usable tile is left anywhere.
        late = schedule(emulator, apiserver, gpu_pod("late", container(i915="1", tiles="1")))
        assert not late.bound
        assert "tiles" in {**late.failed_nodes, **late.unresolvable_nodes}["t1"]
        apiserver.delete_pod("default", "mixed")
        wait_for(lambda: "tiles" not in ledger_of(second), what="tiles released")
        assert emulator.schedule_now("default", "late").bound
        assert placed(apiserver, "late") == ("t1", "card0", "card0:gt0")
    finally:
        emulator.close()
    assert_consistent(second, apiserver)


# ---------------------------------------------------------------- allow / deny


def test_allow_and_deny_lists(
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    apiserver: ApiServerDouble,
) -> None:
    apiserver.add_node(gpu_node("n3", "0.1.2", i915="12"))
    gas = start_gas(
        ["--kubeConfig", kubeconfig, "--enableAllowlist", "--enableDenylist"], tls=tls_files
    )
    gas.wait_ready()
    wait_for_nodes(gas, "n3")
    emulator = emulator_for(gas, apiserver, tls_files)
    try:
        allowed = gpu_pod("allowed", annotations={"gas-allow": "card2, card1"})
        assert schedule(emulator, apiserver, allowed).bound
        assert placed(apiserver, "allowed")[1] == "card1"
        denied = gpu_pod("denied", annotations={"gas-deny": "card0,card1"})
        assert schedule(emulator, apiserver, denied).bound
        assert placed(apiserver, "denied")[1] == "card2"
        empty = schedule(emulator, apiserver, gpu_pod("empty", annotations={"gas-allow": ""}))
        assert not empty.bound
        assert "gas-allow is empty" in empty.unresolvable_nodes["n3"]
        bad = schedule(emulator, apiserver, gpu_pod("bad", annotations={"gas-deny": "gpu0"}))
        assert "gas-deny is malformed" in bad.unresolvable_nodes["n3"]
    finally:
        emulator.close()


def test_allow_list_is_ignored_unless_enabled(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    apiserver.add_node(gpu_node("n2", "0.1", i915="8"))
    wait_for_nodes(gas, "n2")
    pod = gpu_pod("p", annotations={"gas-allow": "card1", "gas-deny": "card0"})
    assert schedule(scheduler, apiserver, pod).bound
    assert placed(apiserver, "p")[1] == "card0"


# ---------------------------------------------------------------- same GPU


def test_same_gpu(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    apiserver.add_node(gpu_node("n2", "0.1", i915="8", millicores="2000"))
    wait_for_nodes(gas, "n2")
    busy = gpu_pod("busy", container(i915="1", millicores="700"))
    assert schedule(scheduler, apiserver, busy).bound
    group = gpu_pod(
        "group",
        container("a", i915="1", millicores="200"),
        container("b", i915="1", millicores="200"),
        annotations={"gas-same-gpu": "a,b"},
    )
    assert schedule(scheduler, apiserver, group).bound
    assert placed(apiserver, "group")[1] == "card1|card1"
    bad = gpu_pod(
        "bad",
        container("a", i915="1"),
        container("b", i915="2"),
        annotations={"gas-same-gpu": "a,b"},
    )
    outcome = schedule(scheduler, apiserver, bad)
    assert "gas-same-gpu" in outcome.unresolvable_nodes["n2"]
    assert_consistent(gas, apiserver)


# ---------------------------------------------------------------- Xe link, split labels


def test_xe_link_on_a_partially_linked_node_with_split_labels(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    node = tile_node(
        "xe",
        "0.1",
        labels={
            "gpu.intel.com/gpu-numbers2": "Z.2.3",
            "gpu.intel.com/xe-links": "1.0-2.0",
            "gpu.intel.com/xe-links2": "Z_3.1-0.1",
        },
    )
    node["status"]["allocatable"] = {"gpu.intel.com/i915": "16", "gpu.intel.com/tiles": "8"}
    apiserver.add_node(node)
    wait_for_nodes(gas, "xe")

    def xe_pod(name: str) -> dict[str, Any]:
        return gpu_pod(
            name,
            container(i915="2", tiles="2"),
            annotations={"gas-allocate-xelink": "true"},
        )

    assert schedule(scheduler, apiserver, xe_pod("x1")).bound
    assert placed(apiserver, "x1") == ("xe", "card0,card3", "card0:gt1,card3:gt1")
    assert schedule(scheduler, apiserver, xe_pod("x2")).bound
    assert placed(apiserver, "x2") == ("xe", "card1,card2", "card1:gt0,card2:gt0")
    third = schedule(scheduler, apiserver, xe_pod("x3"))
    assert not third.bound and "xe" in third.failed_nodes
    odd = gpu_pod("odd", container(i915="1", tiles="1"), annotations={"gas-allocate-xelink": ""})
    assert "odd number" in schedule(scheduler, apiserver, odd).unresolvable_nodes["xe"]
    assert_consistent(gas, apiserver)


# ---------------------------------------------------------------- single NUMA


def test_single_numa(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    node = gpu_node("numa", "0.1.2.3", i915="4")  # one pod per card
    apiserver.add_node(labelled(node, **{"gpu.intel.com/numa-gpu-map": "0-0.1_1-2.3"}))
    bad_map = gpu_node("badmap", "0.1.2.3", i915="4")
    apiserver.add_node(labelled(bad_map, **{"gpu.intel.com/numa-gpu-map": "0-0.1_1"}))
    wait_for_nodes(gas, "numa", "badmap")
    first = gpu_pod("first", container(i915="1"))
    # Fill card0 on the good node by a pod bound there already.
    first["metadata"]["annotations"] = {"gas-container-cards": "card0"}
    first["spec"]["nodeName"] = "numa"
    first["status"]["phase"] = "Running"
    apiserver.add_pod(first)
    pod = gpu_pod(
        "pair",
        container("a", i915="1"),
        container("b", i915="1"),
        annotations={"gas-allocate-single-numa": "true"},
    )
    outcome = schedule(scheduler, apiserver, pod)
    assert outcome.bound
    assert "numa-gpu-map" in outcome.unresolvable_nodes["badmap"]
    assert placed(apiserver, "pair") == ("numa", "card2|card3", None)


# ---------------------------------------------------------------- node policy labels


def test_disable_pci_group_and_preferred_card_labels(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    node = gpu_node("pol", "0.1.2.3", i915="16")
    labelled(
        node,
        **{
            "gpu.intel.com/pci-groups": "0.1_2.3",
            f"{P}gas-disable-card0": "PCI_GROUP",
            f"{P}gas-prefer-gpu": "card3",
        },
    )
    apiserver.add_node(node)
    apiserver.add_node(gpu_node("other", "0", i915="4"))
    wait_for_nodes(gas, "pol", "other")
    outcome = schedule(scheduler, apiserver, gpu_pod("p1"))
    # A preference never hides other passing nodes from the scheduler.
    assert outcome.bound and outcome.failed_nodes == {} and outcome.unresolvable_nodes == {}
    node_name, cards, _ = placed(apiserver, "p1")
    if node_name == "pol":
        assert cards == "card3"
    big = schedule(scheduler, apiserver, gpu_pod("big", container(i915="3")))
    assert not big.bound
    assert "only 2 usable" in big.unresolvable_nodes["pol"]
    # The label goes: the group comes back.
    current = apiserver.get_node("pol")
    assert current is not None
    del current["metadata"]["labels"][f"{P}gas-disable-card0"]
    apiserver.put_node(current)
    wait_for(
        lambda: (
            "pol"
            in scheduler.call(
                "scheduler/filter", {"Pod": big_pod(apiserver), "NodeNames": ["pol"]}
            )["NodeNames"]
        ),
        what="card group re-enabled",
    )
    assert scheduler.schedule_now("default", "big").bound
    assert placed(apiserver, "big")[1] == "card3,card0,card1"


def big_pod(apiserver: ApiServerDouble) -> dict[str, Any]:
    pod = apiserver.get_pod("default", "big")
    assert pod is not None
    return pod


# ---------------------------------------------------------------- balanced resource


def all_bound(gas: GasProcess, count: int) -> bool:
    pods = ledger_of(gas)["pods"]
    return len(pods) == count and all(p["state"] == "bound" for p in pods.values())


def test_balanced_resource(
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    apiserver: ApiServerDouble,
) -> None:
    apiserver.add_node(tile_node("bal", "0.1.2", tiles=4))
    gas = start_gas(["--kubeConfig", kubeconfig, "-balancedResource=tiles"], tls=tls_files)
    gas.wait_ready()
    wait_for_nodes(gas, "bal")
    emulator = emulator_for(gas, apiserver, tls_files)
    try:
        for index in range(4):
            pod = gpu_pod(f"b{index}", container(i915="1", tiles="1"))
            assert schedule(emulator, apiserver, pod).bound
            # Wait for the watch so each pick sees the previous one as bound.
            wait_for(functools.partial(all_bound, gas, index + 1), what="bound")
        cards = [placed(apiserver, f"b{index}")[1] for index in range(4)]
        assert cards == ["card0", "card1", "card2", "card0"]
    finally:
        emulator.close()
    assert_consistent(gas, apiserver)
