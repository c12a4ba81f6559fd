"""The real control plane of tests/support/realk8s.py: up, usable, and gone when stopped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubernetes import client

from tests.support import realk8s
from tests.support.polling import wait_for

pytestmark = pytest.mark.skipif(realk8s.missing() is not None, reason=str(realk8s.missing()))

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


def test_a_real_scheduler_binds_a_pod_on_the_real_api_server(tmp_path: Path) -> None:
    with realk8s.ControlPlane(tmp_path) as plane:
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


def test_missing_names_what_is_absent() -> None:
    # On this machine everything is present; the reason is None and the binaries unpack.
    assert realk8s.missing() is None
    assert os.access(realk8s.binary("kubectl"), os.X_OK)
