"""Descheduling: node policy labels -> the `gpu.aware.scheduling/deschedule-pod` pod label.

The decision (node + pod -> label wanted, unwanted, or left alone) is checked
exhaustively without I/O; the worker's queue, retries and drops against a fake patch
function; and the whole path through a real `gas serve` against the API-server double.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gas.cluster.deschedule import (
    LABEL_VALUE,
    Descheduler,
    PatchRejected,
    PodFacts,
    PodGone,
    annotation_cards,
    annotation_tiles,
    label_patch,
    pod_facts,
    wants_label,
)
from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    LABEL_DESCHEDULE_POD,
    NodeGpu,
    node_from_object,
)
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import wait_for_nodes
from tests.support.objects import gpu_node, gpu_pod
from tests.support.polling import wait_for

POLICY = "telemetry.aware.scheduling.policy/"
DESCHEDULE_CARD0 = POLICY + "gas-deschedule-pods-card0"
DESCHEDULE_CARD1 = POLICY + "gas-deschedule-pods-card1"
DESCHEDULE_TILE = POLICY + "gas-tile-deschedule-card0_gt1"


def node_with(*labels: str, name: str = "n1", **values: str) -> dict[str, Any]:
    node = gpu_node(name, "0.1.2.3", i915="4", tiles="8")
    for key in labels:
        node["metadata"]["labels"][key] = values.get(key, "true")
    return node


def placed_pod(
    name: str,
    cards: str | None = "card0",
    *,
    node: str = "n1",
    tiles: str | None = None,
    label: str | None = None,
    namespace: str = "default",
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod as gas leaves it after a bind (no labels map at all unless `label`)."""
    annotations = {}
    if cards is not None:
        annotations[ANNOTATION_CARDS] = cards
    if tiles is not None:
        annotations[ANNOTATION_TILES] = tiles
    pod = gpu_pod(name, namespace=namespace, node=node, annotations=annotations, phase=phase)
    if label is not None:
        pod["metadata"]["labels"] = {LABEL_DESCHEDULE_POD: label}
    return pod


def with_uid(pod: dict[str, Any], uid: str = "uid-1") -> dict[str, Any]:
    pod["metadata"]["uid"] = uid
    return pod


def listed(*pods: dict[str, Any]) -> list[PodFacts]:
    """A pod list as the controller takes it: the facts of the pods gas placed."""
    return [fact for fact in map(pod_facts, pods) if fact is not None]


# ------------------------------------------------------------------ annotations


def test_annotation_cards_reads_every_card_named_even_when_malformed() -> None:
    assert annotation_cards("card0,card1|card2") == {"card0", "card1", "card2"}
    assert annotation_cards("|card3|") == {"card3"}
    assert annotation_cards("") == frozenset()
    assert annotation_cards("card0,,bogus|card10") == {"card0", "card10"}
    assert annotation_cards("card01,gpu1") == frozenset()


def test_annotation_tiles_reads_card_tile_pairs() -> None:
    assert annotation_tiles("card0:gt0+gt1,card1:gt0|card2:gt3") == {
        ("card0", 0),
        ("card0", 1),
        ("card1", 0),
        ("card2", 3),
    }
    assert annotation_tiles("|") == frozenset()
    assert annotation_tiles("card0:gt1+bad,x:gt2,card1") == {("card0", 1)}


def test_pod_facts_only_for_pods_gas_placed() -> None:
    pod = with_uid(placed_pod("a", "card0,card1", tiles="card0:gt1,card1:gt0", label="x"))
    facts = pod_facts(pod)
    assert facts == PodFacts(
        uid="uid-1",
        namespace="default",
        name="a",
        node="n1",
        cards=frozenset({"card0", "card1"}),
        tiles=frozenset({("card0", 1), ("card1", 0)}),
        label="x",
    )
    assert pod_facts(with_uid(placed_pod("b", cards=None))) is None  # no gas annotation
    assert pod_facts(placed_pod("c")) is None  # no UID
    unbound = with_uid(placed_pod("d"))
    del unbound["spec"]["nodeName"]
    assert pod_facts(unbound) is None
    deleting = with_uid(placed_pod("e", phase="Succeeded"))
    deleting["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    facts = pod_facts(deleting)
    assert facts is not None and facts.terminal and facts.deleting


def test_node_policy_labels_feed_the_descheduled_fields() -> None:
    node = node_with(DESCHEDULE_CARD0, DESCHEDULE_TILE)
    node["metadata"]["labels"]["gpu.intel.com/pci-groups"] = "0.1_2.3"
    node["metadata"]["labels"][POLICY + "gas-deschedule-pods-card2"] = "PCI_GROUP"
    node["metadata"]["labels"][POLICY + "gas-tile-disable-card3_gt0"] = "true"
    gpu = node_from_object(node)
    assert gpu.descheduled == {"card0", "card2", "card3"}
    # Disabling a tile takes it out of service; only the deschedule label moves pods.
    assert gpu.descheduled_tiles == {"card0": {1}}


# ------------------------------------------------------------------ the decision

PHASES = ("Pending", "Running", "Succeeded", "Failed")
NODE_STATES = ("unknown", "unreadable", "other-node", "clean", "card", "tile", "card+tile")
CARD_USES = ("descheduled", "other", "mixed")
TILE_USES = (None, "descheduled", "other")
LABELS = (None, LABEL_VALUE, "other")


def decision_node(state: str) -> NodeGpu | None:
    if state == "unknown":
        return None
    if state == "unreadable":
        return NodeGpu(name="n1", problem="gpu: node label is malformed")
    labels = {
        "other-node": [DESCHEDULE_CARD0],
        "clean": [],
        "card": [DESCHEDULE_CARD0],
        "tile": [DESCHEDULE_TILE],
        "card+tile": [DESCHEDULE_CARD0, DESCHEDULE_TILE],
    }[state]
    name = "n2" if state == "other-node" else "n1"
    node = node_from_object(node_with(*labels, name=name))
    assert node.problem is None
    return node


@pytest.mark.parametrize("phase", PHASES)
def test_decision_exhaustively(phase: str) -> None:
    cases = 0
    for node_state, cards, tiles, label, deleting in itertools.product(
        NODE_STATES, CARD_USES, TILE_USES, LABELS, (False, True)
    ):
        card_text = {"descheduled": "card0", "other": "card1", "mixed": "card1,card2|card0"}
        tile_text = {None: None, "descheduled": "card0:gt0+gt1", "other": "card0:gt0"}
        pod = with_uid(
            placed_pod("p", card_text[cards], tiles=tile_text[tiles], label=label, phase=phase)
        )
        if deleting:
            pod["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
        facts = pod_facts(pod)
        assert facts is not None
        node = decision_node(node_state)
        # The rule stated independently of the implementation.
        left_alone = (
            phase in ("Succeeded", "Failed")
            or deleting
            or node_state in ("unknown", "unreadable", "other-node")
        )
        on_card = cards in ("descheduled", "mixed") and node_state in ("card", "card+tile")
        on_tile = tiles == "descheduled" and node_state in ("tile", "card+tile")
        expected = None if left_alone else (on_card or on_tile)
        assert wants_label(node, facts) is expected, (node_state, cards, tiles, label)

        patch = label_patch(node, facts)
        if expected is True and label != LABEL_VALUE:
            assert patch == {
                "metadata": {"uid": "uid-1", "labels": {LABEL_DESCHEDULE_POD: LABEL_VALUE}}
            }
        elif expected is False and label is not None:
            assert patch == {"metadata": {"uid": "uid-1", "labels": {LABEL_DESCHEDULE_POD: None}}}
        else:
            assert patch is None, (node_state, cards, tiles, label)
        cases += 1
    assert cases == len(NODE_STATES) * len(CARD_USES) * len(TILE_USES) * len(LABELS) * 2


def test_pci_group_deschedules_the_whole_group() -> None:
    node = node_with(POLICY + "gas-deschedule-pods-card1", **{})
    node["metadata"]["labels"]["gpu.intel.com/pci-groups"] = "0.1_2.3"
    node["metadata"]["labels"][POLICY + "gas-deschedule-pods-card1"] = "PCI_GROUP"
    gpu = node_from_object(node)
    for card, expected in (("card0", True), ("card1", True), ("card2", False)):
        facts = pod_facts(with_uid(placed_pod("p", card)))
        assert facts is not None
        assert wants_label(gpu, facts) is expected, card


# ------------------------------------------------------------------ the worker


class FakeApi:
    """Records patches and answers them from a script (default: success)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.script: list[Exception | None] = []
        self.lock = threading.Lock()

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append((namespace, name, patch))
            outcome = self.script.pop(0) if self.script else None
        if outcome is not None:
            raise outcome


@pytest.fixture
def worker() -> Iterator[tuple[Descheduler, FakeApi]]:
    api = FakeApi()
    stop = threading.Event()
    descheduler = Descheduler(api.patch, stop)
    descheduler.BASE_DELAY = 0.01
    descheduler.start()
    yield descheduler, api
    stop.set()
    descheduler.wake()
    descheduler.join(timeout=5)


def settle(descheduler: Descheduler) -> None:
    wait_for(lambda: descheduler.pending() == 0, what="descheduler queue to drain")
    time.sleep(0.05)


def test_worker_patches_once_per_difference(worker: tuple[Descheduler, FakeApi]) -> None:
    descheduler, api = worker
    pod = with_uid(placed_pod("a", "card0"))
    descheduler.pods_listed(listed(pod, with_uid(placed_pod("b", "card1"), "uid-2")))
    descheduler.nodes_listed([node_from_object(node_with())])
    settle(descheduler)
    assert api.calls == []
    node = node_from_object(node_with(DESCHEDULE_CARD0))
    for _ in range(5):  # repeated node events queue the pod once
        descheduler.node_changed(node)
    settle(descheduler)
    assert [(ns, name) for ns, name, _ in api.calls] == [("default", "a")]
    assert api.calls[0][2]["metadata"]["labels"] == {LABEL_DESCHEDULE_POD: LABEL_VALUE}


def test_a_gated_worker_sends_only_while_active(worker: tuple[Descheduler, FakeApi]) -> None:
    descheduler, api = worker
    active = threading.Event()
    descheduler.gate(active.is_set)
    descheduler.nodes_listed([node_from_object(node_with(DESCHEDULE_CARD0))])
    descheduler.pods_listed(
        listed(with_uid(placed_pod("a", "card0")), with_uid(placed_pod("b", "card0"), "uid-2"))
    )
    time.sleep(0.7)  # more than one of the worker's half-second waits
    assert api.calls == [] and descheduler.pending() == 2
    # Meanwhile the replica that leads labelled b: once active, only a is patched.
    labelled = with_uid(placed_pod("b", "card0", label=LABEL_VALUE), "uid-2")
    descheduler.pod_changed(labelled)
    active.set()
    settle(descheduler)
    assert [name for _, name, _ in api.calls] == ["a"]


def test_worker_retries_failures_with_backoff(worker: tuple[Descheduler, FakeApi]) -> None:
    descheduler, api = worker
    api.script = [RuntimeError("500"), RuntimeError("timeout"), None]
    descheduler.nodes_listed([node_from_object(node_with(DESCHEDULE_CARD0))])
    descheduler.pods_listed(listed(with_uid(placed_pod("a", "card0"))))
    wait_for(lambda: len(api.calls) == 3, what="two retries")
    settle(descheduler)
    assert len(api.calls) == 3
    assert descheduler.patched == 1 and descheduler.failed == 2


def test_worker_drops_gone_and_rejected_pods(worker: tuple[Descheduler, FakeApi]) -> None:
    descheduler, api = worker
    api.script = [PodGone("404"), PatchRejected("403")]
    descheduler.nodes_listed([node_from_object(node_with(DESCHEDULE_CARD0))])
    descheduler.pods_listed(listed(with_uid(placed_pod("a", "card0"))))
    descheduler.pod_changed(with_uid(placed_pod("b", "card0"), "uid-2"))
    wait_for(lambda: len(api.calls) == 2, what="both patches")
    settle(descheduler)
    assert len(api.calls) == 2


def test_worker_forgets_deleted_pods_waiting_for_retry(
    worker: tuple[Descheduler, FakeApi],
) -> None:
    descheduler, api = worker
    descheduler.BASE_DELAY = 0.3
    api.script = [RuntimeError("500")]
    pod = with_uid(placed_pod("a", "card0"))
    descheduler.nodes_listed([node_from_object(node_with(DESCHEDULE_CARD0))])
    descheduler.pods_listed(listed(pod))
    wait_for(lambda: len(api.calls) == 1, what="first patch")
    descheduler.pod_removed(pod)
    time.sleep(0.6)
    assert len(api.calls) == 1


def test_worker_keys_pods_by_uid_not_name(worker: tuple[Descheduler, FakeApi]) -> None:
    descheduler, api = worker
    descheduler.nodes_listed([node_from_object(node_with(DESCHEDULE_CARD1))])
    descheduler.pods_listed(
        listed(
            with_uid(placed_pod("same", "card0", namespace="ns1"), "uid-1"),
            with_uid(placed_pod("same", "card1", namespace="ns2"), "uid-2"),
        )
    )
    settle(descheduler)
    assert [(ns, name, p["metadata"]["uid"]) for ns, name, p in api.calls] == [
        ("ns2", "same", "uid-2")
    ]


# ------------------------------------------------------------------ end to end

StartGas = Callable[..., GasProcess]


def label_of(apiserver: ApiServerDouble, name: str, namespace: str = "default") -> str | None:
    pod = apiserver.get_pod(namespace, name)
    assert pod is not None, name
    value = (pod["metadata"].get("labels") or {}).get(LABEL_DESCHEDULE_POD)
    return value if isinstance(value, str) else None


def wait_label(
    apiserver: ApiServerDouble, name: str, value: str | None, namespace: str = "default"
) -> None:
    wait_for(
        lambda: label_of(apiserver, name, namespace) == value,
        what=f"{namespace}/{name} deschedule label {value!r}",
    )


def patches(apiserver: ApiServerDouble, name: str = "") -> int:
    return apiserver.count_requests("PATCH", rf"/pods/{name}")


def set_node_labels(apiserver: ApiServerDouble, *labels: str) -> None:
    apiserver.put_node(node_with(*labels))


def test_label_follows_the_node_label(apiserver: ApiServerDouble, gas: GasProcess) -> None:
    set_node_labels(apiserver)
    apiserver.add_pod(placed_pod("on-card0", "card0"))  # no labels map at all
    apiserver.add_pod(placed_pod("on-card1", "card1"))
    apiserver.add_pod(placed_pod("done", "card0", phase="Succeeded"))
    apiserver.add_pod(placed_pod("not-gas", cards=None))
    wait_for_nodes(gas, "n1")
    time.sleep(0.3)
    assert patches(apiserver) == 0

    set_node_labels(apiserver, DESCHEDULE_CARD0)
    wait_label(apiserver, "on-card0", LABEL_VALUE)
    # The label went in through a merge patch on a pod without any labels.
    assert patches(apiserver, "on-card0") == 1
    time.sleep(0.3)
    for untouched in ("on-card1", "done", "not-gas"):
        assert label_of(apiserver, untouched) is None
        assert patches(apiserver, untouched) == 0

    set_node_labels(apiserver)
    wait_label(apiserver, "on-card0", None)
    assert patches(apiserver) == 2

    # A pod that moves onto a descheduled card (an annotation edit) gets the label, and
    # loses it again when it is no longer there.
    set_node_labels(apiserver, DESCHEDULE_CARD1)
    wait_label(apiserver, "on-card1", LABEL_VALUE)
    apiserver.patch_pod(
        "default", "on-card1", {"metadata": {"annotations": {ANNOTATION_CARDS: "card2"}}}
    )
    wait_label(apiserver, "on-card1", None)
    time.sleep(0.3)
    assert label_of(apiserver, "on-card0") is None


def test_tile_labels_deschedule_pods_on_that_tile(
    apiserver: ApiServerDouble, gas: GasProcess
) -> None:
    set_node_labels(apiserver, DESCHEDULE_TILE)
    apiserver.add_pod(placed_pod("tile1", "card0", tiles="card0:gt1"))
    apiserver.add_pod(placed_pod("tile0", "card0", tiles="card0:gt0"))
    wait_label(apiserver, "tile1", LABEL_VALUE)
    time.sleep(0.3)
    assert label_of(apiserver, "tile0") is None
    # A card label and a tile label: the pod keeps the label until both have gone.
    set_node_labels(apiserver, DESCHEDULE_TILE, DESCHEDULE_CARD0)
    wait_label(apiserver, "tile0", LABEL_VALUE)
    set_node_labels(apiserver, DESCHEDULE_CARD0)
    time.sleep(0.3)
    assert label_of(apiserver, "tile1") == LABEL_VALUE
    set_node_labels(apiserver)
    wait_label(apiserver, "tile1", None)
    wait_label(apiserver, "tile0", None)


def test_start_repairs_stale_and_missing_labels(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    set_node_labels(apiserver, DESCHEDULE_CARD1)
    apiserver.add_pod(placed_pod("stale", "card0", label=LABEL_VALUE))
    apiserver.add_pod(placed_pod("missing", "card1"))
    apiserver.add_pod(placed_pod("same", "card0", namespace="ns1"))
    apiserver.add_pod(placed_pod("same", "card1", namespace="ns2"))
    apiserver.add_pod(placed_pod("done", "card1", phase="Failed"))
    apiserver.add_pod(placed_pod("done-stale", "card0", phase="Succeeded", label=LABEL_VALUE))
    foreign = placed_pod("foreign", cards=None, label=LABEL_VALUE)
    apiserver.add_pod(foreign)
    foreign_rv = apiserver.get_pod("default", "foreign")

    gas = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    gas.wait_ready()
    wait_label(apiserver, "stale", None)
    wait_label(apiserver, "missing", LABEL_VALUE)
    wait_label(apiserver, "same", LABEL_VALUE, namespace="ns2")
    time.sleep(0.3)
    assert label_of(apiserver, "same", namespace="ns1") is None
    assert label_of(apiserver, "done") is None
    assert label_of(apiserver, "done-stale") == LABEL_VALUE
    assert apiserver.get_pod("default", "foreign") == foreign_rv
    # Only the three pods whose label was wrong were written to (the lists of nodes and
    # pods may race and cost a repeated, idempotent patch of one of them).
    patched = {path for method, path in apiserver.requests if method == "PATCH"}
    assert patched == {
        "/api/v1/namespaces/default/pods/stale",
        "/api/v1/namespaces/default/pods/missing",
        "/api/v1/namespaces/ns2/pods/same",
    }


def test_a_failed_patch_is_retried(apiserver: ApiServerDouble, gas: GasProcess) -> None:
    apiserver.add_pod(placed_pod("flaky", "card0"))
    set_node_labels(apiserver)
    wait_for_nodes(gas, "n1")
    apiserver.faults.add("PATCH", r"/pods/flaky$", ("status", 500), times=2)
    set_node_labels(apiserver, DESCHEDULE_CARD0)
    wait_label(apiserver, "flaky", LABEL_VALUE)
    assert patches(apiserver, "flaky") >= 3
    assert "retry 2" in gas.log()


def _ready(gas: GasProcess) -> bool:
    try:
        return gas.session.get(gas.url + "/readyz", timeout=2).status_code == 200
    except Exception:
        return False


def test_only_the_replica_that_leads_writes_labels(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    set_node_labels(apiserver)
    apiserver.add_pod(placed_pod("on-card0", "card0"))
    elect = [
        "--leaderElect",
        "--leaderElectNamespace=gas-system",
        "--leaseDuration=2s",
        "--renewDeadline=1500ms",
        "--retryPeriod=0.3s",
    ]
    replicas = [start_gas(["--kubeConfig", kubeconfig, *elect], tls=tls_files) for _ in "ab"]
    leader = wait_for(
        lambda: next((g for g in replicas if _ready(g)), None), timeout=30, what="a leader"
    )
    follower = replicas[1 - replicas.index(leader)]
    for replica in replicas:
        wait_for_nodes(replica, "n1")
    # Each patch is held a while before it is applied: a replica that wrote would not see
    # the other's label in time, and each would write it.
    apiserver.faults.add("PATCH", r"/pods/on-card0$", ("delay", 1.0), times=None)
    set_node_labels(apiserver, DESCHEDULE_CARD0)
    wait_label(apiserver, "on-card0", LABEL_VALUE)
    time.sleep(1.5)
    assert patches(apiserver, "on-card0") == 1

    # The other replica writes once it leads.
    apiserver.faults.clear()
    leader.kill()
    wait_for(lambda: _ready(follower), timeout=30, what="the follower leading")
    set_node_labels(apiserver)
    wait_label(apiserver, "on-card0", None)
    time.sleep(0.5)
    assert patches(apiserver, "on-card0") == 2
