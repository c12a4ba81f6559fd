"""Least privilege: gas lives its whole life on exactly the RBAC that deploy/ grants it.

The API-server double enforces the rules that deploy/rbac.yaml (and any other manifest in
deploy/) binds to the `gas` ServiceAccount, answering 403 Forbidden with a real
`kind: Status` body to anything else. gas then starts, lists and watches, filters, binds,
emits events and sets deschedule labels; the double must never have refused a request.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_NODE_CARDS,
    LABEL_DESCHEDULE_POD,
    LABEL_GPU_NUMBERS,
)
from gas.host.discovery import discover_sysfs
from gas.host.kubeapi import core_api as node_core_api
from gas.node.capacity import MEMORY
from gas.node.publish import NodePublisher
from tests.support.apiserver import (
    ApiServerDouble,
    RbacGrant,
    RbacRequest,
    rbac_grants_from_manifests,
)
from tests.support.apiserver.kinds import LEASES
from tests.support.fakesysfs import GIB, FakeCard, remove_card, write_sysfs
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import ledger_of, wait_for_nodes
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
SERVICE_ACCOUNT = ("gas-system", "gas")
NODE_ACCOUNT = ("gas-system", "gas-node")
# The any-cluster install: kube-scheduler, gas and the webhook share this account.
SCHEDULER_ACCOUNT = ("gas-system", "gas-scheduler")
SCHEDULER_LEASE = "gas-scheduler"
DESCHEDULE_CARD0 = "telemetry.aware.scheduling.policy/gas-deschedule-pods-card0"


def deploy_grants(account: tuple[str, str] = SERVICE_ACCOUNT) -> list[RbacGrant]:
    """What deploy/ grants: both ways of installing and their shared base. The bootstrap
    roles the scheduler's account is also bound to (system:kube-scheduler...) are the API
    server's, not in deploy/: they grant nothing here, so gas must live on its own rules."""
    documents: list[Any] = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            documents.extend(yaml.safe_load_all(path.read_text()))
    return rbac_grants_from_manifests(documents, account)


@pytest.fixture
def enforcing() -> Iterator[ApiServerDouble]:
    with ApiServerDouble(rbac=deploy_grants()) as double:
        yield double


def core_api(double: ApiServerDouble, tmp_path: Path) -> kubernetes.client.CoreV1Api:
    config = double.write_kubeconfig(tmp_path / "client-kubeconfig")
    return kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=config))


# ------------------------------------------------------------------ the double bites


def test_grants_are_read_from_the_manifests() -> None:
    grants = deploy_grants()
    assert grants, "deploy/ binds no rules to the gas ServiceAccount"
    bind = RbacRequest("create", "", "pods", "binding", "default", "p")
    assert any(g.allows(bind) for g in grants)
    # A ServiceAccount of the same name elsewhere is not bound.
    assert (
        rbac_grants_from_manifests(
            yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()), ("other", "gas")
        )
        == []
    )


def test_enforcing_double_refuses_what_is_not_granted(
    enforcing: ApiServerDouble, tmp_path: Path
) -> None:
    enforcing.add_pod(gpu_pod("victim"))
    api = core_api(enforcing, tmp_path)
    # Granted: reading pods.
    victim = api.read_namespaced_pod("victim", "default")
    assert victim.metadata is not None and victim.metadata.name == "victim"
    refused = [
        lambda: api.delete_namespaced_pod("victim", "default"),
        lambda: api.create_namespaced_pod("default", gpu_pod("new")),  # type: ignore[arg-type]
        lambda: api.patch_namespaced_pod_status("victim", "default", {"status": {}}),
        lambda: api.list_namespaced_event("default"),
        lambda: api.patch_node("n1", {"metadata": {"labels": {"x": "y"}}}),
    ]
    for call in refused:
        with pytest.raises(kubernetes.client.ApiException) as caught:
            call()
        assert caught.value.status == 403
        status = json.loads(caught.value.body or "{}")
        assert status["kind"] == "Status"
        assert status["reason"] == "Forbidden"
        assert status["code"] == 403
        assert "system:serviceaccount:gas-system:gas" in status["message"]
    verbs = [(d.verb, d.resource_path) for d in enforcing.denied]
    assert verbs == [
        ("delete", "pods"),
        ("create", "pods"),
        ("patch", "pods/status"),
        ("list", "events"),
        ("patch", "nodes"),
    ]
    # The pod was not deleted.
    assert enforcing.get_pod("default", "victim") is not None


def test_watch_and_list_are_separate_verbs() -> None:
    only_list = RbacGrant(frozenset({"list"}), frozenset({""}), frozenset({"pods"}))
    assert only_list.allows(RbacRequest("list", "", "pods", "", "", ""))
    assert not only_list.allows(RbacRequest("watch", "", "pods", "", "", ""))
    # A grant on pods does not cover its subresources, nor another API group.
    assert not only_list.allows(RbacRequest("list", "", "pods", "binding", "", ""))
    assert not only_list.allows(RbacRequest("list", "apps", "pods", "", "", ""))
    scoped = RbacGrant(
        frozenset({"get"}), frozenset({"coordination.k8s.io"}), frozenset({"leases"}), namespace="x"
    )
    assert scoped.allows(RbacRequest("get", "coordination.k8s.io", "leases", "", "x", "gas"))
    assert not scoped.allows(RbacRequest("get", "coordination.k8s.io", "leases", "", "y", "gas"))


# ------------------------------------------------------------------ gas's whole life


def test_gas_runs_its_whole_life_on_the_granted_rbac(
    enforcing: ApiServerDouble, tmp_path: Path, tls_files: TLSFiles
) -> None:
    api = enforcing
    api.add_node(gpu_node("n1", "0.1.2.3", i915="4", memory_max="32Gi"))
    api.add_node(gpu_node("small", "0", i915="1", memory_max="1Gi"))
    running = gpu_pod(
        "running",
        namespace="team-a",
        node="n1",
        annotations={ANNOTATION_CARDS: "card0"},
        phase="Running",
    )
    api.add_pod(running)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    # --bindEvents: every call gas can make, the optional success Event included.
    args = ["--kubeConfig", kubeconfig, "--v", "5", "--bindEvents"]
    gas = GasProcess(args, tmp_path / "gas.log", tls_files)
    try:
        gas.wait_ready()
        wait_for_nodes(gas, "n1", "small")

        # filter then bind, with the pod remembered from filter
        pending = api.add_pod(gpu_pod("fits", container(i915="1", memory_max="1Gi")))
        reply = filter_call(gas, pending, ["n1", "small"])
        assert reply["NodeNames"] == ["n1", "small"]
        assert gas.bind(pending, "n1") == ""

        # bind without a filter: gas reads the pod itself (get pods)
        direct = api.add_pod(gpu_pod("direct", namespace="team-b"))
        assert gas.bind(direct, "n1") == ""

        # no fit anywhere: a Warning event; a failed bind: another event
        huge = api.add_pod(gpu_pod("huge", container(i915="8")))
        reply = filter_call(gas, huge, ["n1", "small"])
        assert reply["NodeNames"] == []
        assert gas.bind(huge, "small") != ""
        wait_for(lambda: len(api.events) >= 3, what="gas's events")

        # deschedule: a node policy label makes gas label the pods on that card
        node = gpu_node("n1", "0.1.2.3", i915="4", memory_max="32Gi")
        node["metadata"]["labels"][DESCHEDULE_CARD0] = "true"
        api.put_node(node)

        def labelled() -> bool:
            pod = api.get_pod("team-a", "running")
            assert pod is not None
            return LABEL_DESCHEDULE_POD in (pod["metadata"].get("labels") or {})

        wait_for(labelled, what="the deschedule label")
        assert ledger_of(gas)["nodes"]
        time.sleep(0.3)  # let any trailing request (event patch, rewatch) land
    finally:
        gas.stop()

    methods = {(m, p.split("?")[0]) for m, p in api.request_targets}
    # gas really did each kind of call this test is about
    assert any(m == "GET" and p == "/api/v1/nodes" for m, p in methods)
    assert any(m == "GET" and p == "/api/v1/pods" for m, p in methods)
    assert any("watch=" in t for m, t in api.request_targets if m == "GET")
    assert any(m == "POST" and p.endswith("/binding") for m, p in methods)
    assert any(m == "GET" and p == "/api/v1/namespaces/team-b/pods/direct" for m, p in methods)
    assert any(m == "POST" and p.endswith("/events") for m, p in methods)
    assert any(m == "PATCH" and p == "/api/v1/namespaces/team-a/pods/running" for m, p in methods)
    assert api.denied == [], f"gas needed more than deploy/ grants: {api.denied}"
    assert "Forbidden" not in gas.log() and '" 403 ' not in gas.log()


def test_leader_election_leases_are_granted(
    enforcing: ApiServerDouble, tmp_path: Path, tls_files: TLSFiles
) -> None:
    from gas.cluster.leader import LEASE_NAME

    grants = deploy_grants()
    for verb, name in (("get", LEASE_NAME), ("update", LEASE_NAME), ("create", "")):
        request = RbacRequest(verb, "coordination.k8s.io", "leases", "", "gas-system", name)
        assert any(g.allows(request) for g in grants), f"{verb} leases is not granted"
    # Only gas's own Lease, only in gas's namespace.
    other = RbacRequest("update", "coordination.k8s.io", "leases", "", "gas-system", "other")
    assert not any(g.allows(other) for g in grants)

    enforcing.add_node(gpu_node("n1", "0.1", i915="2"))
    kubeconfig = enforcing.write_kubeconfig(tmp_path / "kubeconfig")
    gas = GasProcess(
        ["--kubeConfig", kubeconfig, "--leaderElect", "--leaderElectNamespace", "gas-system"],
        tmp_path / "gas.log",
        tls_files,
    )
    try:
        gas.wait_ready()  # ready only once it holds the Lease
        pod = enforcing.add_pod(gpu_pod("p"))
        assert filter_call(gas, pod, ["n1"])["NodeNames"] == ["n1"]
        assert gas.bind(pod, "n1") == ""
    finally:
        gas.stop(signal.SIGTERM)  # a graceful stop releases the Lease (an update)
    leases = [(m, p) for m, p in enforcing.requests if "/leases" in p]
    assert any(m == "POST" for m, _ in leases) or any(m == "PUT" for m, _ in leases)
    assert enforcing.denied == [], f"leader election needed more RBAC: {enforcing.denied}"


# ------------------------------------------------------------------ the scheduler's account


@pytest.fixture
def enforcing_scheduler() -> Iterator[ApiServerDouble]:
    with ApiServerDouble(rbac=deploy_grants(SCHEDULER_ACCOUNT)) as double:
        double.rbac_user = "system:serviceaccount:gas-system:gas-scheduler"
        yield double


def _scheduler_holds_lease(double: ApiServerDouble, holder: str) -> None:
    """kube-scheduler's Lease as it writes it, held by `holder` (`<hostname>_<uuid>`)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": SCHEDULER_LEASE, "namespace": "gas-system"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        },
    }
    with double.store.lock:
        double.store.create_locked(LEASES, "gas-system", lease, from_http=False)


def test_gas_following_the_schedulers_lease_lives_on_the_scheduler_accounts_rbac(
    enforcing_scheduler: ApiServerDouble,
    tmp_path: Path,
    tls_files: TLSFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gas serve --schedulerLease` as deploy/any-cluster runs it: it reads the scheduler's
    Lease, lists and watches, binds and emits Events on the gas-scheduler account's rules,
    and writes no Lease."""
    if not _takes_scheduler_lease():
        pytest.skip("this build of gas serve has no --schedulerLease yet")
    api = enforcing_scheduler
    api.add_node(gpu_node("n1", "0.1", i915="2", memory_max="8Gi"))
    monkeypatch.setenv("POD_NAME", "gas-scheduler-abc12")
    _scheduler_holds_lease(api, "gas-scheduler-abc12_6c2a8e0e-1b5e-4bd3-9d6e-0f0c3f0a9b11")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    args = ["--kubeConfig", kubeconfig, "--schedulerLease", SCHEDULER_LEASE]
    args += ["--leaderElectNamespace", "gas-system", "--bindEvents"]
    gas = GasProcess(args, tmp_path / "gas.log", tls_files)
    try:
        gas.wait_ready()
        wait_for_nodes(gas, "n1")
        pod = api.add_pod(gpu_pod("p", container(i915="1", memory_max="1Gi")))
        assert filter_call(gas, pod, ["n1"])["NodeNames"] == ["n1"]
        assert gas.bind(pod, "n1") == ""
        wait_for(lambda: len(api.events) >= 1, what="the bind Event")
        time.sleep(0.3)  # let any trailing request land
    finally:
        gas.stop(signal.SIGTERM)
    leases = {(m, p.split("?")[0]) for m, p in api.requests if "/leases" in p}
    assert leases == {
        ("GET", f"/apis/coordination.k8s.io/v1/namespaces/gas-system/leases/{SCHEDULER_LEASE}")
    }
    assert api.denied == [], f"gas needed more than deploy/any-cluster grants: {api.denied}"
    assert "Forbidden" not in gas.log()


def test_scheduler_account_is_refused_the_rest(
    enforcing_scheduler: ApiServerDouble, tmp_path: Path
) -> None:
    """Of deploy/'s own rules: gas's reads and Bindings, and one Lease; no Secret, no other
    Lease, no node write. (The bootstrap roles it is also bound to are asked of the real
    authorizer in test_any_cluster_realk8s.)"""
    grants = deploy_grants(SCHEDULER_ACCOUNT)

    def allowed(verb: str, group: str, resource: str, sub: str, ns: str, name: str) -> bool:
        return any(g.allows(RbacRequest(verb, group, resource, sub, ns, name)) for g in grants)

    lease = ("coordination.k8s.io", "leases", "")
    assert allowed("get", *lease, "gas-system", SCHEDULER_LEASE)
    assert allowed("update", *lease, "gas-system", SCHEDULER_LEASE)
    assert not allowed("update", *lease, "gas-system", "gas-extender")
    assert not allowed("get", *lease, "kube-system", SCHEDULER_LEASE)
    assert allowed("create", "", "pods", "binding", "team-a", "p")
    assert not allowed("list", "", "secrets", "", "gas-system", "")
    assert not allowed("patch", "", "nodes", "", "", "n1")
    enforcing_scheduler.add_node({"metadata": {"name": "n1"}})
    api = core_api(enforcing_scheduler, tmp_path)
    node: Any = {"metadata": {"labels": {"x": "y"}}}
    for call in (lambda: api.patch_node("n1", node), lambda: api.list_namespaced_event("x")):
        with pytest.raises(kubernetes.client.ApiException) as caught:
            call()
        assert caught.value.status == 403
        assert "system:serviceaccount:gas-system:gas-scheduler" in (caught.value.body or "")


def _takes_scheduler_lease() -> bool:
    from gas.cli import _go_style, build_parser

    try:
        build_parser().parse_args(_go_style(["serve", "--schedulerLease=x"]))
    except SystemExit:
        return False
    return True


# ------------------------------------------------------------------ helpers


def filter_call(gas: GasProcess, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    response = gas.post("/scheduler/filter", {"Pod": pod, "NodeNames": nodes})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# ------------------------------------------------------------------ gas node's account


@pytest.fixture
def enforcing_node() -> Iterator[ApiServerDouble]:
    with ApiServerDouble(rbac=deploy_grants(NODE_ACCOUNT)) as double:
        double.rbac_user = "system:serviceaccount:gas-system:gas-node"
        yield double


def test_gas_node_keeps_labels_and_capacity_on_its_granted_rbac(
    enforcing_node: ApiServerDouble, tmp_path: Path
) -> None:
    api = enforcing_node
    api.add_node({"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "8"}}})
    cards = discover_sysfs(write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1)]))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    publisher = NodePublisher(node_core_api(kubeconfig), "n1", numa=True)
    assert publisher.publish(cards)
    assert publisher.publish(cards[:1])
    assert publisher.publish([])
    node = api.get_node("n1")
    assert node is not None
    assert LABEL_GPU_NUMBERS not in node["metadata"].get("labels", {})
    assert MEMORY not in node["status"]["capacity"]
    methods = {(m, p.split("?")[0]) for m, p in api.request_targets}
    assert {
        ("GET", "/api/v1/nodes/n1"),
        ("PATCH", "/api/v1/nodes/n1"),
        ("PATCH", "/api/v1/nodes/n1/status"),
    } <= methods
    assert api.denied == [], f"gas node needed more than deploy/ grants: {api.denied}"


def test_gas_node_account_is_refused_the_rest(
    enforcing_node: ApiServerDouble, tmp_path: Path
) -> None:
    enforcing_node.add_node({"metadata": {"name": "n1"}})
    enforcing_node.add_pod(gpu_pod("victim", node="n1"))
    api = core_api(enforcing_node, tmp_path)
    # Granted: its own kinds of reads.
    assert api.read_namespaced_pod("victim", "default").metadata is not None
    binding: Any = {"target": {"kind": "Node", "name": "n1"}, "metadata": {"name": "victim"}}
    node: Any = {"metadata": {"name": "n1"}}
    refused = [
        lambda: api.list_node(),
        lambda: api.replace_node("n1", node),
        lambda: api.delete_namespaced_pod("victim", "default"),
        lambda: api.patch_namespaced_pod_status("victim", "default", {"status": {}}),
        lambda: api.create_namespaced_pod_binding("victim", "default", binding),
    ]
    for call in refused:
        with pytest.raises(kubernetes.client.ApiException) as caught:
            call()
        assert caught.value.status == 403
        assert "system:serviceaccount:gas-system:gas-node" in (caught.value.body or "")
    assert [(d.verb, d.resource_path) for d in enforcing_node.denied] == [
        ("list", "nodes"),
        ("update", "nodes"),
        ("delete", "pods"),
        ("patch", "pods/status"),
        ("create", "pods/binding"),
    ]


def test_gas_node_runs_its_whole_life_on_the_granted_rbac(
    enforcing_node: ApiServerDouble, tmp_path: Path
) -> None:
    """`gas node` as a process, with the kubelet double admitting a GPU pod: it registers,
    publishes the node's labels and capacity, hands the pod gas's card and records it, and
    follows a card unplugged, all on the gas-node account's rules."""
    nodeproc = pytest.importorskip("tests.support.nodeproc", reason="no gas node test harness")
    api = enforcing_node
    api.add_node({"metadata": {"name": "n1"}})
    cards = [FakeCard(0), FakeCard(1, tiles=2)]
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    rig = nodeproc.NodeRig(api, kubeconfig, "n1", cards, tmp_path, extra=["--numa"])
    try:
        rig.wait_registered()
        annotations = {ANNOTATION_CARDS: "card1"}
        api.add_pod(gpu_pod("p", container(i915="1"), node="n1", annotations=annotations))

        def handed_out() -> bool:
            pod = api.get_pod("default", "p") or {}
            notes = pod.get("metadata", {}).get("annotations", {})
            return bool(notes.get(ANNOTATION_NODE_CARDS) == "card1")

        wait_for(handed_out, timeout=30, what="gas-node-cards on the pod")

        def capacity() -> dict[str, Any]:
            node = api.get_node("n1") or {}
            labels = node.get("metadata", {}).get("labels", {})
            status = node.get("status", {}).get("capacity", {})
            return {"cards": labels.get(LABEL_GPU_NUMBERS), "memory": status.get(MEMORY)}

        wait_for(lambda: capacity() == {"cards": "0.1", "memory": str(48 * GIB)}, what="capacity")
        remove_card(rig.sysfs, cards[0])
        wait_for(lambda: capacity()["memory"] == str(32 * GIB), timeout=30, what="unplug")
        time.sleep(0.5)  # let trailing requests (watch renewals, retries) land
    finally:
        rig.close()
    targets = [(m, p) for m, p in api.request_targets]
    paths = {(m, p.split("?")[0]) for m, p in targets}
    assert ("PATCH", "/api/v1/nodes/n1") in paths
    assert ("PATCH", "/api/v1/nodes/n1/status") in paths
    assert ("PATCH", "/api/v1/namespaces/default/pods/p") in paths
    assert any(m == "GET" and "fieldSelector=spec.nodeName" in p for m, p in targets)
    assert api.denied == [], f"gas node needed more than deploy/ grants: {api.denied}"
    assert "Forbidden" not in rig.agent.log() and " 403" not in rig.agent.log()
