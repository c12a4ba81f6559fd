"""`gas node` as a real process, with its kubelet double and fake sysfs/devfs, for tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard, write_sysfs
from tests.support.kubelet import KubeletDouble


def short_dir(prefix: str) -> Path:
    """A directory with a short path: a unix socket's path must fit in 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def write_devfs(root: Path, cards: Iterable[FakeCard]) -> Path:
    """`<root>/dri/cardN` and `renderDM` as empty files standing in for device nodes."""
    (root / "dri").mkdir(parents=True, exist_ok=True)
    for card in cards:
        (root / "dri" / f"card{card.number}").touch()
        if card.render_node:
            (root / "dri" / card.render_node).touch()
    return root


class NodeProcess:
    """`python -m gas.cli node ...` for one node; stopped (SIGTERM) by `stop()`."""

    def __init__(
        self,
        node: str,
        kubeconfig: str,
        kubelet: KubeletDouble,
        sysfs: Path,
        devfs: Path,
        log_path: Path,
        extra: Iterable[str] = (),
        prefix: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.log_path = log_path
        # `prefix`: what the agent runs under (e.g. setpriv, to hold the capabilities a
        # deployment gives it).
        self.command = [
            *prefix,
            sys.executable,
            "-m",
            "gas.cli",
            "node",
            "--node-name",
            node,
            "--kubeconfig",
            kubeconfig,
            "--sysfs-root",
            str(sysfs),
            "--devfs-root",
            str(devfs),
            "--device-plugin-dir",
            str(kubelet.plugin_dir),
            "--pod-resources-socket",
            str(kubelet.pod_resources_socket),
            "--metrics-port",
            "0",
            "--rescan",
            "0.3",
            *extra,
        ]
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("KUBECONFIG", None)
        env.pop("NODE_NAME", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
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


class NodeRig:
    """One node: fake sysfs and devfs, a kubelet double, a `gas node` process."""

    def __init__(
        self,
        api: ApiServerDouble,
        kubeconfig: str,
        node: str,
        cards: list[FakeCard],
        log_dir: Path,
        *,
        seed: int = 0,
        extra: Iterable[str] = (),
        status_lag: float = 0.0,
        run: bool = True,
        prefix: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.cards = cards
        self.root = short_dir(f"gas-{node}-")
        self.sysfs = write_sysfs(self.root / "sys", cards)
        self.devfs = write_devfs(self.root / "dev", cards)
        self.kubelet = KubeletDouble(api, node, self.root / "k", seed=seed, status_lag=status_lag)
        self.kubelet.start(run=run)
        self.agent = NodeProcess(
            node,
            kubeconfig,
            self.kubelet,
            self.sysfs,
            self.devfs,
            log_dir / f"gas-node-{node}.log",
            extra,
            prefix,
        )

    def wait_registered(self, shares: int = 10, timeout: float = 30.0) -> None:
        by_resource: dict[str, int] = {}
        for card in self.cards:
            resource = {"i915": "gpu.intel.com/i915", "xe": "gpu.intel.com/xe"}[card.driver]
            by_resource[resource] = by_resource.get(resource, 0) + shares
        deadline = time.monotonic() + timeout
        for resource, count in by_resource.items():
            try:
                self.kubelet.wait_registered(resource, count, max(deadline - time.monotonic(), 0.1))
            except TimeoutError:
                raise TimeoutError(f"{resource} not registered:\n{self.agent.log()}") from None

    def close(self) -> None:
        self.agent.stop()
        self.kubelet.stop()
        shutil.rmtree(self.root, ignore_errors=True)
