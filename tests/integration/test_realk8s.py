"""The real control plane of tests/support/realk8s.py: up, usable, and gone when stopped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

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
