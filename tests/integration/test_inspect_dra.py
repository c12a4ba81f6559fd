"""`gas inspect` on the nodes `gas dra` serves: their cards read from the ResourceSlices
and the allocated ResourceClaims on the API-server double, over real HTTP with the real
`kubernetes` client, beside the nodes `gas node` serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gas.cli import main
from gas.dra.slices import PciFacts, plain, resource_slice
from tests.support.apiserver import ApiServerDouble
from tests.support.objects import gpu_node, intel_cards

ROOT = Path(__file__).resolve().parents[2]
GI = 2**30
FLEX = PciFacts(device_id="0x56c0", pcie_root="pci0000:00")
CLAIMS = r"^/apis/resource\.k8s\.io/v1/resourceclaims$"


def add_dra_node(api: ApiServerDouble, node: str, count: int) -> None:
    """A node as `gas dra` leaves it: the Node, and its slice of `count` 16 GiB cards."""
    stored = api.add_node({"metadata": {"name": node, "labels": {"gpu.gas.intel.com/dra": "true"}}})
    cards = intel_cards(count, 16 * GI)
    body = resource_slice(
        node, stored["metadata"]["uid"], plain(cards, {c.name: FLEX for c in cards}), 1
    )
    api.add_object("resourceslices", body)


def add_claim(
    api: ApiServerDouble, name: str, node: str, card: str, memory: str, pod: str | None
) -> None:
    """A claim as kube-scheduler allocates it: one share of `card`, reserved for `pod`."""
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.gas.intel.com",
                        "pool": node,
                        "device": card,
                        "shareID": f"7c1e4a2b-0000-4000-8000-{len(name):012d}",
                        "consumedCapacity": {"memory": memory, "millicores": "100", "tiles": "0"},
                    }
                ]
            }
        }
    }
    if pod is not None:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    api.add_object(
        "resourceclaims",
        {"metadata": {"name": name, "namespace": "ml"}, "spec": {"devices": {}}, "status": status},
    )


def cluster(api: ApiServerDouble) -> None:
    """One `gas node` node without pods, and two DRA nodes with claims on their cards."""
    api.add_node(gpu_node("gpu-1card", "0"))
    add_dra_node(api, "dra-a", 2)
    add_dra_node(api, "dra-b", 1)
    add_claim(api, "train", "dra-a", "card0", "8Gi", "trainer")
    add_claim(api, "serve", "dra-a", "card0", "4Gi", "server")
    add_claim(api, "spare", "dra-b", "card0", "2Gi", None)


def inspect(kubeconfig: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["inspect", "--kubeConfig", kubeconfig, *args])
    return status, capsys.readouterr().out


DRA_TABLE = """\
DRA NODE  CARD   STATUS  memory used/cap  millicores used/cap  tiles used/cap  memory free  millicores free  tiles free  CLAIMS (PODS)
dra-a     card0  ok      12Gi/16Gi        200/1000             0/1             4Gi          800              1           ml/serve (ml/server), ml/train (ml/trainer)
dra-a     card1  ok      0/16Gi           0/1000               0/1             16Gi         1000             1
dra-b     card0  ok      2Gi/16Gi         100/1000             0/1             14Gi         900              1           ml/spare (no pod)
DRA total: 2 node(s), 3 card(s) of gpu.gas.intel.com, 3 claim(s)
"""  # noqa: E501


def test_the_dra_cards_follow_the_gas_node_table(
    apiserver: ApiServerDouble, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster(apiserver)
    status, out = inspect(kubeconfig, capsys)
    assert status == 0
    before, dra = out.split("\n\n", 1)
    assert before.startswith("NODE") and "gpu-1card" in before and "dra-a" not in before
    assert dra.endswith(DRA_TABLE)


def test_json_and_one_node(
    apiserver: ApiServerDouble, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster(apiserver)
    status, out = inspect(kubeconfig, capsys, "-o", "json")
    assert status == 0
    dra = json.loads(out)["dra"]
    assert dra["error"] is None and dra["problems"] == [] and dra["claims"] == 3
    first = dra["cards"][0]
    assert (first["node"], first["name"]) == ("dra-a", "card0")
    assert first["capacity"] == {"memory": 16 * GI, "millicores": 1000, "tiles": 1}
    assert first["consumed"] == {"memory": 12 * GI, "millicores": 200, "tiles": 0}
    assert [(c["claim"], c["pods"]) for c in first["claims"]] == [
        ("ml/serve", ["ml/server"]),
        ("ml/train", ["ml/trainer"]),
    ]

    status, out = inspect(kubeconfig, capsys, "--node", "dra-b")
    assert status == 0
    assert "dra-a" not in out and "dra-b     card0  ok" in out and "1 claim(s)" in out


def test_a_card_over_capacity_fails_the_table_and_the_check(
    apiserver: ApiServerDouble, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster(apiserver)
    add_claim(apiserver, "greedy", "dra-a", "card0", "6Gi", "hog")
    status, out = inspect(kubeconfig, capsys)
    assert status == 1
    assert "dra-a     card0  over" in out
    message = (
        "dra-a/card0: claims consume more than the card has (memory 18Gi of 16Gi): "
        "ml/greedy, ml/serve, ml/train"
    )
    assert f"DRA problems:\n  {message}\n" in out
    status, out = inspect(kubeconfig, capsys, "--check")
    assert status == 1
    assert out == f"Violations (1):\n  {message}\n"
    status, out = inspect(kubeconfig, capsys, "--node", "dra-b")
    assert status == 0  # the other node's card is not this one's problem


def test_a_cluster_without_dra_or_a_reader_without_access(
    apiserver: ApiServerDouble, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.add_node(gpu_node("gpu-1card", "0"))
    status, out = inspect(kubeconfig, capsys, "-o", "json")
    assert status == 0 and "dra" not in json.loads(out)
    # An API server that serves no resource.k8s.io/v1 (before 1.34): nothing to say.
    apiserver.faults.add("GET", CLAIMS, ("status", 404), times=None)
    status, out = inspect(kubeconfig, capsys)
    assert status == 0 and "DRA" not in out
    apiserver.faults.clear()
    # A reader allowed nodes and pods but not claims still sees gas node's cards.
    apiserver.faults.add("GET", CLAIMS, ("status", 403), times=None)
    status, out = inspect(kubeconfig, capsys)
    assert status == 0 and "gpu-1card" in out
    assert "DRA nodes not shown: cannot list resourceclaims: 403" in out
    status, out = inspect(kubeconfig, capsys, "-o", "json")
    assert json.loads(out)["dra"]["error"].startswith("cannot list resourceclaims: 403")


def test_end_to_end_as_a_process(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    cluster(apiserver)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gas.cli", "inspect", "--kubeConfig", kubeconfig],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(DRA_TABLE) and done.stderr == ""
