"""When the kubelet asks `GetPreferredAllocation` and when it calls `Allocate` alone, as
kubelet v1.28's device manager (`devicesToAllocate`) decides it, and gas node's answer to
each: the kubelet double copies that decision, these tests hold it to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard
from tests.support.kubelet import Admission, response_cards
from tests.support.nodeproc import NodeRig
from tests.support.objects import container, gpu_node, gpu_pod

I915 = "gpu.intel.com/i915"


@pytest.fixture
def rigs(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> Iterator[Callable[..., NodeRig]]:
    made: list[NodeRig] = []

    def make(cards: list[FakeCard], **options: Any) -> NodeRig:
        apiserver.add_node(gpu_node("n1", ".".join(str(c.number) for c in cards)))
        rig = NodeRig(apiserver, kubeconfig, "n1", cards, tmp_path, run=False, **options)
        made.append(rig)
        rig.wait_registered(shares=1)
        return rig

    yield make
    for rig in made:
        rig.close()


def placed(name: str, cards: str) -> dict[str, Any]:
    return gpu_pod(
        name, container("c", i915="1"), node="n1", annotations={"gas-container-cards": cards}
    )


def cards_given(result: Admission) -> tuple[str, ...]:
    return response_cards(result.responses["c"][I915])


def test_without_a_numa_hint_the_kubelet_asks_even_when_exactly_as_many_are_free(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    """No topology manager policy (or devices without topology): nothing is aligned, so
    the kubelet asks for the plugin's preference whatever the number of free devices."""
    rig = rigs([FakeCard(0), FakeCard(1)], extra=["--shares-per-card", "1"])
    apiserver.add_pod(placed("first", "card1"))
    (first,) = rig.kubelet.sync()
    assert (first.error, first.preferred_calls, cards_given(first)) == ("", 1, ("card1",))
    # One device left, one needed: still asked.
    apiserver.add_pod(placed("second", "card0"))
    (second,) = rig.kubelet.sync()
    assert (second.error, second.preferred_calls, cards_given(second)) == ("", 1, ("card0",))


def test_with_exactly_as_many_aligned_devices_the_kubelet_allocates_without_asking(
    apiserver: ApiServerDouble, rigs: Callable[..., NodeRig]
) -> None:
    """A NUMA hint with exactly as many free devices on the hinted node as needed: the
    kubelet takes them and calls `Allocate` alone, which gas node checks the same way: the
    pod's card gets it, a pod placed on the other NUMA node's card is refused."""
    rig = rigs([FakeCard(0, numa=0), FakeCard(1, numa=1)], extra=["--shares-per-card", "1"])
    rig.kubelet.numa_hint = frozenset({0})
    apiserver.add_pod(placed("here", "card0"))
    (here,) = rig.kubelet.sync()
    assert (here.error, here.preferred_calls, cards_given(here)) == ("", 0, ("card0",))
    apiserver.delete_pod("default", "here")
    rig.kubelet.sync()
    apiserver.add_pod(placed("elsewhere", "card1"))
    (elsewhere,) = rig.kubelet.sync()
    assert elsewhere.preferred_calls == 0
    assert elsewhere.reason == "UnexpectedAdmissionError" and "card1" in elsewhere.error
