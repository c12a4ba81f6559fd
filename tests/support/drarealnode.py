"""`gas dra` on a real node (tests/support/realnode.py) as deploy/dra runs it: on its
ServiceAccount's token bound to a pod on the node, under deploy/dra's RBAC and admission
policy, with the kubelet's sockets under the node's root-dir and containerd's CDI folder."""

from __future__ import annotations

import base64
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from tests.support import realk8s, realnode

DRA_DEPLOY = realk8s.ROOT / "deploy" / "dra"
GAS_NAMESPACE = "gas-system"
STAND_IN = "gas-dra-stand-in"


class GasDra:
    """`gas dra` for a RealNode: the kubelet's sockets under its root-dir, containerd's CDI
    folder, a state folder that outlives restarts."""

    def __init__(
        self,
        node: realnode.RealNode,
        kubeconfig: str,
        sysfs: Path,
        devfs: Path,
        log: Path,
        *,
        pod_uid: str = "",
        metrics_port: int = 0,
        extra: Iterable[str] = (),
    ) -> None:
        self.node = node
        self.log_path = log
        self.pod_uid = pod_uid
        self.metrics_port = metrics_port
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
            str(metrics_port),
            "--metrics-host",
            "127.0.0.1",
            "--rescan",
            "1",
            "--health-interval",
            "1",
            *extra,
        ]
        self.process: realk8s.Process | None = None
        self.start()

    def start(self) -> None:
        env = {"PYTHONUNBUFFERED": "1", "POD_UID": self.pod_uid}
        self.process = realk8s.Process("gas-dra", self.command, self.log_path, env)

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
