"""The DRA way on a real node: kube-apiserver, kube-scheduler and kube-controller-manager
1.37, kubelet 1.37 and containerd 2.x (tests/support/realnode.py), and `gas dra` as its
DRA driver with fake cards whose device nodes are real character devices.

No extender: kube-scheduler alone allocates each claim a share of a card from the
ResourceSlice `gas dra` publishes, the kubelet asks `gas dra` to prepare it, and containerd
gives the container the devices of the CDI spec `gas dra` wrote. Each container must see
exactly the device nodes of the card its claim was allocated, also through a SIGKILL of
`gas dra` and a kubelet restart.

`gas dra` runs as deploy/dra installs it: on its ServiceAccount's token bound to a pod on
its node, under the RBAC and the ValidatingAdmissionPolicy of deploy/dra, whose DeviceClass
the claims name.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gas.dra.driver import DRIVER
from tests.support import realk8s, realnode
from tests.support.fakesysfs import FakeCard, write_sysfs
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(300)

NODE = "gas-dra-node"
NAMESPACE = "dra-work"
CARDS = [FakeCard(0), FakeCard(1), FakeCard(2)]
CLASS = "gpu.gas.intel.com"
RESOURCE = "/apis/resource.k8s.io/v1"
DRA_DEPLOY = realk8s.ROOT / "deploy" / "dra"
GAS_NAMESPACE = "gas-system"
STAND_IN = "gas-dra-stand-in"


class GasDra:
    """`gas dra` for a RealNode: the kubelet's sockets under its root-dir, containerd's CDI
    folder, a state folder that outlives restarts."""

    def __init__(
        self, node: realnode.RealNode, kubeconfig: str, sysfs: Path, devfs: Path, log: Path
    ) -> None:
        self.node = node
        self.log_path = log
        self.command = [
            sys.executable,
            "-m",
            "gas.cli",
            "dra",
            "--node-name",
            node.name,
            "--kubeconfig",
            kubeconfig,
            "--sysfs-root",
            str(sysfs),
            "--devfs-root",
            str(devfs),
            "--kubelet-root-dir",
            str(node.root_dir),
            "--cdi-dir",
            str(node.cdi_dir),
            "--state-dir",
            str(node.workdir / "gas-dra-state"),
            "--metrics-port",
            "0",
        ]
        self.process: realk8s.Process | None = None
        self.start()

    def start(self) -> None:
        self.process = realk8s.Process(
            "gas-dra", self.command, self.log_path, {"PYTHONUNBUFFERED": "1"}
        )

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node's crash would end it."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=20)
        self.process.stop()
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=20)
            self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Rig:
    plane: realk8s.ControlPlane
    node: realnode.RealNode
    driver: GasDra


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    reason = realnode.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("dra-realnode")
    with contextlib.ExitStack() as stack:
        plane = stack.enter_context(realk8s.ControlPlane(work / "plane", version=realnode.VERSION))
        plane.prepare_namespace(NAMESPACE)
        # Claims from templates, and their release once their pod is gone.
        plane.start_controller_manager()
        node = stack.enter_context(realnode.RealNode(plane, NODE, log_dir=work))
        node.wait_ready()
        sysfs = write_sysfs(node.workdir / "cards" / "sys", CARDS)
        devfs = realnode.write_char_devfs(node.workdir / "cards" / "dev", CARDS)
        install_dra_way(plane)
        kubeconfig = pod_token_kubeconfig(plane, node, work / "gas-dra.kubeconfig")
        driver = GasDra(node, kubeconfig, sysfs, devfs, work / "gas-dra.log")
        stack.callback(driver.stop)
        plane.start_scheduler(
            yaml.safe_dump({"profiles": [{"schedulerName": "default-scheduler"}]})
        )
        yield Rig(plane, node, driver)


def install_dra_way(plane: realk8s.ControlPlane) -> None:
    """deploy/dra as kubectl 1.37 builds it, applied server-side, all but its DaemonSet
    (whose image is not here: the test runs gas dra itself, as the DaemonSet would)."""
    built = plane.kubectl("kustomize", str(DRA_DEPLOY)).stdout
    documents = [d for d in yaml.safe_load_all(built) if d and d["kind"] != "DaemonSet"]
    plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(documents))


def pod_token_kubeconfig(plane: realk8s.ControlPlane, node: realnode.RealNode, path: Path) -> str:
    """A kubeconfig with a token of gas dra's ServiceAccount bound to a pod on `node`, as
    the DaemonSet's pod has it (the API server names the pod's node in such a token)."""
    stand_in = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": STAND_IN, "namespace": GAS_NAMESPACE},
        "spec": {
            "nodeName": node.name,
            "serviceAccountName": "gas-dra",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "stand-in",
                    "image": realnode.IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }
    status, answer = plane.request("POST", f"/api/v1/namespaces/{GAS_NAMESPACE}/pods", stand_in)
    assert status == 201, answer
    return bound_token_kubeconfig(plane, path)


def bound_token_kubeconfig(plane: realk8s.ControlPlane, path: Path) -> str:
    """A kubeconfig with a new token of gas dra's account bound to the stand-in pod."""
    token = plane.kubectl(
        "create",
        "token",
        "gas-dra",
        "-n",
        GAS_NAMESPACE,
        "--duration=1h",
        "--bound-object-kind=Pod",
        f"--bound-object-name={STAND_IN}",
    ).stdout.strip()
    return token_kubeconfig(plane, token, path)


def token_kubeconfig(plane: realk8s.ControlPlane, token: str, path: Path) -> str:
    ca = base64.b64encode(Path(plane.ca_file).read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "real", "cluster": {"server": plane.url, "certificate-authority-data": ca}}
        ],
        "users": [{"name": "gas-dra", "user": {"token": token}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "gas-dra"}}],
        "current-context": "real",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


def _slices(rig: Rig) -> list[dict[str, Any]]:
    status, listed = rig.plane.request(
        "GET", f"{RESOURCE}/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
    )
    assert status == 200, listed
    return list(listed["items"])


def _wait_published(rig: Rig) -> dict[str, Any]:
    def one() -> dict[str, Any] | None:
        found = _slices(rig)
        return found[0] if len(found) == 1 and found[0]["spec"].get("devices") else None

    try:
        published: dict[str, Any] = wait_for(one, 60, "gas dra's ResourceSlice")
    except TimeoutError as exc:
        raise AssertionError(f"gas dra:\n{rig.driver.log()[-3000:]}\n{rig.node.logs()}") from exc
    return published


def _add_template(rig: Rig, name: str, memory: str) -> None:
    """The ResourceClaimTemplate `_template` makes, in the test namespace (kept if another
    test made it already)."""
    status, answer = rig.plane.request(
        "POST",
        f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaimtemplates",
        _template(name, memory),
    )
    assert status in (201, 409), answer


def _template(name: str, memory: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": CLASS,
                                "capacity": {"requests": {"memory": memory}},
                            },
                        }
                    ]
                }
            }
        },
    }


Create = Callable[[str, str], None]


@pytest.fixture
def create(rig: Rig) -> Iterator[Create]:
    """`create(name, template)`: a pod whose one container has a claim from `template`,
    printing its /dev/dri at start; deleted after the test, and gone before the next."""
    made: list[str] = []

    def make(name: str, template: str) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                "containers": [
                    {
                        "name": "app",
                        "image": realnode.IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "ls -l /dev/dri; exec sleep 3600"],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }
        status, answer = rig.plane.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        assert status == 201, answer
        made.append(name)

    yield make
    for name in made:
        rig.plane.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    wait_for(lambda: not _pods(rig), 90, "the pods deleted")
    # Their claims go too (kube-controller-manager), so the next test starts with free cards.
    wait_for(lambda: not _claims(rig), 90, "their claims deleted")


def _pods(rig: Rig) -> list[dict[str, Any]]:
    return list(rig.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")[1]["items"])


def _claims(rig: Rig) -> list[dict[str, Any]]:
    path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
    return list(rig.plane.request("GET", path)[1]["items"])


def _pod(rig: Rig, name: str) -> dict[str, Any]:
    status, pod = rig.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    assert status == 200, pod
    return dict(pod)


def _wait_running(rig: Rig, name: str, timeout: float = 90.0) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = _pod(rig, name)
        return pod if _is_running(pod) else None

    try:
        found: dict[str, Any] = wait_for(running, timeout, f"{name} running")
    except TimeoutError as exc:
        pod = _pod(rig, name)
        raise AssertionError(
            f"{name} not running: {pod['spec'].get('nodeName')} {pod['status']}\n"
            f"gas dra:\n{rig.driver.log()[-3000:]}\n" + rig.node.logs()
        ) from exc
    return found


def _is_running(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and all(s.get("state", {}).get("running") for s in statuses)


def _allocated_card(rig: Rig, pod: dict[str, Any]) -> str:
    """The card kube-scheduler allocated the pod's claim (its one result)."""
    (status,) = pod["status"]["resourceClaimStatuses"]
    path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{status['resourceClaimName']}"
    code, claim = rig.plane.request("GET", path)
    assert code == 200, claim
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == NODE
    assert result.get("shareID"), result  # a share of a card that allows several
    return str(result["device"])


def _assert_exact_devices(rig: Rig, name: str) -> tuple[str, str]:
    """The pod's container sees exactly the device nodes of its claim's card; returns the
    card and the container's ID."""
    pod = _pod(rig, name)
    card = _allocated_card(rig, pod)
    wanted = realnode.card_devices(c for c in CARDS if f"card{c.number}" == card)
    assert wanted, card
    (status,) = pod["status"]["containerStatuses"]
    pid = rig.node.container_pid(status["containerID"])
    assert rig.node.devices_seen(pid) == wanted, (name, card)
    allowed = rig.node.devices_allowed(pid)
    assert allowed is None or allowed == set(wanted.values()), (name, card)
    return card, str(status["containerID"])


def _pending_reason(rig: Rig, name: str) -> str:
    pod = _pod(rig, name)
    conditions = pod["status"].get("conditions") or []
    return " ".join(str(c.get("message", "")) for c in conditions if c["type"] == "PodScheduled")


# ------------------------------------------------------------------------------- tests


def test_gas_dra_publishes_one_shareable_device_per_card(rig: Rig) -> None:
    published = _wait_published(rig)
    spec = published["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
    assert spec["pool"]["name"] == NODE and spec["pool"]["resourceSliceCount"] == 1
    devices = {d["name"]: d for d in spec["devices"]}
    assert set(devices) == {"card0", "card1", "card2"}
    for device in devices.values():
        assert device["allowMultipleAllocations"] is True
        assert set(device["capacity"]) >= {"memory", "millicores"}
        assert device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]


def test_claims_share_cards_as_the_scheduler_allocates_them_and_each_container_gets_its_card(
    rig: Rig, create: Create
) -> None:
    _wait_published(rig)
    _add_template(rig, "ten", "10Gi")
    # 10 GiB of a 16 GiB card: one such share per card, so three run and the fourth waits.
    for index in range(4):
        create(f"ten-{index}", "ten")
    names = [f"ten-{i}" for i in range(4)]

    def settled() -> tuple[list[str], str] | None:
        up = [n for n in names if _is_running(_pod(rig, n))]
        down = [n for n in names if n not in up]
        if len(up) == 3 and "cannot allocate all claims" in _pending_reason(rig, down[0]):
            return up, down[0]
        return None

    try:
        running, waiting = wait_for(settled, 120, "three pods running and one pending")
    except TimeoutError as exc:
        states = {n: _pod(rig, n)["status"] for n in names}
        raise AssertionError(f"{states}\ngas dra:\n{rig.driver.log()[-3000:]}") from exc
    cards = sorted(_assert_exact_devices(rig, name)[0] for name in running)
    assert cards == ["card0", "card1", "card2"]
    assert "cannot allocate all claims" in _pending_reason(rig, waiting), _pod(rig, waiting)
    # Its card freed (the claim released once the pod is gone), the waiting pod starts there.
    freed_card = _assert_exact_devices(rig, running[0])[0]
    rig.plane.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{running[0]}")
    _wait_running(rig, waiting, timeout=120)
    assert _assert_exact_devices(rig, waiting)[0] == freed_card


def test_devices_hold_through_a_sigkill_of_gas_dra_and_a_kubelet_restart(
    rig: Rig, create: Create
) -> None:
    _wait_published(rig)
    _add_template(rig, "four", "4Gi")
    create("before", "four")
    _wait_running(rig, "before")
    before = _assert_exact_devices(rig, "before")

    rig.driver.kill()
    rig.driver.start()
    _wait_published(rig)
    create("after-kill", "four")
    _wait_running(rig, "after-kill")
    _assert_exact_devices(rig, "after-kill")

    rig.node.restart_kubelet()
    rig.node.wait_ready()
    _wait_published(rig)
    create("after-kubelet", "four")
    _wait_running(rig, "after-kubelet")
    _assert_exact_devices(rig, "after-kubelet")
    # What ran before both was never restarted nor given other devices.
    assert _assert_exact_devices(rig, "before") == before
    for name in ("before", "after-kill", "after-kubelet"):
        (status_,) = _pod(rig, name)["status"]["containerStatuses"]
        assert status_["restartCount"] == 0, name


def test_a_claim_whose_prepare_meets_a_sigkill_still_gets_exactly_its_card(
    rig: Rig, create: Create
) -> None:
    """gas dra SIGKILLed before a pod's claim is prepared: the kubelet's prepare fails and
    the pod waits; once the driver is back the kubelet's retry prepares it, and the
    container gets the allocated card and no other."""
    _wait_published(rig)
    _add_template(rig, "four", "4Gi")
    rig.driver.kill()
    create("mid-prepare", "four")
    time.sleep(5)
    assert not _is_running(_pod(rig, "mid-prepare")), "started with no driver to prepare it"
    rig.driver.start()
    _wait_running(rig, "mid-prepare", timeout=120)
    _assert_exact_devices(rig, "mid-prepare")
    (status_,) = _pod(rig, "mid-prepare")["status"]["containerStatuses"]
    assert status_["restartCount"] == 0


def _slice_for(node: str, name: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "card9"}],
        },
    }


def test_the_admission_policy_keeps_gas_dra_to_its_own_nodes_slices(
    rig: Rig, tmp_path: Path
) -> None:
    """deploy/dra's ValidatingAdmissionPolicy on the real API server: gas dra's token of one
    node writes that node's slice (the running driver does) and no other's; a token bound
    to no pod names no node, and writes nothing."""
    _wait_published(rig)
    core_node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other-node"}}
    status, answer = rig.plane.request("POST", "/api/v1/nodes", core_node)
    assert status in (201, 409), answer
    node_bound = bound_token_kubeconfig(rig.plane, tmp_path / "bound.kubeconfig")
    refused = rig.plane.kubectl(
        "create",
        "-f",
        "-",
        kubeconfig=node_bound,
        check=False,
        input=yaml.safe_dump(_slice_for("other-node", "other-node-gas")),
    )
    assert refused.returncode != 0
    assert f"gas dra on node {NODE} may write only ResourceSlices of that node" in refused.stderr
    assert "not of other-node" in refused.stderr
    # Its own node's: allowed (a second slice, deleted at once).
    own = rig.plane.kubectl(
        "create",
        "-f",
        "-",
        kubeconfig=node_bound,
        input=yaml.safe_dump(_slice_for(NODE, "own-node-extra")),
    )
    assert own.returncode == 0
    # gas dra itself may have removed it already: a slice of its node it did not write.
    gone = rig.plane.kubectl(
        "delete", "resourceslice", "own-node-extra", kubeconfig=node_bound, check=False
    )
    assert gone.returncode == 0 or "NotFound" in gone.stderr, gone.stderr
    # Its own node, another driver's name: refused.
    foreign = rig.plane.kubectl(
        "create",
        "-f",
        "-",
        kubeconfig=node_bound,
        check=False,
        input=yaml.safe_dump(_slice_for(NODE, "foreign", driver="gpu.intel.com")),
    )
    assert foreign.returncode != 0
    assert "only ResourceSlices of driver gpu.gas.intel.com, not of gpu.intel.com" in (
        foreign.stderr
    )
    # Nor may it delete another node's slice, whoever wrote it.
    rig.plane.kubectl("create", "-f", "-", input=yaml.safe_dump(_slice_for("other-node", "theirs")))
    denied = rig.plane.kubectl(
        "delete", "resourceslice", "theirs", kubeconfig=node_bound, check=False
    )
    assert denied.returncode != 0 and "not of other-node" in denied.stderr
    rig.plane.kubectl("delete", "resourceslice", "theirs")
    # A token of the account bound to no pod: no node, no write.
    unbound = token_kubeconfig(
        rig.plane,
        rig.plane.kubectl("create", "token", "gas-dra", "-n", GAS_NAMESPACE).stdout.strip(),
        tmp_path / "unbound.kubeconfig",
    )
    nameless = rig.plane.kubectl(
        "create",
        "-f",
        "-",
        kubeconfig=unbound,
        check=False,
        input=yaml.safe_dump(_slice_for(NODE, "no-node")),
    )
    assert nameless.returncode != 0
    assert "must call with its pod's projected token" in nameless.stderr


def test_a_pod_asking_only_for_i915_gets_a_share_through_the_device_class(
    rig: Rig,
) -> None:
    """No claim in the pod: kube-scheduler makes one from deploy/dra's DeviceClass
    (extendedResourceName gpu.intel.com/i915), with the capacity's defaults, and the
    container gets one card."""
    _wait_published(rig)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain-i915", "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": realnode.IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "ls -l /dev/dri; exec sleep 3600"],
                    "resources": {"limits": {"gpu.intel.com/i915": "1"}},
                }
            ],
        },
    }
    status, answer = rig.plane.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    assert status == 201, answer
    try:
        running = _wait_running(rig, "plain-i915")
        (mapped,) = running["status"]["extendedResourceClaimStatus"]["requestMappings"]
        assert mapped["resourceName"] == "gpu.intel.com/i915"
        claim_name = running["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{claim_name}"
        code, claim = rig.plane.request("GET", path)
        assert code == 200, claim
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == DRIVER and result.get("shareID")
        card = result["device"]
        (status_,) = running["status"]["containerStatuses"]
        pid = rig.node.container_pid(status_["containerID"])
        wanted = realnode.card_devices(c for c in CARDS if f"card{c.number}" == card)
        assert rig.node.devices_seen(pid) == wanted
    finally:
        rig.plane.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/plain-i915")
        wait_for(lambda: not _pods(rig), 90, "the pod deleted")
        wait_for(lambda: not _claims(rig), 90, "its claim deleted")


def test_an_unchanged_memory_pod_runs_on_claims_of_its_memory_through_the_webhook(
    rig: Rig, tmp_path: Path
) -> None:
    """`gas webhook --draClaims` registered: a pod written for gas (i915 with memory.max)
    runs as written, on claims that consume its memory per card. 2 cards of 10Gi each
    must be distinct; a third pod's 10Gi then fits only on the card left whole, which a
    default share (a tenth of a card) would not have told apart."""
    from gas.tools.webhook_config import webhook_configuration
    from tests.integration.test_manifests import webhook_claim_rules
    from tests.support.gasproc import make_tls_files
    from tests.support.webhookproc import WebhookProcess

    _wait_published(rig)
    plane = rig.plane
    user = "gas-webhook-claims"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = {"metadata": {"name": user}, "rules": webhook_claim_rules()}
    assert plane.request("POST", f"{rbac}/clusterroles", role)[0] == 201
    binding = {
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    assert plane.request("POST", f"{rbac}/clusterrolebindings", binding)[0] == 201
    tls = make_tls_files(tmp_path)
    webhook = WebhookProcess(
        ["--draClaims", "--kubeConfig", plane.kubeconfig("webhook", user)],
        tmp_path / "webhook.log",
        tls,
    )
    configurations = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    configuration = webhook_configuration(
        Path(tls.ca).read_bytes(),
        url=f"https://127.0.0.1:{webhook.port}/admission/pods",
        dra_claims=True,
    )
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"

    def gpu_pod(name: str, gpus: str, memory: str) -> dict[str, Any]:
        limits = {"gpu.intel.com/i915": gpus, "gpu.intel.com/memory.max": memory}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "app",
                        "image": realnode.IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "exec sleep 3600"],
                        "resources": {"limits": limits},
                    }
                ],
            },
        }

    def results(pod: dict[str, Any]) -> list[dict[str, Any]]:
        (status,) = pod["status"]["resourceClaimStatuses"]
        path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{status['resourceClaimName']}"
        code, claim = plane.request("GET", path)
        assert code == 200, claim
        found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
        return found

    try:
        webhook.wait_status("/readyz", 200)
        assert plane.request("POST", configurations, configuration)[0] == 201

        def converted() -> bool:
            status, answer = plane.request("POST", pods + "?dryRun=All", gpu_pod("p", "1", "1Gi"))
            assert status == 201, answer
            return bool(answer["spec"].get("resourceClaims"))

        wait_for(converted, 30, "the webhook registered")
        for name, gpus, memory in (("wide", "2", "20Gi"), ("narrow", "1", "10Gi")):
            status, answer = plane.request("POST", pods, gpu_pod(name, gpus, memory))
            assert status == 201, answer
        wide = results(_wait_running(rig, "wide"))
        assert len({r["device"] for r in wide}) == 2  # distinct cards
        assert all(r["consumedCapacity"]["memory"] == "10Gi" for r in wide), wide
        (narrow,) = results(_wait_running(rig, "narrow"))
        assert narrow["consumedCapacity"]["memory"] == "10Gi"
        assert narrow["device"] not in {r["device"] for r in wide}
        # Each container sees exactly its claim's cards.
        for name, allocated in (("wide", wide), ("narrow", [narrow])):
            cards = {r["device"] for r in allocated}
            (status_,) = _pod(rig, name)["status"]["containerStatuses"]
            pid = rig.node.container_pid(status_["containerID"])
            wanted = realnode.card_devices(c for c in CARDS if f"card{c.number}" in cards)
            assert rig.node.devices_seen(pid) == wanted, name
    finally:
        plane.request("DELETE", f"{configurations}/{configuration['metadata']['name']}")
        webhook.stop()
        for name in ("wide", "narrow"):
            plane.request("DELETE", f"{pods}/{name}")
        wait_for(lambda: not _pods(rig), 90, "the pods deleted")
        wait_for(lambda: not _claims(rig), 90, "their claims deleted")
