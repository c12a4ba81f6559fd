"""`gas inspect` / `kubectl gas`: allocation per node and card, recomputed from the
cluster's pod annotations, read with the real `kubernetes` client from the API-server
double; drift against a real gas process and against hand-written ledgers."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gas.cli import main
from gas.core.model import ANNOTATION_NODE_CARDS, I915
from gas.tools.audit import over_capacity, usage_from_pods
from gas.tools.inspector.command import kubectl_main
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import assert_consistent, wait_for_nodes
from tests.support.objects import GI, MEM, bound_pod, container, gpu_node, gpu_pod
from tests.support.scheduler import SchedulerEmulator

ROOT = Path(__file__).resolve().parents[2]


# A fixed gas-ts: these pods are the same objects on every run.
bound = functools.partial(bound_pod, ts="1700000000000000000")


class Inspect:
    """`gas inspect --kubeConfig <double> ARGS` in this process: (exit status, stdout);
    `err` keeps the last stderr."""

    def __init__(self, kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.kubeconfig = kubeconfig
        self.capsys = capsys
        self.err = ""

    def __call__(self, *args: str) -> tuple[int, str]:
        self.capsys.readouterr()
        status = main(["inspect", "--kubeConfig", self.kubeconfig, *args])
        captured = self.capsys.readouterr()
        self.err = captured.err
        return status, captured.out


@pytest.fixture
def inspect(kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> Inspect:
    return Inspect(kubeconfig, capsys)


def small_cluster(api: ApiServerDouble) -> None:
    api.add_node(gpu_node("gpu-1card", "0", i915="4", memory_max="8Gi", millicores="1000"))
    api.add_node(gpu_node("gpu-2cards", "0.1", i915="8", memory_max="16Gi", millicores="2000"))
    # GPU resources advertised, but the labeller has not run: gas sends it no GPU pod.
    api.add_node(
        {
            "metadata": {"name": "gpu-unlabelled"},
            "status": {"allocatable": {"gpu.intel.com/i915": "1"}},
        }
    )
    api.add_node({"metadata": {"name": "cpu-only"}, "status": {"allocatable": {"cpu": "8"}}})
    api.add_pod(
        bound(
            "train", "gpu-1card", "card0", container(i915="1", memory_max="5Gi", millicores="300")
        )
    )
    api.add_pod(
        bound(
            "two-ctr",
            "gpu-2cards",
            "card0|card1",
            container("a", i915="1", memory_max="2Gi"),
            container("b", i915="1", memory_max="3Gi", millicores="500"),
            namespace="ml",
        )
    )
    # One container on two cards: half of each request on each card.
    api.add_pod(
        bound(
            "pair",
            "gpu-2cards",
            "card0,card1",
            container(i915="2", memory_max="4Gi", millicores="200"),
        )
    )
    # Finished pods hold nothing, whatever their annotation says.
    api.add_pod(
        bound(
            "finished",
            "gpu-1card",
            "card0",
            container(i915="1", memory_max="8Gi"),
            phase="Succeeded",
        )
    )
    api.add_pod(
        bound(
            "crashed", "gpu-2cards", "card1", container(i915="1", memory_max="16Gi"), phase="Failed"
        )
    )
    api.add_pod(gpu_pod("waiting", container(i915="1", memory_max="1Gi")))


SMALL_TABLE = """\
NODE            CARD   STATUS    i915  memory.max  millicores  PODS
gpu-1card       card0  ok        1/4   5Gi/8Gi     300/1000    default/train
gpu-2cards      card0  ok        2/4   4Gi/8Gi     100/1000    default/pair, ml/two-ctr
gpu-2cards      card1  ok        2/4   5Gi/8Gi     600/1000    default/pair, ml/two-ctr
gpu-unlabelled  -      unusable  -     -           -

Warnings:
  gpu-unlabelled: gpu: node has no gpu.intel.com/gpu-numbers or gpu.intel.com/cards label

Total: 3 nodes, 3 cards, 3 pods; i915 5/12, memory.max 14Gi/24Gi, millicores 1000/3000 \
(1 node without GPUs not shown)
"""


def test_table_of_a_small_cluster(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    small_cluster(apiserver)
    status, out = inspect()
    assert out == SMALL_TABLE
    assert status == 0  # a node without labels is a warning, not a failure


def larger_cluster(api: ApiServerDouble) -> None:
    small_cluster(api)
    # Cards numbered 0, 1, 2 and 10: shown in numeric order (GAS sorts card10 before card2).
    api.add_node(gpu_node("gpu-4cards", "0.1.2.10", i915="8", memory_max="32Gi", tiles="8"))
    api.add_pod(
        bound(
            "multi", "gpu-4cards", "card2,card10", container(i915="2", memory_max="8Gi", tiles="2")
        )
    )
    # A GPU container and a sidecar without GPUs: an empty segment for the sidecar.
    api.add_pod(
        bound(
            "with-sidecar",
            "gpu-4cards",
            "card2|",
            container("app", i915="1", memory_max="1Gi", tiles="1"),
            container("proxy"),
            namespace="ml",
        )
    )
    # Two segments for one container: gas fails closed on the cards it names.
    api.add_pod(bound("broken", "gpu-4cards", "card1|card0", container(i915="1")))
    # No card can be made out at all: the whole node counts as full.
    api.add_pod(bound("garbled", "gpu-1card", "#!?", container(i915="1"), namespace="ml"))
    # Bound around the extender (nodeName set by hand): gas does not know about it.
    api.add_pod(gpu_pod("rogue", container(i915="1"), node="gpu-2cards", phase="Running"))


def test_json_of_a_larger_cluster(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    larger_cluster(apiserver)
    status, out = inspect("-o", "json")
    report = json.loads(out)
    assert report == LARGER_JSON
    assert status == 1  # unreadable annotations
    # The same numbers the ledger's arithmetic gives, card by card.
    usage = usage_from_pods(apiserver.list_pods())
    for node in report["nodes"]:
        for card in node["cards"]:
            for res, amounts in card["resources"].items():
                want = usage.get(node["name"], {}).get(card["name"], {})
                assert amounts["allocated"] == want.get("gpu.intel.com/" + res, 0)


def card(
    name: str,
    resources: dict[str, tuple[int, int]],
    pods: list[str] | None = None,
    blocked_by: list[str] | None = None,
    *,
    blocked: bool = False,
) -> dict[str, Any]:
    return {
        "name": name,
        "listed": True,
        "over_capacity": False,
        "blocked": blocked,
        "resources": {r: {"allocated": a, "capacity": c} for r, (a, c) in resources.items()},
        "pods": pods or [],
        "blocked_by": blocked_by or [],
        "handed_out": [],
        "node_drift": [],
    }


# A node of the inspector's report, not a Kubernetes Node.
def node(name: str, cards: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"name": name, "problem": None, "blocked_by": [], **fields, "cards": cards}


UNLABELLED = "gpu: node has no gpu.intel.com/gpu-numbers or gpu.intel.com/cards label"
LARGER_JSON: dict[str, Any] = {
    "nodes": [
        node(
            "gpu-1card",
            [
                card(
                    "card0",
                    {"i915": (1, 4), "memory.max": (5 * GI, 8 * GI), "millicores": (300, 1000)},
                    ["default/train"],
                    blocked=True,
                )
            ],
            blocked_by=["ml/garbled"],
        ),
        node(
            "gpu-2cards",
            [
                card(
                    "card0",
                    {"i915": (2, 4), "memory.max": (4 * GI, 8 * GI), "millicores": (100, 1000)},
                    ["default/pair", "ml/two-ctr"],
                ),
                card(
                    "card1",
                    {"i915": (2, 4), "memory.max": (5 * GI, 8 * GI), "millicores": (600, 1000)},
                    ["default/pair", "ml/two-ctr"],
                ),
            ],
        ),
        node(
            "gpu-4cards",
            [
                card(
                    "card0",
                    {"i915": (0, 2), "memory.max": (0, 8 * GI), "tiles": (0, 2)},
                    blocked_by=["default/broken"],
                    blocked=True,
                ),
                card(
                    "card1",
                    {"i915": (0, 2), "memory.max": (0, 8 * GI), "tiles": (0, 2)},
                    blocked_by=["default/broken"],
                    blocked=True,
                ),
                card(
                    "card2",
                    {"i915": (2, 2), "memory.max": (5 * GI, 8 * GI), "tiles": (2, 2)},
                    ["default/multi", "ml/with-sidecar"],
                ),
                card(
                    "card10",
                    {"i915": (1, 2), "memory.max": (4 * GI, 8 * GI), "tiles": (1, 2)},
                    ["default/multi"],
                ),
            ],
        ),
        node("gpu-unlabelled", [], problem=UNLABELLED),
    ],
    "totals": {
        "nodes": 4,
        "cards": 7,
        "pods": 7,
        "nodes_without_gpus": 1,
        "resources": {
            "i915": {"allocated": 8, "capacity": 20},
            "memory.max": {"allocated": 23 * GI, "capacity": 56 * GI},
            "millicores": {"allocated": 1000, "capacity": 3000},
            "tiles": {"allocated": 3, "capacity": 8},
        },
    },
    "problems": [
        {
            "kind": "annotation",
            "node": "gpu-1card",
            "card": None,
            "pod": "ml/garbled",
            "message": "pod ml/garbled on gpu-1card: gas-container-cards='#!?' cannot be read; "
            "gas counts the whole node as full",
        },
        {
            "kind": "annotation",
            "node": "gpu-4cards",
            "card": None,
            "pod": "default/broken",
            "message": "pod default/broken on gpu-4cards: gas-container-cards='card1|card0' "
            "cannot be read; gas counts card0, card1 as full",
        },
    ],
    "warnings": [
        {
            "kind": "unaccounted",
            "node": "gpu-2cards",
            "card": None,
            "pod": "default/rogue",
            "message": "pod default/rogue on gpu-2cards uses GPUs but has no gas-container-cards "
            "annotation: gas does not account it (scheduled around the extender?)",
        },
        {
            "kind": "node",
            "node": "gpu-unlabelled",
            "card": None,
            "pod": None,
            "message": f"gpu-unlabelled: {UNLABELLED}",
        },
    ],
    "drift": None,
}


def test_json_keys_come_in_a_stable_order(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    larger_cluster(apiserver)
    _, out = inspect("-o", "json")
    assert out == json.dumps(LARGER_JSON, indent=2) + "\n"


# ------------------------------------------------------------------ the node side


def handed(
    name: str,
    node: str,
    cards: str,
    node_cards: str,
    *containers: dict[str, Any],
    namespace: str = "default",
) -> dict[str, Any]:
    """A running pod gas bound, whose node side recorded what it handed out."""
    pod = bound(name, node, cards, *containers, namespace=namespace)
    pod["metadata"]["annotations"][ANNOTATION_NODE_CARDS] = node_cards
    return pod


def node_side_cluster(api: ApiServerDouble) -> None:
    api.add_node(gpu_node("n1", "0.1.2", i915="6", memory_max="24Gi"))
    api.add_pod(handed("same", "n1", "card0", "card0", container(i915="1", memory_max="2Gi")))
    # gas counted card1, the container runs on card2.
    api.add_pod(handed("swapped", "n1", "card1", "card2", container(i915="1", memory_max="4Gi")))
    api.add_pod(
        handed(
            "sidecar",
            "n1",
            "card1|",
            "card1|",
            container("app", i915="1", memory_max="1Gi"),
            container("proxy"),
            namespace="ml",
        )
    )
    # Bound, not started yet: nothing handed out, nothing to compare.
    api.add_pod(bound("starting", "n1", "card2", container(i915="1", memory_max="1Gi")))
    api.add_pod(handed("garbled", "n1", "card0", "card0|card1", container(i915="1")))
    # Scheduled around gas, and given a card by the node side all the same.
    api.add_pod(
        gpu_pod(
            "rogue",
            container(i915="1"),
            node="n1",
            phase="Running",
            annotations={ANNOTATION_NODE_CARDS: "card0"},
        )
    )
    # Finished: whatever it was handed is free again.
    api.add_pod(
        handed("done", "n1", "card0", "card1", container(i915="1"))
        | {"status": {"phase": "Succeeded"}}
    )


NODE_SIDE_TABLE = """\
NODE  CARD   STATUS  i915  memory.max  PODS                           HANDED-OUT
n1    card0  drift   2/2   2Gi/8Gi     default/garbled, default/same  default/rogue, default/same
n1    card1  drift   2/2   5Gi/8Gi     default/swapped, ml/sidecar    ml/sidecar
n1    card2  drift   1/2   1Gi/8Gi     default/starting               default/swapped

Problems:
  pod default/garbled on n1: gas-node-cards='card0|card1' cannot be read; what the node \
handed out is unknown
  pod default/rogue on n1, container app: gas decided nothing, the node handed out card0
  pod default/swapped on n1, container app: gas decided card1, the node handed out card2

Warnings:
  pod default/rogue on n1 uses GPUs but has no gas-container-cards annotation: gas does not \
account it (scheduled around the extender?)

Total: 1 node, 3 cards, 5 pods; i915 5/6, memory.max 8Gi/24Gi
"""


def test_what_the_node_handed_out_beside_what_gas_decided(
    apiserver: ApiServerDouble, inspect: Inspect
) -> None:
    node_side_cluster(apiserver)
    status, out = inspect()
    assert out == NODE_SIDE_TABLE
    assert status == 1  # drift is a problem


def test_node_side_json(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    node_side_cluster(apiserver)
    status, out = inspect("-o", "json", "--node", "n1")
    report = json.loads(out)
    assert status == 1
    cards = {c["name"]: c for c in report["nodes"][0]["cards"]}
    assert {name: (c["pods"], c["handed_out"], c["node_drift"]) for name, c in cards.items()} == {
        "card0": (
            ["default/garbled", "default/same"],
            ["default/rogue", "default/same"],
            ["default/rogue"],
        ),
        "card1": (["default/swapped", "ml/sidecar"], ["ml/sidecar"], ["default/swapped"]),
        "card2": (["default/starting"], ["default/swapped"], ["default/swapped"]),
    }
    assert [(p["kind"], p["node"], p["card"], p["pod"]) for p in report["problems"]] == [
        ("annotation", "n1", None, "default/garbled"),
        ("node_drift", "n1", None, "default/rogue"),
        ("node_drift", "n1", None, "default/swapped"),
    ]


def test_a_card_only_the_node_side_names_gets_a_row(
    apiserver: ApiServerDouble, inspect: Inspect
) -> None:
    apiserver.add_node(gpu_node("n1", "0", i915="2", memory_max="8Gi"))
    apiserver.add_pod(handed("p", "n1", "card0", "card0,card3", container(i915="1")))
    status, out = inspect()
    assert status == 1
    assert out == (
        "NODE  CARD   STATUS         i915  memory.max  PODS       HANDED-OUT\n"
        "n1    card0  ok             1/2   0/8Gi       default/p  default/p\n"
        "n1    card3  unknown,drift  -     -                      default/p\n"
        "\n"
        "Problems:\n"
        "  pod default/p on n1, container app: gas decided card0, the node handed out "
        "card0, card3\n"
        "\n"
        "Total: 1 node, 1 card, 1 pod; i915 1/2, memory.max 0/8Gi\n"
    )


def test_a_node_side_that_agrees_is_all_well(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    apiserver.add_node(gpu_node("n1", "0.1", i915="4"))
    apiserver.add_pod(handed("a", "n1", "card0,card1", "card1,card0", container(i915="2")))
    apiserver.add_pod(bound("b", "n1", "card1", container(i915="1")))
    status, out = inspect()
    assert status == 0
    assert out == (
        "NODE  CARD   STATUS  i915  PODS                  HANDED-OUT\n"
        "n1    card0  ok      1/2   default/a             default/a\n"
        "n1    card1  ok      2/2   default/a, default/b  default/a\n"
        "\n"
        "Total: 1 node, 2 cards, 2 pods; i915 3/4\n"
    )


# ------------------------------------------------------------------ --node


NODE_TABLE = """\
NODE        CARD    STATUS   i915  memory.max  tiles  PODS
gpu-4cards  card0   blocked  0/2   0/8Gi       0/2    default/broken (unreadable)
gpu-4cards  card1   blocked  0/2   0/8Gi       0/2    default/broken (unreadable)
gpu-4cards  card2   ok       2/2   5Gi/8Gi     2/2    default/multi, ml/with-sidecar
gpu-4cards  card10  ok       1/2   4Gi/8Gi     1/2    default/multi

Problems:
  pod default/broken on gpu-4cards: gas-container-cards='card1|card0' cannot be read; \
gas counts card0, card1 as full

Total: 1 node, 4 cards, 3 pods; i915 3/8, memory.max 9Gi/32Gi, tiles 3/8
"""


def test_node_shows_one_node_and_asks_only_for_it(
    apiserver: ApiServerDouble, inspect: Inspect
) -> None:
    larger_cluster(apiserver)
    apiserver.clear_requests()
    status, out = inspect("--node", "gpu-4cards")
    assert out == NODE_TABLE
    assert status == 1
    # The API server filters: a large cluster's other pods never cross the wire.
    selectors = {
        t.split("?", 1)[0]: t.split("fieldSelector=", 1)[1].split("&")[0]
        for _, t in apiserver.request_targets
        if "fieldSelector=" in t
    }
    assert selectors == {
        "/api/v1/nodes": "metadata.name%3Dgpu-4cards",
        "/api/v1/pods": "spec.nodeName%3Dgpu-4cards",
        # The DRA nodes' books: this node's slices of gas's driver, and every claim (a
        # claim names no node the API server could filter on).
        "/apis/resource.k8s.io/v1/resourceslices": (
            "spec.driver%3Dgpu.gas.intel.com%2Cspec.nodeName%3Dgpu-4cards"
        ),
    }
    assert any(
        t.startswith("/apis/resource.k8s.io/v1/resourceclaims?")
        for _, t in apiserver.request_targets
    )

    status, out = inspect("--node", "gpu-2cards")
    assert status == 0  # its only finding, the pod bound around gas, is a warning
    assert [line.split()[:2] for line in out.splitlines()[1:3]] == [
        ["gpu-2cards", "card0"],
        ["gpu-2cards", "card1"],
    ]
    assert "default/rogue" in out and "gpu-1card" not in out


def test_unknown_node_is_an_error(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    small_cluster(apiserver)
    assert inspect("--node", "no-such-node") == (2, "")
    assert inspect.err == "gas inspect: node no-such-node not found\n"


# ------------------------------------------------------------------ problems and exit status


def test_cards_over_capacity_fail_and_agree_with_the_audit(
    apiserver: ApiServerDouble, inspect: Inspect
) -> None:
    apiserver.add_node(gpu_node("gpu-1card", "0", i915="4", memory_max="8Gi"))
    apiserver.add_node(gpu_node("gpu-2cards", "0.1", i915="2", memory_max="16Gi"))
    five = container(i915="1", memory_max="5Gi")
    apiserver.add_pod(bound("a", "gpu-1card", "card0", five))
    apiserver.add_pod(bound("b", "gpu-1card", "card0", five))
    # A card the node's labels do not list, and a node that is gone.
    apiserver.add_pod(bound("c", "gpu-2cards", "card3", five))
    apiserver.add_pod(bound("d", "gone", "card0", five))
    status, out = inspect()
    assert status == 1
    assert out == (
        "NODE        CARD   STATUS        i915  memory.max  PODS\n"
        "gone        card0  over,unknown  1/0   5Gi/0       default/d\n"
        "gpu-1card   card0  over          2/4   10Gi/8Gi    default/a, default/b\n"
        "gpu-2cards  card0  ok            0/1   0/8Gi\n"
        "gpu-2cards  card1  ok            0/1   0/8Gi\n"
        "gpu-2cards  card3  over,unknown  1/0   5Gi/0       default/c\n"
        "\n"
        "Problems:\n"
        "  gone/card0: held by default/d, but the card is unknown (node does not exist)\n"
        "  gpu-1card/card0: memory.max 10Gi allocated, capacity 8Gi\n"
        "  gpu-2cards/card3: held by default/c, but the card is unknown"
        " (not a card of the node's labels)\n"
        "\n"
        "Total: 3 nodes, 3 cards, 4 pods; i915 4/6, memory.max 20Gi/24Gi\n"
    )
    # The same cards the test suite's invariant check would flag.
    audit = over_capacity(apiserver.list_nodes(), usage_from_pods(apiserver.list_pods()))
    flagged = {line.split(" ", 1)[0] for line in audit}
    assert flagged == {"gone/card0", "gpu-1card/card0", "gpu-2cards/card3"}


def test_an_unreadable_tiles_annotation_blocks_its_cards(
    apiserver: ApiServerDouble, inspect: Inspect
) -> None:
    apiserver.add_node(gpu_node("gpu-2cards", "0.1", i915="2", memory_max="16Gi", tiles="4"))
    pod = bound("tiled", "gpu-2cards", "card1", container(i915="1", memory_max="1Gi", tiles="1"))
    pod["metadata"]["annotations"]["gas-container-tiles"] = "card1:banana"
    apiserver.add_pod(pod)
    status, out = inspect()
    assert status == 1
    assert out == (
        "NODE        CARD   STATUS   i915  memory.max  tiles  PODS\n"
        "gpu-2cards  card0  ok       0/1   0/8Gi       0/2\n"
        "gpu-2cards  card1  blocked  1/1   1Gi/8Gi     1/2    default/tiled\n"
        "\n"
        "Problems:\n"
        "  pod default/tiled on gpu-2cards: gas-container-tiles='card1:banana' cannot be read;"
        " gas counts card1 as full\n"
        "\n"
        "Total: 1 node, 2 cards, 1 pod; i915 1/2, memory.max 1Gi/16Gi, tiles 1/4\n"
    )


def test_a_healthy_cluster_exits_0(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    apiserver.add_node(gpu_node("gpu-1card", "0", i915="1", memory_max="8Gi"))
    apiserver.add_pod(bound("a", "gpu-1card", "card0", container(i915="1", memory_max="8Gi")))
    status, out = inspect()
    assert status == 0
    assert out.endswith("\nTotal: 1 node, 1 card, 1 pod; i915 1/1, memory.max 8Gi/8Gi\n")


def test_an_empty_cluster(apiserver: ApiServerDouble, inspect: Inspect) -> None:
    status, out = inspect()
    assert (status, out) == (0, "NODE  CARD  STATUS  PODS\n\nTotal: 0 nodes, 0 cards, 0 pods\n")


def test_an_unreachable_api_server_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ApiServerDouble() as gone:
        kubeconfig = gone.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(["inspect", "--kubeConfig", kubeconfig]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("gas inspect: cannot list nodes: ")


def test_a_missing_kubeconfig_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--kubeConfig", str(tmp_path / "nothing")]) == 2
    assert "no usable Kubernetes configuration" in capsys.readouterr().err


# ------------------------------------------------------------------ drift: a real gas


@pytest.fixture
def scheduler(
    gas: GasProcess, apiserver: ApiServerDouble, tls_files: TLSFiles
) -> Iterator[SchedulerEmulator]:
    emulator = SchedulerEmulator(
        apiserver, gas.url, cert=(tls_files.client_cert, tls_files.client_key), verify=tls_files.ca
    )
    yield emulator
    emulator.close()


def test_no_drift_from_a_real_gas_after_binds(
    apiserver: ApiServerDouble,
    gas: GasProcess,
    scheduler: SchedulerEmulator,
    tls_files: TLSFiles,
    inspect: Inspect,
) -> None:
    apiserver.add_node(gpu_node("gpu-2cards", "0.1", i915="8", memory_max="16Gi"))
    apiserver.add_node(gpu_node("gpu-4cards", "0.1.2.3", i915="16", memory_max="32Gi"))
    wait_for_nodes(gas, "gpu-2cards", "gpu-4cards")
    pods = [
        gpu_pod("one", container(i915="1", memory_max="6Gi")),
        gpu_pod("two-gpus", container(i915="2", memory_max="10Gi")),
        gpu_pod("two-ctrs", container("a", i915="1", memory_max="3Gi"), container("b", i915="1")),
        gpu_pod("small", container(i915="1", memory_max="1Gi")),
    ]
    for pod in pods:
        apiserver.add_pod(pod)
        assert scheduler.schedule_now("default", pod["metadata"]["name"]).bound
    assert_consistent(gas, apiserver)
    mtls = tls_files.client_flags()

    status, out = inspect("--extender", gas.url, *mtls)
    assert status == 0, out
    assert f"\nLedger at {gas.url}: no drift\n\nTotal: 2 nodes, 6 cards, 4 pods;" in out

    # A zero request on a card nothing else uses memory of: the ledger keeps no zero
    # amounts, which must not read as drift. Added behind gas's back, so its watch
    # delivers it a moment later (hence the wait).
    apiserver.add_node(gpu_node("gpu-spare", "0", i915="4", memory_max="8Gi"))
    wait_for_nodes(gas, "gpu-spare")
    apiserver.add_pod(bound("zero", "gpu-spare", "card0", container(i915="1", memory_max="0")))
    status, out = inspect("--extender", gas.url, *mtls, "--driftWait", "10", "-o", "json")
    assert status == 0, out
    assert json.loads(out)["drift"] == {"url": gas.url, "differences": []}

    status, out = inspect(
        "--extender",
        gas.url,
        "--insecure",
        "--cert",
        tls_files.client_cert,
        "--key",
        tls_files.client_key,
        "--node",
        "gpu-4cards",
    )
    assert status == 0, out


def test_extender_that_cannot_be_read_is_an_error(
    gas: GasProcess, tls_files: TLSFiles, inspect: Inspect
) -> None:
    # gas verifies client certificates: without one the handshake fails.
    assert inspect("--extender", gas.url, "--cacert", tls_files.ca) == (2, "")
    assert inspect.err.startswith(f"gas inspect: cannot read the ledger at {gas.url}/debug/ledger")
    assert inspect("--extender", gas.url, "--cert", tls_files.client_cert) == (2, "")
    assert inspect.err == "gas inspect: --cert and --key go together\n"


# ------------------------------------------------------------------ drift: hand-written ledgers


class LedgerStub:
    """A plain HTTP server answering `/debug/ledger` with the given bodies in turn (the
    last one repeated): a gas whose ledger has drifted, which a correct gas never shows."""

    def __init__(self, *bodies: object) -> None:
        self.bodies = list(bodies)
        self.requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = stub.bodies[min(stub.requests, len(stub.bodies) - 1)]
                stub.requests += 1
                data = json.dumps(body).encode()
                status = 200 if self.path == "/debug/ledger" else 404
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs() -> Iterator[Callable[..., LedgerStub]]:
    made: list[LedgerStub] = []

    def make(*bodies: object) -> LedgerStub:
        made.append(LedgerStub(*bodies))
        return made[-1]

    yield make
    for stub in made:
        stub.close()


def ledger(usage: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": {}, "usage": usage, "pods": {}}


TRUE_USAGE = {
    "gpu-1card": {"card0": {I915: 1, MEM: 5 * GI, "gpu.intel.com/millicores": 300}},
    "gpu-2cards": {
        "card0": {I915: 2, MEM: 4 * GI, "gpu.intel.com/millicores": 100},
        "card1": {I915: 2, MEM: 5 * GI, "gpu.intel.com/millicores": 600},
    },
}


def test_drift_is_reported_and_fails(
    apiserver: ApiServerDouble, inspect: Inspect, stubs: Callable[..., LedgerStub]
) -> None:
    small_cluster(apiserver)
    drifted = json.loads(json.dumps(TRUE_USAGE))
    drifted["gpu-2cards"]["card1"][MEM] = 3 * GI  # a release gas applied twice, say
    drifted["gpu-9"] = {"card0": {I915: 1}}  # a pod gas still holds on a node long gone
    stub = stubs(ledger(drifted))
    status, out = inspect("--extender", stub.url, "--driftWait", "0")
    assert status == 1
    drift_section = out.split(f"\nDrift from the ledger at {stub.url}:\n", 1)[1].split("\n\n")[0]
    assert drift_section.splitlines() == [
        f"  gpu-2cards: pods imply {TRUE_USAGE['gpu-2cards']}, "
        f"ledger holds {drifted['gpu-2cards']}",
        "  gpu-9: pods imply {}, ledger holds {'card0': {'gpu.intel.com/i915': 1}}",
    ]
    # Only the node asked about.
    status, out = inspect("--extender", stub.url, "--driftWait", "0", "--node", "gpu-1card")
    assert status == 0 and "no drift" in out


def test_drift_that_settles_within_the_wait_is_not_drift(
    apiserver: ApiServerDouble, inspect: Inspect, stubs: Callable[..., LedgerStub]
) -> None:
    """A running gas's watch trails the API server: what it has not seen yet is not drift."""
    small_cluster(apiserver)
    stub = stubs(ledger({}), ledger({}), ledger(TRUE_USAGE))
    status, out = inspect("--extender", stub.url, "--driftWait", "10", "-o", "json")
    assert status == 0
    assert json.loads(out)["drift"] == {"url": stub.url, "differences": []}
    assert stub.requests == 3


def test_an_answer_that_is_not_a_ledger_is_an_error(
    apiserver: ApiServerDouble, inspect: Inspect, stubs: Callable[..., LedgerStub]
) -> None:
    small_cluster(apiserver)
    stub = stubs({"Error": "not a ledger"})
    assert inspect("--extender", stub.url) == (2, "")
    assert inspect.err == f"gas inspect: {stub.url}/debug/ledger did not answer a gas ledger\n"
    assert inspect("--extender", stub.url + "/elsewhere") == (2, "")
    assert "404" in inspect.err


# ------------------------------------------------------------------ real entry points


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    return {**env, **extra}


def test_gas_inspect_end_to_end(
    apiserver: ApiServerDouble, kubeconfig: str, inspect: Inspect, tmp_path: Path
) -> None:
    larger_cluster(apiserver)
    in_process = inspect()
    command = [sys.executable, "-m", "gas.cli", "inspect"]
    result = subprocess.run(
        [*command, "--kubeConfig", kubeconfig],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(tmp_path),
        timeout=60,
    )
    assert (result.returncode, result.stdout) == in_process
    # What gas would log about the unreadable annotations is in the report, not on stderr.
    assert result.stderr == ""
    # KUBECONFIG instead of the flag; GAS-style single-dash flags.
    result = subprocess.run(
        [*command, "-o=json", "-node", "gpu-2cards"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(tmp_path, KUBECONFIG=kubeconfig),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert [n["name"] for n in json.loads(result.stdout)["nodes"]] == ["gpu-2cards"]


def test_kubectl_plugin_entry_point(
    apiserver: ApiServerDouble,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    small_cluster(apiserver)
    assert kubectl_main(["--kubeconfig", kubeconfig]) == 0
    assert capsys.readouterr().out == SMALL_TABLE
    assert (
        kubectl_main(["inspect", "--kubeconfig", kubeconfig, "-o", "json", "--node", "gpu-1card"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["totals"]["pods"] == 1
    # kubectl's own flags for picking a cluster.
    assert kubectl_main(["--kubeconfig", kubeconfig, "--context", "apiserver-double"]) == 0
    assert capsys.readouterr().out == SMALL_TABLE
    assert kubectl_main(["--kubeconfig", kubeconfig, "--context", "elsewhere"]) == 2
    assert "elsewhere" in capsys.readouterr().err

    script = Path(sys.executable).parent / "kubectl-gas"
    if not script.exists():
        pytest.skip("kubectl-gas is not installed: reinstall gas (pip install -e .)")
    bin_dir = str(script.parent)
    env = _env(tmp_path, PATH=bin_dir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"))
    result = subprocess.run(
        [str(script), "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (0, SMALL_TABLE), result.stderr
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return
    # kubectl finds the plugin on PATH and hands it every argument.
    result = subprocess.run(
        [kubectl, "gas", "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (0, SMALL_TABLE), result.stderr
