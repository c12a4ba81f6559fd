"""The node's labels and GPU capacity written by the node agent's publisher with the real
`kubernetes` client against the API-server double: the right totals, kept in step as cards
are unplugged and plugged back, and nothing else of the node touched."""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.core.model import LABEL_CARDS, LABEL_GPU_NUMBERS
from gas.host.discovery import discover_sysfs
from gas.host.kubeapi import core_api
from gas.host.labels import LABEL_TILES
from gas.host.watch import CardWatcher
from gas.node.capacity import MEMORY, MILLICORES, apply_capacity
from gas.node.publish import NodePublisher
from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import GIB, FakeCard, add_card, remove_card, write_sysfs
from tests.support.polling import wait_for

OWNED = (MEMORY, MILLICORES, LABEL_TILES)
STATUS_PATCH = r"^/api/v1/nodes/n1/status$"


def rich_node() -> dict[str, Any]:
    """A node as a kubelet keeps it, with a device plugin's resource already advertised."""
    resources = {
        "cpu": "16",
        "memory": "65846060Ki",
        "pods": "110",
        "ephemeral-storage": "479151816Ki",
        "hugepages-2Mi": "0",
        "gpu.intel.com/i915": "20",
    }
    return {
        "metadata": {
            "name": "n1",
            "labels": {"kubernetes.io/hostname": "n1", "kubernetes.io/os": "linux"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.1.0/24", "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources, cpu="15500m"),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2024-05-01T10:00:00Z",
                    "lastTransitionTime": "2024-05-01T09:00:00Z",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.11"},
                {"type": "Hostname", "address": "n1"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.28.4", "kernelVersion": "6.5.0"},
            "images": [{"names": ["busybox:latest"], "sizeBytes": 4261550}],
        },
    }


def kubelet_status_update(apiserver: ApiServerDouble, name: str = "n1") -> None:
    """What the kubelet's next status update does to extended resources: allocatable
    follows capacity, and loses those no longer in capacity."""
    node = apiserver.get_node(name)
    assert node is not None
    status = node["status"]
    allocatable = status.setdefault("allocatable", {})
    for key in [k for k in allocatable if k.startswith("gpu.intel.com/")]:
        if key not in status["capacity"]:
            del allocatable[key]
    allocatable.update({k: v for k, v in status["capacity"].items() if k in OWNED})
    apiserver.put_node(node)


def owned(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k in OWNED}


def without_owned(status: dict[str, Any]) -> dict[str, Any]:
    status = copy.deepcopy(status)
    for part in ("capacity", "allocatable"):
        for key in OWNED:
            status.get(part, {}).pop(key, None)
    return status


def node_of(apiserver: ApiServerDouble) -> dict[str, Any]:
    node = apiserver.get_node("n1")
    assert node is not None
    return node


@pytest.fixture
def api(kubeconfig: str) -> Any:
    return core_api(kubeconfig)


CARDS = [
    FakeCard(0, "i915", tiles=2, lmem_per_tile=16 * GIB),
    FakeCard(1, "i915", tiles=2, lmem_per_tile=16 * GIB, numa=1),
    FakeCard(2, "xe", tiles=1, lmem_per_tile=None),
]


def test_right_totals_and_nothing_else_changes(
    apiserver: ApiServerDouble, api: Any, tmp_path: Path
) -> None:
    apiserver.add_node(rich_node())
    before = node_of(apiserver)
    sysfs = write_sysfs(tmp_path / "sys", CARDS)
    cards = discover_sysfs(sysfs, memory_reserved=GIB, memory_override=8 * GIB)
    assert NodePublisher(api, "n1", numa=True).publish(cards)

    after = node_of(apiserver)
    assert owned(after["status"]["capacity"]) == {
        MEMORY: str((32 - 1) * 2 * GIB + 8 * GIB),
        MILLICORES: "3000",
        LABEL_TILES: "5",
    }
    # The whole status is as it was apart from those three keys; spec and metadata too.
    assert after["status"] == before["status"] | {
        "capacity": before["status"]["capacity"] | owned(after["status"]["capacity"])
    }
    assert after["spec"] == before["spec"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"] | {
        LABEL_GPU_NUMBERS: "0.1.2",
        LABEL_CARDS: "card0.card1.card2",
        "gpu.intel.com/numa-gpu-map": "0-0.2_1-1",
        LABEL_TILES: "5",
    }
    assert apiserver.count_requests("PATCH", STATUS_PATCH) == 1

    # Nothing to change: no write at all.
    version = apiserver.resource_version
    assert NodePublisher(api, "n1", numa=True).publish(cards)
    assert apiserver.resource_version == version


def test_canonical_quantities_are_no_change(apiserver: ApiServerDouble, api: Any) -> None:
    node = rich_node()
    node["status"]["capacity"] |= {MEMORY: "64Gi", MILLICORES: "2k", LABEL_TILES: "4"}
    apiserver.add_node(node)
    desired = {MEMORY: str(64 * GIB), MILLICORES: "2000", LABEL_TILES: "4"}
    assert apply_capacity(api, "n1", desired) == {}
    assert apiserver.count_requests("PATCH", STATUS_PATCH) == 0
    assert apply_capacity(api, "n1", desired | {LABEL_TILES: "8"}) == {LABEL_TILES: "8"}
    assert node_of(apiserver)["status"]["capacity"][LABEL_TILES] == "8"


def test_no_cards_removes_the_keys_and_the_labels(
    apiserver: ApiServerDouble, api: Any, tmp_path: Path
) -> None:
    apiserver.add_node(rich_node())
    before = node_of(apiserver)
    cards = discover_sysfs(write_sysfs(tmp_path / "sys", CARDS))
    publisher = NodePublisher(api, "n1")
    assert publisher.publish(cards)
    kubelet_status_update(apiserver)
    assert owned(node_of(apiserver)["status"]["allocatable"])

    # Capacity goes first; the labels wait for the kubelet to drop allocatable.
    assert not publisher.publish([])
    assert LABEL_GPU_NUMBERS in node_of(apiserver)["metadata"]["labels"]
    assert owned(node_of(apiserver)["status"]["capacity"]) == {}
    kubelet_status_update(apiserver)
    assert publisher.publish([])
    after = node_of(apiserver)
    assert after["status"] == before["status"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]


def test_labels_follow_anyway_when_allocatable_never_does(
    apiserver: ApiServerDouble, api: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.add_node(rich_node())
    cards = discover_sysfs(write_sysfs(tmp_path / "sys", CARDS))
    now = [0.0]
    publisher = NodePublisher(api, "n1", allocatable_wait=60, clock=lambda: now[0])
    assert publisher.publish(cards)
    kubelet_status_update(apiserver)
    assert not publisher.publish(cards[:1])
    now[0] = 59.0
    assert not publisher.publish(cards[:1])
    now[0] = 60.0
    with caplog.at_level(logging.WARNING):
        assert publisher.publish(cards[:1])
    assert node_of(apiserver)["metadata"]["labels"][LABEL_GPU_NUMBERS] == "0"
    assert "allocatable still above the new capacity after 60 s" in caplog.text


class Uevents:
    """A kernel event source the test feeds: `send("remove card1")`."""

    def __init__(self) -> None:
        self.events: queue.Queue[str] = queue.Queue()

    def send(self, event: str) -> None:
        self.events.put(event)

    def __call__(self, timeout: float | None) -> str | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None


@pytest.fixture
def watched(apiserver: ApiServerDouble, api: Any, tmp_path: Path) -> Iterator[tuple[Path, Uevents]]:
    """A watcher over a fake sysfs tree, publishing node n1, running in a thread."""
    apiserver.add_node(rich_node())
    sysfs = write_sysfs(tmp_path / "sys", CARDS)
    events = Uevents()
    publisher = NodePublisher(api, "n1")
    watcher = CardWatcher(
        lambda: discover_sysfs(sysfs), publisher.publish, events, debounce=0.05, wake=0.1
    )
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop.is_set,), daemon=True)
    thread.start()
    yield sysfs, events
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_capacity_follows_hot_unplug_and_replug(
    apiserver: ApiServerDouble, watched: tuple[Path, Uevents]
) -> None:
    sysfs, events = watched

    def state() -> tuple[str, dict[str, Any], dict[str, Any]]:
        node = node_of(apiserver)
        labels = node["metadata"]["labels"]
        return (
            labels.get(LABEL_GPU_NUMBERS, ""),
            owned(node["status"]["capacity"]),
            owned(node["status"].get("allocatable", {})),
        )

    three = {MEMORY: str(64 * GIB), MILLICORES: "3000", LABEL_TILES: "5"}
    wait_for(lambda: state()[:2] == ("0.1.2", three), what="the first publication")
    kubelet_status_update(apiserver)
    before = node_of(apiserver)

    remove_card(sysfs, CARDS[1])
    events.send("remove card1")
    one_less = {MEMORY: str(32 * GIB), MILLICORES: "2000", LABEL_TILES: "3"}
    wait_for(lambda: state()[1] == one_less, what="capacity after the unplug")
    # The labels still name card1 until allocatable has come down.
    assert state()[0] == "0.1.2"
    kubelet_status_update(apiserver)
    wait_for(lambda: state() == ("0.2", one_less, one_less), what="labels after the unplug")
    # nothing else of the node changed on the way
    after = node_of(apiserver)
    assert without_owned(after["status"]) == without_owned(before["status"])
    assert after["spec"] == before["spec"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    gpu_labels = (LABEL_GPU_NUMBERS, LABEL_CARDS, LABEL_TILES)
    assert {k: v for k, v in after["metadata"]["labels"].items() if k not in gpu_labels} == {
        k: v for k, v in before["metadata"]["labels"].items() if k not in gpu_labels
    }

    add_card(sysfs, CARDS[1])
    events.send("add card1")
    wait_for(lambda: state()[:2] == ("0.1.2", three), what="labels and capacity after replug")
