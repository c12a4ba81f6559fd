"""The node half on a real node: kubelet 1.37 and containerd 2.x (tests/support/realnode.py)
against a real control plane, with a fake sysfs and real character device nodes standing
in for the cards. `gas node` registers with that kubelet as its device plugin; pods placed
by the real kube-scheduler with the real `gas serve` as its extender are started by the
kubelet, and each container must see exactly the device nodes of the cards gas wrote into
its pod's `gas-container-cards`: in its own /dev/dri and in its devices cgroup, also
through a kubelet restart and a `gas node` restart. `gas node` runs as deploy/ runs it
(root, no capability but SYS_PTRACE) and reads the GPU use of the pods' real processes:
their cgroup files are real, their DRM fds and fdinfo synthetic (no GPU here).

One real node per machine (the kubelet's device-plugin socket has a fixed path): the
tests share one, in file order, and hold a lock while it lives.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.utils import parse_quantity

from gas.core.model import ANNOTATION_CARDS, LABEL_GPU_NUMBERS, parse_cards
from tests.support import realk8s, realnode
from tests.support.capabilities import deployed_capabilities
from tests.support.fakeproc import GIB, drm_fd, i915_fdinfo, other_fds
from tests.support.fakesysfs import FakeCard, write_sysfs
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(240)

NODE = "gas-real-node"
NAMESPACE = "gpu-work"
I915 = "gpu.intel.com/i915"
MEMORY = "gpu.intel.com/memory.max"
SHARES = 10
CARDS = [FakeCard(0), FakeCard(1), FakeCard(2)]
GAS_NODE_USER = "gas-node-agent"


@dataclass
class Rig:
    plane: realk8s.ControlPlane
    node: realnode.RealNode
    agent: realnode.GasNode
    gas: GasProcess
    core: Any
    proc: Path
    """The proc root gas node reads its GPU use from (`--proc-root`)."""
    sysfs: Path
    metrics_port: int


def _grant_gas_node_role(plane: realk8s.ControlPlane) -> str:
    """gas node's ClusterRole as shipped (deploy/base/node-daemonset.yaml), bound to a user
    of its own: the agent runs with exactly the rights a deployment gives it."""
    shipped = realk8s.ROOT / "deploy" / "base" / "node-daemonset.yaml"
    role = next(
        d for d in yaml.safe_load_all(shipped.read_text()) if d and d["kind"] == "ClusterRole"
    )
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gas-node-test"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": GAS_NODE_USER}
        ],
    }
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([role, binding]))
    return plane.kubeconfig("gas-node", GAS_NODE_USER)


def _scheduler_configuration(port: int, tls: TLSFiles) -> str:
    return yaml.safe_dump(
        {
            "profiles": [{"schedulerName": "default-scheduler"}],
            # First fit needs no scores.
            "extenders": [realk8s.gas_extender(port, tls, prioritizeVerb="", weight=None)],
        }
    )


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles) -> Iterator[Rig]:
    reason = realnode.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("realnode")
    with contextlib.ExitStack() as stack:
        plane = stack.enter_context(realk8s.ControlPlane(work / "plane", version=realnode.VERSION))
        plane.prepare_namespace(NAMESPACE)
        agent_kubeconfig = _grant_gas_node_role(plane)
        node = stack.enter_context(realnode.RealNode(plane, NODE, log_dir=work))
        node.wait_ready()
        # The cards live in the node's working directory, which it removes when it stops.
        sysfs = write_sysfs(node.workdir / "cards" / "sys", CARDS)
        devfs = realnode.write_char_devfs(node.workdir / "cards" / "dev", CARDS)
        proc = work / "proc"
        proc.mkdir()
        metrics_port = realk8s.free_port()
        usage = ["--proc-root", str(proc), "--usage-interval", "1", "--overuse-grace", "1"]
        usage += ["--overuse-policy", "evict", "--metrics-port", str(metrics_port)]
        agent = realnode.GasNode(
            node,
            agent_kubeconfig,
            sysfs,
            devfs,
            work / "gas-node.log",
            [*usage, "--metrics-host", "127.0.0.1"],
            deployed_capabilities("deploy/base/node-daemonset.yaml"),
        )
        stack.callback(agent.stop)
        gas = GasProcess(
            ["--kubeConfig", plane.admin_kubeconfig], work / "gas-serve.log", tls_files
        )
        stack.callback(gas.stop)
        gas.wait_ready()
        plane.start_scheduler(_scheduler_configuration(gas.port, tls_files))
        # Only the disruption controller: PodDisruptionBudgets' status, which the Eviction
        # API reads.
        plane.start_controller_manager(controllers="disruption")
        yield Rig(
            plane, node, agent, gas, client.CoreV1Api(plane.client()), proc, sysfs, metrics_port
        )


# ----------------------------------------------------------------------------- helpers


def _node(rig: Rig) -> dict[str, Any]:
    status, node = rig.plane.request("GET", f"/api/v1/nodes/{NODE}")
    assert status == 200, node
    return dict(node)


def _allocatable(rig: Rig, resource: str) -> str | None:
    value = (_node(rig)["status"].get("allocatable") or {}).get(resource)
    return value if isinstance(value, str) else None


def _wait_published(rig: Rig, timeout: float = 60.0) -> None:
    """Until the kubelet shows every share of every card again (after a start or a
    restart of either side)."""
    want = str(SHARES * len(CARDS))
    try:
        wait_for(lambda: _allocatable(rig, I915) == want, timeout, f"{I915} = {want}")
    except TimeoutError as exc:
        raise AssertionError(
            f"{I915} is {_allocatable(rig, I915)}\ngas node:\n{rig.agent.log()[-3000:]}\n"
            + rig.node.logs()
        ) from exc


def _gpu_container(name: str, i915: int, memory_gib: int) -> dict[str, Any]:
    limits = {I915: str(i915), MEMORY: f"{memory_gib}Gi"}
    return {
        "name": name,
        "image": realnode.IMAGE,
        "imagePullPolicy": "Never",
        # What the container itself sees, in its log; then it waits to be killed.
        "command": ["/bin/sh", "-c", "ls -l /dev/dri; exec sleep 3600"],
        "resources": {"limits": limits, "requests": limits},
    }


def _plain_container(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": realnode.IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "ls -l /dev/dri; exec sleep 3600"],
    }


Create = Callable[..., None]


@pytest.fixture
def create(rig: Rig) -> Iterator[Create]:
    """`create(name, *containers)` makes a pod in NAMESPACE for the scheduler to place;
    the test's pods are deleted after it, and gone (their cards free) before the next."""
    made: list[str] = []

    def make(name: str, *containers: dict[str, Any], labels: dict[str, str] | None = None) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
            "spec": {"containers": list(containers), "terminationGracePeriodSeconds": 1},
        }
        rig.core.create_namespaced_pod(NAMESPACE, body)
        made.append(name)

    yield make
    for name in made:
        with contextlib.suppress(client.ApiException):  # evicted by the test
            rig.core.delete_namespaced_pod(name, NAMESPACE)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    wait_for(lambda: not rig.plane.request("GET", path)[1]["items"], 60, "the pods deleted")


def _pod(rig: Rig, name: str) -> dict[str, Any]:
    status, pod = rig.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    assert status == 200, pod
    return dict(pod)


def _wait_running(rig: Rig, name: str, timeout: float = 60.0) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = _pod(rig, name)
        statuses = pod["status"].get("containerStatuses") or []
        started = statuses and all(s.get("state", {}).get("running") for s in statuses)
        return pod if pod["status"].get("phase") == "Running" and started else None

    try:
        found: dict[str, Any] = wait_for(running, timeout, f"{name} running")
    except TimeoutError as exc:
        pod = _pod(rig, name)
        raise AssertionError(
            f"{name} not running: {pod['spec'].get('nodeName')} {pod['status']}\n"
            f"gas serve:\n{rig.gas.log()[-2000:]}\ngas node:\n{rig.agent.log()[-3000:]}\n"
            + rig.node.logs()
        ) from exc
    return found


def _chosen(pod: dict[str, Any]) -> dict[str, dict[str, tuple[int, int]]]:
    """Container -> the device nodes of the cards gas chose for it (its annotation)."""
    containers = pod["spec"]["containers"]
    segments = parse_cards(pod["metadata"]["annotations"][ANNOTATION_CARDS], len(containers))
    by_name = {f"card{c.number}": c for c in CARDS}
    return {
        spec["name"]: realnode.card_devices(by_name[card] for card in segments[index])
        for index, spec in enumerate(containers)
    }


_LS_LINE = re.compile(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(\S+)$")


def _logged(rig: Rig, pod: dict[str, Any], container: str) -> dict[str, tuple[int, int]]:
    """The character devices the container's `ls -l /dev/dri` printed at its start."""
    meta = pod["metadata"]
    path = rig.node.pod_logs / f"{NAMESPACE}_{meta['name']}_{meta['uid']}" / container / "0.log"
    text = wait_for(lambda: path.exists() and path.read_text(), 10, f"{path}")
    found = {}
    for line in text.splitlines():
        # CRI log lines: <time> <stream> <tag> <text>
        match = _LS_LINE.match(line.split(" ", 3)[-1])
        if match:
            found[match.group(3)] = (int(match.group(1)), int(match.group(2)))
    return found


def _container_ids(pod: dict[str, Any]) -> dict[str, str]:
    return {s["name"]: s["containerID"] for s in pod["status"]["containerStatuses"]}


def _assert_exact_devices(rig: Rig, name: str, *, logged: bool = True) -> dict[str, str]:
    """Each container of pod `name` sees exactly its cards' device nodes, now (in its mount
    namespace and devices cgroup) and, with `logged`, at its start (its log); returns
    its containers' IDs."""
    pod = _pod(rig, name)
    assert pod["spec"]["nodeName"] == NODE
    ids = _container_ids(pod)
    for container, wanted in _chosen(pod).items():
        pid = rig.node.container_pid(ids[container])
        where = f"{name}/{container} (cards {pod['metadata']['annotations'][ANNOTATION_CARDS]})"
        assert rig.node.devices_seen(pid) == wanted, where
        allowed = rig.node.devices_allowed(pid)
        assert allowed is None or allowed == set(wanted.values()), where
        if logged:
            assert _logged(rig, pod, container) == wanted, where
    return ids


# ------------------------------------------------------------------------------- tests


def test_gas_node_registers_with_the_real_kubelet_and_the_node_shows_its_resources(
    rig: Rig,
) -> None:
    _wait_published(rig)
    node = _node(rig)
    assert node["metadata"]["labels"][LABEL_GPU_NUMBERS] == "0.1.2"
    capacity = node["status"]["capacity"]
    allocatable = node["status"]["allocatable"]
    assert capacity[I915] == allocatable[I915] == str(SHARES * len(CARDS))
    # The capacity gas node writes itself, which the kubelet keeps (the API server
    # canonicalises the quantities: compare their values).
    assert parse_quantity(allocatable[MEMORY]) == 3 * 16 * 1024**3
    assert parse_quantity(allocatable["gpu.intel.com/millicores"]) == 3000
    assert (rig.node.device_plugin_dir / "gas-i915.sock").is_socket()
    assert rig.agent.registrations() >= 1


def test_pods_placed_by_gas_run_with_exactly_their_cards_device_nodes(
    rig: Rig, create: Create
) -> None:
    _wait_published(rig)
    # 12 GiB of a 16 GiB card each: no two of these containers can share a card.
    create("solo", _gpu_container("app", 1, 12))
    create("pair", _gpu_container("two-cards", 2, 24), _plain_container("sidecar"))
    for name in ("solo", "pair"):
        _wait_running(rig, name)
        _assert_exact_devices(rig, name)
    chosen = {name: _chosen(_pod(rig, name)) for name in ("solo", "pair")}
    assert len(chosen["pair"]["two-cards"]) == 4  # two cards, each a card and render node
    assert chosen["pair"]["sidecar"] == {}
    assert not set(chosen["solo"]["app"]) & set(chosen["pair"]["two-cards"])


def test_devices_hold_through_a_kubelet_restart_and_a_gas_node_restart(
    rig: Rig, create: Create
) -> None:
    _wait_published(rig)
    create("before", _gpu_container("app", 1, 3))
    _wait_running(rig, "before")
    before = _assert_exact_devices(rig, "before")

    rig.node.restart_kubelet()
    rig.node.wait_ready()
    # The kubelet removed the plugin's socket as it started; gas node registered again.
    wait_for(lambda: rig.agent.registrations() >= 2, 60, "gas node registered again")
    _wait_published(rig)
    assert _assert_exact_devices(rig, "before", logged=False) == before
    create("after-kubelet", _gpu_container("app", 1, 3))
    _wait_running(rig, "after-kubelet")
    _assert_exact_devices(rig, "after-kubelet")

    registered = rig.agent.registrations()
    rig.agent.restart()
    wait_for(lambda: rig.agent.registrations() > registered, 60, "gas node registered anew")
    _wait_published(rig)
    create("after-agent", _gpu_container("app", 1, 3))
    _wait_running(rig, "after-agent")
    _assert_exact_devices(rig, "after-agent")
    # Nothing that ran before either restart was restarted or given other devices.
    assert _assert_exact_devices(rig, "before", logged=False) == before
    for name in ("before", "after-kubelet", "after-agent"):
        statuses = _pod(rig, name)["status"]["containerStatuses"]
        assert [s["restartCount"] for s in statuses] == [0], name


# ------------------------------------------------------------------- GPU use (shares kept)


def _holds(rig: Rig, pid: int, card: FakeCard, memory: int) -> None:
    """gas node's proc root shows process `pid` holding `memory` bytes of `card`: its
    cgroup the real one (a link to the host's /proc/<pid>/cgroup), a DRM fd on the card's
    render node with the i915 fdinfo the kernel would print, and stdio."""
    # Made aside and moved in at once: the agent never reads half a process.
    base = rig.proc / f".{pid}"
    (base / "fd").mkdir(parents=True)
    (base / "fdinfo").mkdir()
    fds = {**other_fds(3), 3: drm_fd(i915_fdinfo(pid, card.pci_address, local=memory))}
    for number, fd in fds.items():
        target = fd.target.replace("renderD128", card.render_node or "")
        os.symlink(target, base / "fd" / str(number))
        if fd.fdinfo is not None:
            (base / "fdinfo" / str(number)).write_text(fd.fdinfo)
    (base / "environ").write_bytes(b"")
    (base / "cgroup").symlink_to(f"/proc/{pid}/cgroup")
    base.rename(rig.proc / str(pid))


def _usage(rig: Rig) -> dict[tuple[str, str], dict[str, Any]]:
    """gas node's latest `/usage`: (pod, container) -> its entry."""
    with urllib.request.urlopen(f"http://127.0.0.1:{rig.metrics_port}/usage", timeout=5) as got:
        body = json.loads(got.read())
    return {(c["pod"], c["container"]): c for c in body["containers"]}


def _events(rig: Rig, pod: str) -> list[str]:
    path = f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name%3D{pod}"
    status, listed = rig.plane.request("GET", path)
    assert status == 200, listed
    return [e["message"] for e in listed["items"] if e["reason"] == "GPUShareExceeded"]


def _card_of(pod: dict[str, Any]) -> FakeCard:
    (segment,) = parse_cards(pod["metadata"]["annotations"][ANNOTATION_CARDS], 1)
    (card,) = segment
    return next(c for c in CARDS if f"card{c.number}" == card)


def test_real_containers_use_beside_their_share_and_the_over_user_evicted_past_its_budget(
    rig: Rig, create: Create
) -> None:
    _wait_published(rig)
    create("hog", _gpu_container("app", 1, 4), labels={"app": "hog"})
    create("calm", _gpu_container("app", 1, 4))
    pods = {name: _wait_running(rig, name) for name in ("hog", "calm")}
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "hog", "namespace": NAMESPACE},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "hog"}}},
    }
    budgets = f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets"
    status, made = rig.plane.request("POST", budgets, budget)
    assert status == 201, made

    def counted() -> bool:
        status = rig.plane.request("GET", f"{budgets}/hog")[1].get("status") or {}
        return status.get("observedGeneration") == 1 and status.get("expectedPods") == 1

    wait_for(counted, 60, "the disruption controller to count the hog's budget")
    pids = {
        name: rig.node.container_pid(pod["status"]["containerStatuses"][0]["containerID"])
        for name, pod in pods.items()
    }
    hog_card = _card_of(pods["hog"])
    try:
        # The hog holds 12 GiB of its card against a 4 GiB share; a host process (this
        # test's) 6 GiB more: the card is contended. calm holds 1 GiB of its 4.
        _holds(rig, pids["hog"], hog_card, 12 * GIB)
        _holds(rig, pids["calm"], _card_of(pods["calm"]), 1 * GIB)
        _holds(rig, os.getpid(), hog_card, 6 * GIB)
        seen = wait_for(lambda: (found := _usage(rig)) and len(found) == 2 and found, 30, "both")
        hog, calm = seen["hog", "app"], seen["calm", "app"]
        assert (hog["namespace"], hog["card"]) == (NAMESPACE, f"card{hog_card.number}")
        assert (hog["memoryBytes"], hog["memoryShareBytes"]) == (12 * GIB, 4 * GIB)
        assert (calm["memoryBytes"], calm["memoryShareBytes"]) == (1 * GIB, 4 * GIB)
        assert hog["millicoresShare"] == calm["millicoresShare"] == 0  # none asked for

        # The budget allows no disruption: the Eviction API refuses, the hog stays, and
        # its Event says why.
        refused = wait_for(
            lambda: [m for m in _events(rig, "hog") if "Eviction API refused" in m],
            60,
            "the refused eviction's Event",
        )
        assert "disruption budget" in refused[0], refused
        assert "is the most over its share there" in refused[0]
        assert _pod(rig, "hog")["metadata"].get("deletionTimestamp") is None

        # gas top on the same tree names each real container by its real cgroup.
        trees = ["--proc-root", str(rig.proc), "--sysfs-root", str(rig.sysfs)]
        top = subprocess.run(
            [sys.executable, "-m", "gas.cli", "top", *trees, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        report = json.loads(top.stdout)
        by_uid = {
            pod["podUID"]: (card["card"], pod["containers"])
            for card in report["cards"]
            for pod in card["pods"]
        }
        for name, pod in pods.items():
            card, (container,) = by_uid[pod["metadata"]["uid"]]
            container_id = pod["status"]["containerStatuses"][0]["containerID"]
            assert container["containerID"] == container_id.removeprefix("containerd://")
            assert container["pids"] == [pids[name]]
            assert card == f"card{_card_of(pod).number}"
        (hog_entry,) = [c for c in report["cards"] if c["card"] == f"card{hog_card.number}"]
        assert hog_entry["other"]["pids"] == [os.getpid()]
        assert hog_entry["other"]["memoryBytes"] == 6 * GIB

        # The budget gone, the next try evicts the hog: calm, within its share, stays.
        status, _ = rig.plane.request("DELETE", f"{budgets}/hog")
        assert status == 200
        wait_for(
            lambda: (
                rig.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/hog")[0] == 404
                or _pod(rig, "hog")["metadata"].get("deletionTimestamp")
            ),
            60,
            "the hog evicted",
        )
        assert any(m.startswith("evicted through the Eviction API") for m in _events(rig, "hog"))
        assert _pod(rig, "calm")["metadata"].get("deletionTimestamp") is None
        assert not _events(rig, "calm")
    finally:
        for pid in (*pids.values(), os.getpid()):
            shutil.rmtree(rig.proc / str(pid), ignore_errors=True)
