"""`gas dra` as a real process for tests: fake sysfs and devfs, its kubelet double, its
directories, and the ResourceClaims the tests make on the API-server double."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gas.dra.driver import DRIVER
from tests.support.apiserver import ApiServerDouble
from tests.support.drakubelet import ClaimRef, DraKubeletDouble
from tests.support.fakesysfs import FakeCard, write_sysfs
from tests.support.nodeproc import short_dir, write_devfs


def allocated_claim(
    name: str,
    node: str,
    results: Iterable[Mapping[str, Any]],
    namespace: str = "default",
) -> dict[str, Any]:
    """A ResourceClaim as kube-scheduler leaves it: each result `{request, device}` plus
    optional `shareID` and `consumedCapacity`, for this driver and the node's pool."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": DRIVER, "pool": node, **dict(result)} for result in results
                    ]
                }
            }
        },
    }


def share(request: str, device: str, **consumed: str) -> dict[str, Any]:
    """One result on a shared card, with a fresh shareID."""
    return {
        "request": request,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": "1Gi", "millicores": "100", "tiles": "0", **consumed},
    }


class DraRig:
    """One node: fake sysfs and devfs, a DRA kubelet double, and `gas dra`."""

    def __init__(
        self,
        api: ApiServerDouble,
        kubeconfig: str,
        node: str,
        cards: list[FakeCard],
        log_dir: Path,
        extra: Iterable[str] = (),
        pod_uid: str = "",
        metrics_port: int = 0,
    ) -> None:
        self.api = api
        self.kubeconfig = kubeconfig
        self.node = node
        self.cards = cards
        self.root = short_dir(f"gas-dra-{node}-")
        self.sysfs = write_sysfs(self.root / "sys", cards)
        self.devfs = write_devfs(self.root / "dev", cards)
        self.kubelet_root = self.root / "k"
        self.cdi_dir = self.root / "cdi"
        self.state_dir = self.root / "state"
        self.kubelet = DraKubeletDouble(self.kubelet_root)
        self.log_path = log_dir / f"gas-dra-{node}{'-' + pod_uid if pod_uid else ''}.log"
        self.extra = list(extra)
        self.pod_uid = pod_uid
        self.metrics_port = metrics_port
        self.process: subprocess.Popen[bytes] | None = None
        self.twin_of: DraRig | None = None
        if api.get_node(node) is None:
            api.add_node({"metadata": {"name": node}})

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gas.cli",
            "dra",
            "--node-name",
            self.node,
            "--kubeconfig",
            self.kubeconfig,
            "--sysfs-root",
            str(self.sysfs),
            "--devfs-root",
            str(self.devfs),
            "--kubelet-root-dir",
            str(self.kubelet_root),
            "--cdi-dir",
            str(self.cdi_dir),
            "--state-dir",
            str(self.state_dir),
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-host",
            "127.0.0.1",
            "--rescan",
            "0.3",
            "--health-interval",
            "0.3",
            *self.extra,
        ]

    def start(self) -> DraRig:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("KUBECONFIG", None)
        env.pop("NODE_NAME", None)
        env.pop("POD_UID", None)
        if self.pod_uid:
            env["POD_UID"] = self.pod_uid
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env
            )
        return self

    def start_registered(self) -> DraRig:
        self.start()
        try:
            self.kubelet.register(timeout=30, socket=self.registration_name())
        except TimeoutError:
            raise TimeoutError(f"gas dra did not register:\n{self.log()}") from None
        return self

    def registration_name(self) -> str | None:
        """The name of this instance's registration socket (None: whichever there is)."""
        from gas.dra.driver import registration_socket

        if not self.pod_uid:
            return None
        return Path(registration_socket(str(self.kubelet_root), self.pod_uid)).name

    def twin(self, pod_uid: str, log_dir: Path) -> DraRig:
        """A second gas dra of this node, as a rolling update starts one: the same cards,
        kubelet root, CDI and state folders, another pod UID, a kubelet double of its own."""
        other = DraRig.__new__(DraRig)
        other.__dict__.update(self.__dict__)
        other.pod_uid = pod_uid
        other.kubelet = DraKubeletDouble(self.kubelet_root)
        other.log_path = log_dir / f"gas-dra-{self.node}-{pod_uid}.log"
        other.process = None
        other.twin_of = self
        return other

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        self.kubelet.close()
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.process = None
        return process.returncode

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        code = self.process.wait(timeout=timeout)
        self.process = None
        return code

    def add_claim(self, name: str, results: Iterable[Mapping[str, Any]]) -> ClaimRef:
        stored = self.api.add_object("resourceclaims", allocated_claim(name, self.node, results))
        meta = stored["metadata"]
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    def spec_files(self) -> list[Path]:
        return sorted(self.cdi_dir.glob("*.json")) if self.cdi_dir.exists() else []

    def slices(self) -> list[dict[str, Any]]:
        return [
            s
            for s in self.api.list_objects("resourceslices")
            if s["spec"].get("nodeName") == self.node and s["spec"].get("driver") == DRIVER
        ]

    def close(self) -> None:
        self.stop()
        if self.twin_of is None:
            shutil.rmtree(self.root, ignore_errors=True)
