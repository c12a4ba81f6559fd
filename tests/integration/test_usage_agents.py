"""Each container's real GPU use beside its share, read by both agents as real processes
from synthetic /proc trees laid out as the kernel's docs say, against the API-server
double: the share from the pod's annotations (gas node) or from the container's own
environment (gas dra), the metrics and `/usage`, the Event of an over-user, and under
`--overuse-policy evict` its eviction through the Eviction API while its card is
contended, never the pod within its share."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.cli import main
from gas.core.shares import Share, share_environment
from tests.support.apiserver import ApiServerDouble
from tests.support.draproc import DraRig
from tests.support.fakeproc import (
    GIB,
    FakeProcess,
    cgroup_v2,
    fork,
    gpu_fds,
    i915_fdinfo,
    pod_cgroup,
    write_proc,
)
from tests.support.fakesysfs import FakeCard
from tests.support.nodeproc import NodeRig
from tests.support.polling import wait_for
from tests.support.promtext import metric
from tests.support.realk8s import free_port

CARD = FakeCard(0)  # 16 GiB of local memory
HOG, CALM = "a" * 64, "b" * 64
HOG_UID, CALM_UID = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"


def gpu_pod(name: str, uid: str, container_id: str, annotations: dict[str, str]) -> dict[str, Any]:
    limits = {"gpu.intel.com/i915": "1", "gpu.intel.com/memory.max": "4Gi"}
    return {
        "metadata": {"name": name, "namespace": "work", "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "app", "resources": {"limits": limits, "requests": limits}}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "app", "containerID": f"containerd://{container_id}"}],
        },
    }


def processes(hog_env: dict[str, str], calm_env: dict[str, str]) -> list[FakeProcess]:
    """A pod using 12 GiB of card0 (in two forked workers sharing one client) and one using
    6 GiB: 18 GiB of a 16 GiB card, contended."""
    pdev = CARD.pci_address
    hog = FakeProcess(
        4001,
        cgroup_v2(pod_cgroup(HOG_UID, HOG)),
        gpu_fds(i915_fdinfo(7, pdev, local=12 * GIB)),
        hog_env,
    )
    calm = FakeProcess(
        4100,
        cgroup_v2(pod_cgroup(CALM_UID, CALM, qos="besteffort", driver="cgroupfs")),
        gpu_fds(i915_fdinfo(9, pdev, local=6 * GIB)),
        calm_env,
    )
    return [hog, fork(hog, 4002), calm]


def usage_of(port: int) -> dict[str, Any]:
    """The agent's `/usage`; none while its port is not up yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/usage", timeout=10) as answer:
            found: dict[str, Any] = json.loads(answer.read())
    except urllib.error.URLError:
        return {"containers": []}
    return found


def both_seen(port: int, log: Callable[[], str]) -> dict[str, dict[str, Any]]:
    """Pod -> its container's entry, once the agent's `/usage` shows both pods' containers;
    the agent's log when it does not in time."""

    def both() -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] = usage_of(port)["containers"]
        return found if len(found) == 2 else None

    try:
        return {c["pod"]: c for c in wait_for(both, 30, "both containers' use")}
    except TimeoutError as exc:
        raise AssertionError(log()) from exc


def metrics_of(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
    return text


def events(api: ApiServerDouble, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.events if e.get("reason") == reason]


@pytest.fixture
def node_rig(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> Iterator[tuple[NodeRig, int]]:
    """gas node (the extender way): the shares are in the pods' annotations."""
    proc = write_proc(tmp_path / "proc", processes({}, {}))
    port = free_port()
    apiserver.add_node({"metadata": {"name": "n1"}})
    apiserver.add_pod(gpu_pod("hog", HOG_UID, HOG, {"gas-container-cards": "card0"}))
    apiserver.add_pod(gpu_pod("calm", CALM_UID, CALM, {"gas-container-cards": "card0"}))
    rig = NodeRig(
        apiserver,
        kubeconfig,
        "n1",
        [CARD],
        tmp_path,
        extra=[
            "--proc-root",
            str(proc),
            "--usage-interval",
            "0.3",
            "--overuse-grace",
            "0.5",
            "--overuse-policy",
            "evict",
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
        ],
    )
    try:
        yield rig, port
    finally:
        rig.close()


def test_gas_node_reads_use_beside_the_pods_share_and_evicts_the_over_user(
    node_rig: tuple[NodeRig, int], apiserver: ApiServerDouble
) -> None:
    rig, port = node_rig
    seen = both_seen(port, rig.agent.log)
    assert seen["hog"]["memoryBytes"] == 12 * GIB  # two workers, one client: once
    assert seen["hog"]["memoryShareBytes"] == 4 * GIB
    assert seen["calm"]["memoryBytes"] == 6 * GIB
    text = metrics_of(port)
    labels = {"namespace": "work", "pod": "hog", "container": "app", "card": "card0"}
    assert metric(text, "gas_container_gpu_memory_bytes", **labels) == 12 * GIB
    assert metric(text, "gas_container_gpu_memory_share_bytes", **labels) == 4 * GIB
    # Both over their 4 GiB share, the card contended: the hog (8 GiB over) is evicted
    # first, through the Eviction API; the Events say why.
    wait_for(lambda: apiserver.get_pod("work", "hog") is None, 30, "the hog evicted")

    def said() -> list[str] | None:
        exceeded = events(apiserver, "GPUShareExceeded")
        found = [e["message"] for e in exceeded if e["involvedObject"]["name"] == "hog"]
        return found if len(found) >= 2 else None

    # The Events are posted from a queue of their own, after the eviction's call.
    messages = wait_for(said, 10, "both Events")
    assert any("uses 12Gi of card0's memory, over its share of 4.0Gi" in m for m in messages)
    assert any(
        m.startswith("evicted through the Eviction API: card0 is contended") for m in messages
    )
    assert "gas_gpu_overuse_evictions_total" in metrics_of(port)


@pytest.fixture
def dra_rig(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> Iterator[tuple[DraRig, int]]:
    """gas dra: the shares are in each container's environment, as its CDI spec set it."""
    proc = write_proc(
        tmp_path / "proc",
        processes(
            share_environment("card0", Share(4 * GIB, 250, 0)),
            share_environment("card0", Share(8 * GIB, 500, 0)),
        ),
    )
    port = free_port()
    rig = DraRig(
        apiserver,
        kubeconfig,
        "n1",
        [CARD],
        tmp_path,
        [
            "--proc-root",
            str(proc),
            "--usage-interval",
            "0.3",
            "--overuse-grace",
            "0.5",
        ],
        metrics_port=port,
    )
    apiserver.add_pod(gpu_pod("hog", HOG_UID, HOG, {}))
    apiserver.add_pod(gpu_pod("calm", CALM_UID, CALM, {}))
    try:
        yield rig, port
    finally:
        rig.close()


def test_gas_dra_reads_use_beside_the_share_in_the_containers_environment(
    dra_rig: tuple[DraRig, int], apiserver: ApiServerDouble
) -> None:
    rig, port = dra_rig
    rig.start_registered()
    seen = both_seen(port, rig.log)
    assert (seen["hog"]["memoryBytes"], seen["hog"]["memoryShareBytes"]) == (12 * GIB, 4 * GIB)
    assert seen["hog"]["millicoresShare"] == 250
    assert (seen["calm"]["memoryBytes"], seen["calm"]["memoryShareBytes"]) == (6 * GIB, 8 * GIB)
    # The hog is reported (report, the default policy), never evicted; calm, within its
    # share, is not even reported.
    wait_for(lambda: events(apiserver, "GPUShareExceeded"), 30, "the Event")
    (event,) = events(apiserver, "GPUShareExceeded")
    assert event["involvedObject"]["name"] == "hog" and event["type"] == "Warning"
    assert event["source"]["component"] == "gas-dra"
    assert apiserver.get_pod("work", "hog") is not None
    assert "container app uses 12Gi of card0's memory" in rig.log()


def agent_pod(name: str, node: str, port: int) -> dict[str, Any]:
    """gas dra's pod as deploy/dra runs it, its metrics port named."""
    return {
        "metadata": {
            "name": name,
            "namespace": "gas-system",
            "labels": {"app.kubernetes.io/name": "gas-dra"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "gas-dra", "ports": [{"name": "metrics", "containerPort": port}]}
            ],
        },
        "status": {"phase": "Running"},
    }


def test_inspect_shows_use_beside_share_through_the_agents_pod_proxy(
    dra_rig: tuple[DraRig, int],
    apiserver: ApiServerDouble,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rig, port = dra_rig
    rig.start_registered()
    apiserver.add_node({"metadata": {"name": "n2"}})
    apiserver.add_pod(agent_pod("gas-dra-n1", "n1", port))
    # An agent whose port answers nothing: its node's use is left out, and said so.
    apiserver.add_pod(agent_pod("gas-dra-n2", "n2", free_port()))
    both_seen(port, rig.log)
    capsys.readouterr()
    main(["inspect", "--kubeConfig", kubeconfig])
    out = capsys.readouterr().out
    rows = {line.split()[2]: line.split() for line in out.splitlines() if line.startswith("n1 ")}
    assert rows["work/hog"][:6] == ["n1", "card0", "work/hog", "app", "12Gi", "4Gi"]
    assert rows["work/hog"][-1] == "OVER"
    assert rows["work/calm"][4:6] == ["6Gi", "8Gi"] and rows["work/calm"][-1] != "OVER"
    assert "GPU use: 2 container(s) on cards, 1 over their share" in out
    assert "GPU use not shown: node n2: " in out
    main(["inspect", "--kubeConfig", kubeconfig, "-o", "json", "--node", "n1"])
    usage = json.loads(capsys.readouterr().out)["usage"]
    assert usage["errors"] == []  # n2 not asked
    hog = next(c for c in usage["containers"] if c["pod"] == "hog")
    assert (hog["memoryBytes"], hog["memoryShareBytes"], hog["over"]) == (12 * GIB, 4 * GIB, True)
    main(["inspect", "--kubeConfig", kubeconfig, "--no-usage"])
    assert "GPU use" not in capsys.readouterr().out
