"""The real control plane of tests/support/realk8s.py: up, usable, and gone when stopped."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.support import realk8s
from tests.support.polling import wait_for

SCHEDULER_CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: default-scheduler
"""


def _node(name: str) -> client.V1Node:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}),
        status=client.V1NodeStatus(
            capacity=capacity,
            allocatable=capacity,
            conditions=[client.V1NodeCondition(type="Ready", status="True")],
        ),
    )


def _pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.example/none:1",
                    resources=client.V1ResourceRequirements(requests={"cpu": "100m"}),
                )
            ]
        ),
    )


def _node_name(core: client.CoreV1Api, pod: str) -> str | None:
    name: str | None = core.read_namespaced_pod(pod, "default").to_dict()["spec"]["node_name"]
    return name


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_real_scheduler_binds_a_pod_on_the_real_api_server(
    tmp_path: Path, k8s: realk8s.Release
) -> None:
    with realk8s.ControlPlane(tmp_path, version=k8s.version) as plane:
        api = plane.client()
        core = client.CoreV1Api(api)
        # No kubelet: a Node is what we POST. Admission (TaintNodesByCondition) taints a new
        # node not-ready, which a kubelet would lift; here the test does.
        core.create_node(_node("node-a"))
        taints = core.read_node("node-a").to_dict()["spec"]["taints"]
        assert [t["key"] for t in taints] == ["node.kubernetes.io/not-ready"]
        core.patch_node("node-a", [{"op": "remove", "path": "/spec/taints"}])
        core.create_namespaced_pod("default", _pod("p"))
        assert _node_name(core, "p") is None

        scheduler = plane.start_scheduler(SCHEDULER_CONFIG)
        try:
            bound = wait_for(
                lambda: _node_name(core, "p"),
                timeout=60,
                what="the pod bound",
            )
        except TimeoutError as exc:
            raise AssertionError(f"not bound; kube-scheduler log:\n{scheduler.tail()}") from exc
        assert bound == "node-a"

        # kubectl and a kubeconfig of a user without rights: RBAC as the real authorizer has it.
        assert "node-a" in plane.kubectl("get", "nodes", "-o", "name").stdout
        nobody = plane.kubeconfig("nobody", "nobody", groups=["some-team"])
        denied = plane.kubectl("get", "pods", kubeconfig=nobody, check=False)
        assert denied.returncode != 0
        assert 'User "nobody" cannot list resource "pods"' in denied.stderr
        api.close()
        pids = [p.pid for p in plane.processes]
        assert len(pids) == 3

    assert not any(_alive(pid) for pid in pids)
    # The logs stay for a failure's message.
    assert os.path.getsize(tmp_path / "kube-apiserver.log") > 0


def test_the_binaries_unpack_and_say_their_version(k8s: realk8s.Release) -> None:
    # The k8s fixture ran: every binary of the control plane is present and unpacks.
    assert realk8s.missing(k8s.version) is None
    kubectl = realk8s.binary("kubectl", k8s.version)
    assert os.access(kubectl, os.X_OK)
    done = subprocess.run(
        [str(kubectl), "version", "--client", "-o", "json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    minor = json.loads(done.stdout)["clientVersion"]["minor"]
    # 1.28's binaries carry no version stamp (v0.0.0-master), 1.37's say 37.
    assert minor == ("" if k8s.version == "1.28" else "37")


def test_missing_names_what_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(realk8s.RELEASES, "9.99", realk8s.Release("9.99", tmp_path / "k8s-9.99"))
    assert (
        realk8s.missing("9.99")
        == f"no real Kubernetes 9.99 binaries: {tmp_path}/k8s-9.99 is absent"
    )
    (tmp_path / "k8s-9.99").mkdir()
    (tmp_path / "k8s-9.99" / "SHA256SUMS").write_text("")
    (tmp_path / "k8s-9.99" / "kubectl.xz").write_bytes(b"")
    assert (
        realk8s.missing("9.99", ["kubectl", "kubelet"]) == f"{tmp_path}/k8s-9.99 lacks kubelet.xz"
    )
    with pytest.raises(ValueError, match=r"no Kubernetes '1\.2' here; known: 1\.28, 1\.37"):
        realk8s.missing("1.2")


WITH_CONTROLLER_MANAGER = [
    pytest.param(
        v,
        id=f"k8s-{v}",
        marks=pytest.mark.skipif(
            realk8s.missing(v, ["kube-controller-manager"]) is not None,
            reason=f"Kubernetes {v}'s folder has no kube-controller-manager",
        ),
    )
    for v in realk8s.VERSIONS
    if v != "1.28"  # ../shared/k8s has none: its tests make by hand what it would
]


def _names(listed: Any) -> list[str]:
    return [item["metadata"]["name"] for item in listed.to_dict()["items"]]


@pytest.mark.parametrize("version", WITH_CONTROLLER_MANAGER)
def test_the_controller_manager_fills_namespaces_makes_claims_and_collects_orphans(
    tmp_path: Path, version: str
) -> None:
    if realk8s.missing(version) is not None:
        pytest.skip(str(realk8s.missing(version)))
    with realk8s.ControlPlane(tmp_path, version=version) as plane:
        core = client.CoreV1Api(plane.client())
        manager = plane.start_controller_manager()
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-x")))

        def filled() -> bool:
            accounts = _names(core.list_namespaced_service_account("team-x"))
            maps = _names(core.list_namespaced_config_map("team-x"))
            return "default" in accounts and "kube-root-ca.crt" in maps

        try:
            wait_for(filled, timeout=60, what="team-x's default account and root CA")
        except TimeoutError as exc:
            raise AssertionError(manager.tail()) from exc
        # A ConfigMap owned by a pod is collected once the pod is gone (garbage collector).
        core.create_namespaced_pod("team-x", _pod("owner"))
        owner = core.read_namespaced_pod("owner", "team-x").to_dict()
        reference = client.V1OwnerReference(
            api_version="v1", kind="Pod", name="owner", uid=owner["metadata"]["uid"]
        )
        core.create_namespaced_config_map(
            "team-x",
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="owned", owner_references=[reference])
            ),
        )
        core.delete_namespaced_pod("owner", "team-x", grace_period_seconds=0)

        def collected() -> bool:
            return "owned" not in _names(core.list_namespaced_config_map("team-x"))

        wait_for(collected, timeout=60, what="the orphaned ConfigMap collected")

        # A pod's claim from a ResourceClaimTemplate is made for it (and owned by it): what
        # a DRA pod needs before kube-scheduler can allocate anything.
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "team-x"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "any"}}]
                    }
                }
            },
        }
        claims = "/apis/resource.k8s.io/v1/namespaces/team-x/resourceclaims"
        status, answer = plane.request(
            "POST", "/apis/resource.k8s.io/v1/namespaces/team-x/resourceclaimtemplates", template
        )
        assert status == 201, answer
        body = plane.client().sanitize_for_serialization(_pod("claimer"))
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        status, answer = plane.request("POST", "/api/v1/namespaces/team-x/pods", body)
        assert status == 201, answer
        made = wait_for(
            lambda: plane.request("GET", claims)[1]["items"], timeout=60, what="the pod's claim"
        )
        (claim,) = made
        assert claim["metadata"]["name"].startswith("claimer-gpu-")
        assert [o["name"] for o in claim["metadata"]["ownerReferences"]] == ["claimer"]
        manager.check_alive()


def _both_versions() -> None:
    for version in ("1.28", "1.37"):
        if realk8s.missing(version) is not None:
            pytest.skip(str(realk8s.missing(version)))


def _schedule_across(workdir: Path, cluster: str, scheduler_version: str) -> tuple[bool, str]:
    """Whether kube-scheduler `scheduler_version` on kube-apiserver `cluster` binds a pod
    (given 60 s to, or 10 s once it has failed to list an API), and its log."""
    with realk8s.ControlPlane(workdir, version=cluster) as plane:
        core = client.CoreV1Api(plane.client())
        core.create_node(_node("node-a"))
        core.patch_node("node-a", [{"op": "remove", "path": "/spec/taints"}])
        core.create_namespaced_pod("default", _pod("p"))
        config = plane.workdir / "scheduler.yaml"
        config.write_text(
            SCHEDULER_CONFIG + f"clientConnection:\n  kubeconfig: {plane.admin_kubeconfig}\n"
        )
        command = [
            str(realk8s.binary("kube-scheduler", scheduler_version)),
            f"--config={config}",
            "--secure-port=0",
        ]
        scheduler = plane._spawn("kube-scheduler", command)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _node_name(core, "p") is None:
            if "could not find the requested resource" in scheduler.log():
                deadline = min(deadline, time.monotonic() + 10)
            time.sleep(0.2)
        scheduler.check_alive()
        return _node_name(core, "p") is not None, scheduler.log()


def test_a_scheduler_newer_than_its_api_server_schedules_nothing(tmp_path: Path) -> None:
    """Why `gas check-config` refuses a kube-scheduler image newer than the cluster:
    kube-scheduler 1.37 on kube-apiserver 1.28 waits for resource.k8s.io forever, while
    1.28's on 1.37 binds (outside the skew policy, which the check warns of)."""
    _both_versions()
    bound, log = _schedule_across(tmp_path / "new-on-old", "1.28", "1.37")
    assert not bound, log[-3000:]
    assert "resourceslices.resource.k8s.io" in log
    bound, log = _schedule_across(tmp_path / "old-on-new", "1.37", "1.28")
    assert bound, log[-3000:]
