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

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from gas.dra.driver import DRIVER
from tests.support import realk8s, realnode
from tests.support.drarealnode import (
    GAS_NAMESPACE,
    GasDra,
    bound_token_kubeconfig,
    install_dra_way,
    pod_token_kubeconfig,
    token_kubeconfig,
)
from tests.support.fakesysfs import GIB, FakeCard, write_sysfs
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(300)

NODE = "gas-dra-node"
NAMESPACE = "dra-work"
# Three cards of two tiles, 16 GiB in all each.
CARDS = [FakeCard(n, tiles=2, lmem_per_tile=8 * GIB) for n in range(3)]
CLASS = "gpu.gas.intel.com"
RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass
class Rig:
    plane: realk8s.ControlPlane
    node: realnode.RealNode
    driver: GasDra
    sysfs: Path
    devfs: Path
    kubeconfig: str
    work: Path


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
        yield Rig(plane, node, driver, sysfs, devfs, kubeconfig, work)


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


def _add_template(
    rig: Rig,
    name: str,
    memory: str | None,
    *,
    namespace: str = NAMESPACE,
    card: int | None = None,
    **request: Any,
) -> None:
    """The ResourceClaimTemplate `_template` makes (kept if another test made it already)."""
    status, answer = rig.plane.request(
        "POST",
        f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
        _template(name, memory, namespace=namespace, card=card, **request),
    )
    assert status in (201, 409), answer


def _template(
    name: str,
    memory: str | None,
    *,
    namespace: str = NAMESPACE,
    card: int | None = None,
    **request: Any,
) -> dict[str, Any]:
    """One request `gpu` of `memory` (None: the card's default share), on card `card` if
    given; `request` adds to the request (tiles, tolerations, adminAccess)."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS, **request}
    if memory is not None:
        exactly.setdefault("capacity", {}).setdefault("requests", {})["memory"] = memory
    if card is not None:
        cel = f'device.attributes["{DRIVER}"].cardIndex == {card}'
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


class Create(Protocol):
    def __call__(
        self,
        name: str,
        *templates: str,
        command: str = ...,
        namespace: str = ...,
    ) -> None: ...


@pytest.fixture
def create(rig: Rig) -> Iterator[Create]:
    """`create(name, template, ...)`: a pod whose one container has a claim from each
    template (the pod's claims named `gpu`, `gpu1`, ...), printing its /dev/dri at start
    unless `command` says otherwise; deleted after the test, and gone before the next."""
    made: list[tuple[str, str]] = []

    def make(
        name: str,
        *templates: str,
        command: str = "ls -l /dev/dri; exec sleep 3600",
        namespace: str = NAMESPACE,
    ) -> None:
        claims = [
            {"name": f"gpu{i or ''}", "resourceClaimTemplateName": t}
            for i, t in enumerate(templates)
        ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": claims,
                "containers": [
                    {
                        "name": "app",
                        "image": realnode.IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", command],
                        "resources": {"claims": [{"name": c["name"]} for c in claims]},
                    }
                ],
            },
        }
        status, answer = rig.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        assert status == 201, answer
        made.append((namespace, name))

    yield make
    for namespace, name in made:
        rig.plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    spaces = {n for n, _ in made} | {NAMESPACE}
    wait_for(lambda: not any(_pods(rig, n) for n in spaces), 90, "the pods deleted")
    # Their claims go too (kube-controller-manager), so the next test starts with free cards.
    wait_for(lambda: not any(_claims(rig, n) for n in spaces), 90, "their claims deleted")


def _pods(rig: Rig, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    return list(rig.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods")[1]["items"])


def _claims(rig: Rig, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    return list(rig.plane.request("GET", path)[1]["items"])


def _pod(rig: Rig, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    status, pod = rig.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
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


# ------------------------------------------------------------------ running for months

ENV_COMMAND = (
    "echo masks=$(env | grep -c '^ZE_AFFINITY_MASK='); env | grep -E '^(ZE_AFFINITY_MASK|GAS_)'"
    " | sort; exec sleep 3600"
)


def _container_lines(rig: Rig, pod: dict[str, Any]) -> list[str]:
    """What the pod's one container printed (CRI log lines without their prefix)."""
    meta = pod["metadata"]
    folder = f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    path = rig.node.pod_logs / folder / "app" / "0.log"
    text = wait_for(lambda: path.exists() and path.read_text(), 20, f"{path}")
    return [line.split(" ", 3)[-1] for line in text.splitlines()]


def _claim_of(rig: Rig, pod: dict[str, Any], entry: str = "gpu") -> dict[str, Any]:
    namespace = pod["metadata"]["namespace"]
    (name,) = [
        s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"] if s["name"] == entry
    ]
    code, claim = rig.plane.request(
        "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"
    )
    assert code == 200, claim
    return dict(claim)


def _device(rig: Rig, name: str) -> dict[str, Any]:
    (found,) = [d for d in _wait_published(rig)["spec"]["devices"] if d["name"] == name]
    return dict(found)


def _resource_health(pod: dict[str, Any]) -> dict[str, str]:
    """resourceID -> health, from the container's allocatedResourcesStatus."""
    (status,) = pod["status"]["containerStatuses"]
    return {
        r["resourceID"]: r.get("health", "")
        for entry in status.get("allocatedResourcesStatus") or []
        for r in entry.get("resources") or []
    }


def test_an_unbound_card_is_unhealthy_in_the_pods_status_and_tainted_in_the_slice(
    rig: Rig, create: Create
) -> None:
    """Unbinding a card's driver under running pods: the card stays in the slice with a
    NoExecute taint; the pod whose claim tolerates it keeps running and its status says
    the device is Unhealthy (the kubelet heard it on the health stream); the one that does
    not tolerate it is evicted. Bound again, the taint goes and the device is Healthy."""
    from gas.core.dra_claims import UNHEALTHY_TAINT
    from tests.support.fakesysfs import bind_card, unbind_card

    _wait_published(rig)
    tolerate = [{"key": UNHEALTHY_TAINT, "operator": "Exists", "effect": "NoExecute"}]
    _add_template(rig, "card0-tolerant", "1Gi", card=0, tolerations=tolerate)
    _add_template(rig, "card0-plain", "1Gi", card=0)
    create("tolerant", "card0-tolerant")
    create("plain", "card0-plain")
    _wait_running(rig, "tolerant")
    _wait_running(rig, "plain")
    # The kubelet names a device in the pod's status by its first CDI device ID.
    claim_uid = _claim_of(rig, _pod(rig, "tolerant"))["metadata"]["uid"]
    resource = f"{DRIVER}/gpu={claim_uid}-card0"
    wait_for(
        lambda: _resource_health(_pod(rig, "tolerant")).get(resource) == "Healthy",
        60,
        "the device Healthy in the pod's status",
    )
    unbind_card(rig.sysfs, CARDS[0])
    try:
        tainted = wait_for(lambda: _device(rig, "card0").get("taints"), 60, "card0 tainted")
        (taint,) = tainted
        assert (taint["key"], taint["value"], taint["effect"]) == (
            UNHEALTHY_TAINT,
            "Unbound",
            "NoExecute",
        )
        assert taint.get("timeAdded")
        try:
            wait_for(
                lambda: _resource_health(_pod(rig, "tolerant")).get(resource) == "Unhealthy",
                60,
                "the device Unhealthy in the pod's status",
            )
        except TimeoutError as exc:
            raise AssertionError(
                f"{_pod(rig, 'tolerant')['status']}\n{rig.driver.log()[-3000:]}"
            ) from exc
        # NoExecute: the pod that does not tolerate it is evicted; the other stays.
        wait_for(
            lambda: (
                all(p["metadata"]["name"] != "plain" for p in _pods(rig))
                or _pod(rig, "plain")["metadata"].get("deletionTimestamp")
            ),
            90,
            "the intolerant pod evicted",
        )
        assert _is_running(_pod(rig, "tolerant"))
    finally:
        bind_card(rig.sysfs, CARDS[0])
    wait_for(lambda: not _device(rig, "card0").get("taints"), 60, "card0's taint removed")
    wait_for(
        lambda: _resource_health(_pod(rig, "tolerant")).get(resource) == "Healthy",
        60,
        "the device Healthy again",
    )
    assert _is_running(_pod(rig, "tolerant"))


def test_a_container_with_a_tile_claim_and_a_whole_card_claim_sees_one_right_mask(
    rig: Rig, create: Create
) -> None:
    """One tile of card0 and the whole of card1 (cards of two tiles), in two claims of
    one container: it sees both cards' device nodes and exactly one ZE_AFFINITY_MASK,
    naming its tile of card0 and both tiles of card1 (0,2,3), and its share of each card;
    each claim's status says what was prepared."""
    _wait_published(rig)
    _add_template(rig, "tile-card0", "1Gi", card=0, capacity={"requests": {"tiles": "1"}})
    _add_template(rig, "share-card1", "2Gi", card=1)
    create("two-claims", "tile-card0", "share-card1", command=ENV_COMMAND)
    pod = _wait_running(rig, "two-claims")
    lines = _container_lines(rig, pod)
    assert "masks=1" in lines, lines
    assert [line for line in lines if line.startswith(("ZE_", "GAS_"))] == [
        "GAS_CARD0_MEMORY_BYTES=1073741824",
        "GAS_CARD0_MILLICORES=100",
        "GAS_CARD0_TILES=1",
        "GAS_CARD1_MEMORY_BYTES=2147483648",
        "GAS_CARD1_MILLICORES=100",
        "ZE_AFFINITY_MASK=0,2,3",
    ]
    (status,) = pod["status"]["containerStatuses"]
    pid = rig.node.container_pid(status["containerID"])
    assert rig.node.devices_seen(pid) == realnode.card_devices(CARDS[:2])
    # status.devices, written by gas dra on its own account, as the real API server keeps it.
    tile = _claim_of(rig, pod, "gpu")
    (written,) = wait_for(lambda: _claim_of(rig, pod, "gpu")["status"].get("devices"), 30)
    (result,) = tile["status"]["allocation"]["devices"]["results"]
    assert (written["driver"], written["pool"], written["device"]) == (DRIVER, NODE, "card0")
    assert written["shareID"] == result["shareID"]
    assert [(c["type"], c["status"], c["reason"]) for c in written["conditions"]] == [
        ("Ready", "True", "Prepared")
    ]
    assert written["data"]["tiles"] == [0]
    assert written["data"]["environment"]["ZE_AFFINITY_MASK"] == "0,2,3"
    assert written["data"]["cdiDeviceID"] == f"{DRIVER}/gpu={tile['metadata']['uid']}-card0"


def test_an_admin_access_pod_runs_on_a_shared_card_with_no_mask_and_no_share(
    rig: Rig, create: Create
) -> None:
    """A monitoring pod's claim with adminAccess, in a namespace labelled for it, on a card
    another claim shares: it runs beside that claim, sees the card's device nodes, is told
    no mask and no share, and gas inspect leaves it out of the card's books."""
    from gas.tools.inspector.dra import dra_report

    admin_ns = "dra-admin"
    rig.plane.prepare_namespace(admin_ns)
    rig.plane.kubectl(
        "label", "namespace", admin_ns, "resource.kubernetes.io/admin-access=true", "--overwrite"
    )
    _wait_published(rig)
    _add_template(rig, "share-card2", "4Gi", card=2)
    _add_template(rig, "monitor-card2", None, namespace=admin_ns, card=2, adminAccess=True)
    create("sharer", "share-card2")
    _wait_running(rig, "sharer")
    create("monitor", "monitor-card2", command=ENV_COMMAND, namespace=admin_ns)
    pod = _wait_running_in(rig, "monitor", admin_ns)
    lines = _container_lines(rig, pod)
    assert "masks=0" in lines, lines
    assert [line for line in lines if line.startswith(("ZE_", "GAS_"))] == []
    (status,) = pod["status"]["containerStatuses"]
    pid = rig.node.container_pid(status["containerID"])
    assert rig.node.devices_seen(pid) == realnode.card_devices(CARDS[2:])
    claim = _claim_of(rig, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["adminAccess"] is True and result["device"] == "card2"
    slices = rig.plane.request("GET", f"{RESOURCE}/resourceslices")[1]["items"]
    claims = rig.plane.request("GET", f"{RESOURCE}/resourceclaims")[1]["items"]
    report = dra_report(slices, claims)
    (card2,) = [c for c in report.cards if c.name == "card2"]
    assert card2.consumed["memory"] == 4 * GIB  # the sharer's, not the monitor's
    assert sorted(s.admin for s in card2.shares) == [False, True]


def _wait_running_in(rig: Rig, name: str, namespace: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = _pod(rig, name, namespace)
        return pod if _is_running(pod) else None

    try:
        found: dict[str, Any] = wait_for(running, 90, f"{name} running")
    except TimeoutError as exc:
        raise AssertionError(
            f"{_pod(rig, name, namespace)['status']}\n{rig.driver.log()[-3000:]}"
        ) from exc
    return found


def test_a_card_labelled_exclusive_is_published_whole(rig: Rig, create: Create) -> None:
    """The node's exclusive-cards label naming card2: its device loses
    allowMultipleAllocations (through the node's watch, within seconds), one claim takes it
    all and is told the whole card, the next waits; the label gone, it is shareable
    again."""
    from gas.core.dra_claims import LABEL_EXCLUSIVE_CARDS

    _wait_published(rig)
    patch = f'{{"metadata": {{"labels": {{"{LABEL_EXCLUSIVE_CARDS}": "card2"}}}}}}'
    rig.plane.kubectl("patch", "node", NODE, "--type=merge", "-p", patch)
    try:
        wait_for(lambda: "allowMultipleAllocations" not in _device(rig, "card2"), 20, "card2 whole")
        assert _device(rig, "card0")["allowMultipleAllocations"] is True
        _add_template(rig, "whole-card2", None, card=2)
        create("first", "whole-card2", command=ENV_COMMAND)
        pod = _wait_running(rig, "first")
        (result,) = _claim_of(rig, pod)["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "card2" and not result.get("shareID")
        lines = _container_lines(rig, pod)
        assert "GAS_CARD2_MEMORY_BYTES=17179869184" in lines, lines
        assert "GAS_CARD2_MILLICORES=1000" in lines, lines
        create("second", "whole-card2")
        wait_for(
            lambda: "cannot allocate all claims" in _pending_reason(rig, "second"),
            60,
            "the second pending",
        )
    finally:
        unlabel = f'{{"metadata": {{"labels": {{"{LABEL_EXCLUSIVE_CARDS}": null}}}}}}'
        rig.plane.kubectl("patch", "node", NODE, "--type=merge", "-p", unlabel)
    wait_for(
        lambda: _device(rig, "card2").get("allowMultipleAllocations") is True,
        20,
        "card2 shareable again",
    )


def _failed_prepares(rig: Rig, pods: list[str]) -> list[str]:
    """Events of these pods saying that their claims could not be prepared."""
    events = rig.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")[1]["items"]
    return [
        f"{e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message')}"
        for e in events
        if e["involvedObject"].get("name") in pods
        and "Prepare" in str(e.get("reason"))
        and e.get("type") == "Warning"
    ]


def test_a_second_gas_dra_takes_over_without_one_failed_prepare(rig: Rig, create: Create) -> None:
    """A rolling update with maxSurge, on the real kubelet: gas dra of pod A serves; pods
    keep coming while gas dra of pod B starts beside it (its own sockets, the same state);
    the kubelet registers both; A stops; more pods come. Every claim is prepared at the
    first try and unprepared when its pod goes, and the kubelet's own plugin list shows
    the handover."""
    from gas.dra.driver import dra_socket, registration_socket

    root = str(rig.node.root_dir)
    uid_a, uid_b = "0a0a0a0a-0000-4000-8000-00000000000a", "0b0b0b0b-0000-4000-8000-00000000000b"
    reg_a, reg_b = registration_socket(root, uid_a), registration_socket(root, uid_b)
    rig.driver.stop()
    driver_a = GasDra(
        rig.node, rig.kubeconfig, rig.sysfs, rig.devfs, rig.work / "gas-dra-a.log", pod_uid=uid_a
    )
    driver_b: GasDra | None = None
    try:
        wait_for(lambda: rig.node.registered_plugins() == {reg_a}, 60, "A registered alone")
        _wait_published(rig)
        _add_template(rig, "small", "1Gi")
        names = [f"roll-{i}" for i in range(6)]
        for name in names[:3]:
            create(name, "small")
        # B starts while the kubelet is preparing those claims.
        driver_b = GasDra(
            rig.node,
            rig.kubeconfig,
            rig.sysfs,
            rig.devfs,
            rig.work / "gas-dra-b.log",
            pod_uid=uid_b,
        )
        wait_for(lambda: rig.node.registered_plugins() == {reg_a, reg_b}, 60, "both registered")
        for name in names[:3]:
            _wait_running(rig, name)
        driver_a.stop()
        wait_for(lambda: rig.node.registered_plugins() == {reg_b}, 60, "B registered alone")
        assert not Path(dra_socket(root, uid_a)).exists()
        for name in names[3:]:
            create(name, "small")
        for name in names:
            _wait_running(rig, name)
            _assert_exact_devices(rig, name)
        assert _failed_prepares(rig, names) == []
        for log in (driver_a.log(), driver_b.log()):
            assert " failed:" not in log, log[-3000:]
        assert "prepared claim" in driver_a.log() and "prepared claim" in driver_b.log()
        # Every pod gone through B alone: each claim unprepared, no spec and no record left.
        for name in names:
            rig.plane.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        wait_for(lambda: not _pods(rig), 90, "the pods deleted")
        wait_for(lambda: not _claims(rig), 90, "their claims deleted")
        assert sorted(rig.node.cdi_dir.glob(f"{DRIVER}-*.json")) == []
        state = rig.node.workdir / "gas-dra-state" / "prepared-claims.json"
        assert json.loads(state.read_text())["claims"] == {}
        assert driver_b.log().count("unprepared claim") >= len(names)
    finally:
        driver_a.stop()
        rig.driver.start()  # the module's own, for the tests after this one
        if driver_b is not None:
            driver_b.stop()
