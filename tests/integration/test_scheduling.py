"""Scheduling as kube-scheduler does it, through the emulator: its own resource-fit pass,
then gas's filter, a node pick, and gas's bind, over mutual TLS to a real gas process."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import assert_consistent, wait_for_nodes
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.scheduler import SchedulerEmulator


@pytest.fixture
def scheduler(
    gas: GasProcess, apiserver: ApiServerDouble, tls_files: TLSFiles
) -> Iterator[SchedulerEmulator]:
    emulator = SchedulerEmulator(
        apiserver,
        gas.url,
        cert=(tls_files.client_cert, tls_files.client_key),
        verify=tls_files.ca,
    )
    yield emulator
    emulator.close()


def cards_of(apiserver: ApiServerDouble, name: str) -> tuple[str | None, str | None]:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    annotations = pod["metadata"].get("annotations") or {}
    return pod["spec"].get("nodeName"), annotations.get("gas-container-cards")


def worked_example_nodes(apiserver: ApiServerDouble) -> None:
    # Two nodes, each with two cards of 8G memory.max (and up to 4 pods per card).
    for name in ("node-a", "node-b"):
        apiserver.add_node(gpu_node(name, "0.1", i915="8", memory_max="16G"))


def five_g_pod(name: str) -> dict[str, Any]:
    return gpu_pod(name, container(i915="1", memory_max="5G"))


def test_worked_example_one_5g_pod_per_card(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    worked_example_nodes(apiserver)
    wait_for_nodes(gas, "node-a", "node-b")
    placed = set()
    for index in range(4):
        apiserver.add_pod(five_g_pod(f"p{index}"))
        outcome = scheduler.schedule_now("default", f"p{index}")
        assert outcome.bound, outcome
        placed.add(cards_of(apiserver, f"p{index}"))
    assert placed == {
        ("node-a", "card0"),
        ("node-a", "card1"),
        ("node-b", "card0"),
        ("node-b", "card1"),
    }
    # A fifth 5G pod: kube-scheduler's own count says each node has 6G left, but no card
    # has more than 3G. gas keeps it Pending, and preemption may still help (FailedNodes).
    apiserver.add_pod(five_g_pod("p4"))
    outcome = scheduler.schedule_now("default", "p4")
    assert not outcome.bound
    assert outcome.error == "unschedulable"
    assert set(outcome.failed_nodes) == {"node-a", "node-b"}
    assert all("memory.max" in reason for reason in outcome.failed_nodes.values())
    assert cards_of(apiserver, "p4") == (None, None)
    assert_consistent(gas, apiserver)


def test_5g_pod_filtered_out_where_each_card_has_3g_left(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    apiserver.add_node(gpu_node("node-a", "0.1", i915="8", memory_max="16G"))
    for card in ("card0", "card1"):
        pod = five_g_pod(f"running-{card}")
        pod["metadata"]["annotations"] = {"gas-ts": "1", "gas-container-cards": card}
        pod["spec"]["nodeName"] = "node-a"
        pod["status"]["phase"] = "Running"
        apiserver.add_pod(pod)
    wait_for_nodes(gas, "node-a")
    assert_consistent(gas, apiserver)
    apiserver.add_pod(five_g_pod("newcomer"))
    outcome = scheduler.schedule_now("default", "newcomer")
    assert not outcome.bound
    assert outcome.failed_nodes == {
        "node-a": "gpu: not enough free gpu.intel.com/memory.max on the node's cards"
    }


def test_multi_gpu_and_multi_container_pods_get_the_right_cards(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    apiserver.add_node(gpu_node("big", "0.1.2.3", i915="8", memory_max="32G"))
    wait_for_nodes(gas, "big")
    # 2 GPUs x 8G: each card's whole memory.
    apiserver.add_pod(gpu_pod("pair-1", container(i915="2", memory_max="16G")))
    apiserver.add_pod(gpu_pod("pair-2", container(i915="2", memory_max="16G")))
    assert scheduler.schedule_now("default", "pair-1").bound
    assert scheduler.schedule_now("default", "pair-2").bound
    assert cards_of(apiserver, "pair-1") == ("big", "card0,card1")
    assert cards_of(apiserver, "pair-2") == ("big", "card2,card3")
    apiserver.add_pod(gpu_pod("one-more", container(i915="1", memory_max="1")))
    assert not scheduler.schedule_now("default", "one-more").bound


def test_containers_of_one_pod_see_each_others_usage(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    apiserver.add_node(gpu_node("duo", "0.1", i915="8", memory_max="16G"))
    wait_for_nodes(gas, "duo")
    pod = gpu_pod(
        "three",
        container("a", i915="1", memory_max="5G"),
        container("sidecar"),  # no GPU
        container("b", i915="1", memory_max="5G"),
    )
    pod["spec"]["containers"][1]["resources"] = {}
    apiserver.add_pod(pod)
    assert scheduler.schedule_now("default", "three").bound
    # b cannot join a on card0 (5G + 5G > 8G), so it takes card1.
    assert cards_of(apiserver, "three") == ("duo", "card0||card1")
    assert_consistent(gas, apiserver)


def test_full_node_objects_mode(
    gas: GasProcess, apiserver: ApiServerDouble, tls_files: TLSFiles
) -> None:
    """nodeCacheCapable: false — the scheduler sends whole Node objects."""
    apiserver.add_node(gpu_node("duo", "0.1", i915="8", memory_max="16G"))
    wait_for_nodes(gas, "duo")
    emulator = SchedulerEmulator(
        apiserver,
        gas.url,
        cert=(tls_files.client_cert, tls_files.client_key),
        verify=tls_files.ca,
        node_cache_capable=False,
    )
    try:
        for name in ("x", "y", "z"):
            apiserver.add_pod(five_g_pod(name))
        assert emulator.schedule_now("default", "x").bound
        assert emulator.schedule_now("default", "y").bound
        third = emulator.schedule_now("default", "z")
        assert not third.bound
        assert "memory.max" in third.failed_nodes["duo"]
    finally:
        emulator.close()
    assert cards_of(apiserver, "x") == ("duo", "card0")
    assert cards_of(apiserver, "y") == ("duo", "card1")


def test_random_workload_never_overcommits_a_card(
    gas: GasProcess, apiserver: ApiServerDouble, scheduler: SchedulerEmulator
) -> None:
    rng = random.Random(7)
    layouts = {"r1": "0", "r2": "0.1", "r4": "0.1.2.3"}
    for name, numbers in layouts.items():
        cards = len(numbers.split("."))
        apiserver.add_node(
            gpu_node(
                name,
                numbers,
                i915=str(4 * cards),
                memory_max=f"{8 * cards}G",
                millicores=str(1000 * cards),
            )
        )
    wait_for_nodes(gas, *layouts)
    bound = 0
    for index in range(40):
        gpus = rng.choice((1, 1, 1, 2))
        pod = gpu_pod(
            f"w{index}",
            container(
                i915=str(gpus),
                memory_max=f"{rng.randint(1, 6) * gpus}G",
                millicores=str(rng.choice((100, 250, 500)) * gpus),
            ),
        )
        apiserver.add_pod(pod)
        outcome = scheduler.schedule_now("default", f"w{index}")
        bound += outcome.bound
        if index % 10 == 9:
            victim = f"w{rng.randrange(index)}"
            if apiserver.get_pod("default", victim) is not None:
                apiserver.delete_pod("default", victim)
    assert bound >= 10
    assert_consistent(gas, apiserver)
