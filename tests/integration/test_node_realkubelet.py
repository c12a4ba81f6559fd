"""The node half on a real node: kubelet 1.37 and containerd 2.x (tests/support/realnode.py)
against a real control plane, with a fake sysfs and real character device nodes standing
in for the cards. `gas node` registers with that kubelet as its device plugin; pods placed
by the real kube-scheduler with the real `gas serve` as its extender are started by the
kubelet, and each container must see exactly the device nodes of the cards gas wrote into
its pod's `gas-container-cards`: in its own /dev/dri and in its devices cgroup, also
through a kubelet restart and a `gas node` restart.

One real node per machine (the kubelet's device-plugin socket has a fixed path): the
tests share one, in file order, and hold a lock while it lives.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.utils import parse_quantity

from gas.core.model import ANNOTATION_CARDS, LABEL_GPU_NUMBERS, parse_cards
from tests.support import realk8s, realnode
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
        agent = realnode.GasNode(node, agent_kubeconfig, sysfs, devfs, work / "gas-node.log")
        stack.callback(agent.stop)
        gas = GasProcess(
            ["--kubeConfig", plane.admin_kubeconfig], work / "gas-serve.log", tls_files
        )
        stack.callback(gas.stop)
        gas.wait_ready()
        plane.start_scheduler(_scheduler_configuration(gas.port, tls_files))
        yield Rig(plane, node, agent, gas, client.CoreV1Api(plane.client()))


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

    def make(name: str, *containers: dict[str, Any]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": list(containers), "terminationGracePeriodSeconds": 1},
        }
        rig.core.create_namespaced_pod(NAMESPACE, body)
        made.append(name)

    yield make
    for name in made:
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
