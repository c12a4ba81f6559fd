"""`gas serve` as a user starts it: the demo quick start, GAS-style flags, clear failures,
and a demo certificate that does not outlive gas."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from gas.cli import _go_style, build_parser
from tests.support.gasproc import child_pids, free_port

GPU_POD: dict[str, Any] = {
    "metadata": {"name": "demo-pod", "namespace": "default", "uid": "uid-demo-pod"},
    "spec": {
        "containers": [
            {
                "name": "app",
                "resources": {
                    "limits": {"gpu.intel.com/i915": "1", "gpu.intel.com/memory.max": "6Gi"}
                },
            }
        ]
    },
}


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_demo_quick_start_filters_and_binds_over_https(tmp_path: Path) -> None:
    """`gas serve --demo`, as scripts/run-demo.sh runs it: the built-in demo cluster, a
    throwaway certificate, HTTPS."""
    port = free_port()
    user = subprocess.Popen(
        [sys.executable, "-m", "gas.cli", "serve", "--demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:
        url = f"https://127.0.0.1:{port}"
        _wait(url + "/readyz")
        reply = requests.post(
            url + "/scheduler/filter",
            json={"Pod": GPU_POD, "NodeNames": ["demo-1card", "demo-2cards", "demo-cpu-only"]},
            verify=False,
            timeout=5,
        ).json()
        # demo-1card (8Gi, one card) and demo-2cards (8Gi per card, card0 holds 6Gi) fit.
        assert reply["NodeNames"] == ["demo-1card", "demo-2cards"]
        assert "demo-cpu-only" in reply["FailedAndUnresolvableNodes"]
        bound = requests.post(
            url + "/scheduler/bind",
            json={
                "PodName": "demo-pod",
                "PodNamespace": "default",
                "PodUID": "uid-demo-pod",
                "Node": "demo-2cards",
            },
            verify=False,
            timeout=5,
        ).json()
        assert bound == {"Error": ""}
        ledger = requests.get(url + "/debug/ledger", verify=False, timeout=5).json()
        assert ledger["pods"]["uid-demo-pod"]["cards"] == [["card1"]]
        # The same pod again: card1 now holds 6Gi too, so no card of demo-2cards has room.
        again = dict(GPU_POD, metadata={**GPU_POD["metadata"], "uid": "uid-2", "name": "p2"})
        reply = requests.post(
            url + "/scheduler/filter",
            json={"Pod": again, "NodeNames": ["demo-2cards"]},
            verify=False,
            timeout=5,
        ).json()
        assert reply["NodeNames"] == []
        assert "memory.max" in reply["FailedNodes"]["demo-2cards"]
    finally:
        user.terminate()
        output = user.communicate(timeout=20)[0].decode()
    assert f"serving https://127.0.0.1:{port} (demo cluster)" in output
    assert "self-signed certificate" in output


def _wait(url: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(url, verify=False, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def test_gas_flag_spellings_are_accepted() -> None:
    parser = build_parser()
    args = parser.parse_args(
        _go_style(
            [
                "serve",
                "-port=9443",
                "-kubeConfig",
                "/tmp/kc",
                "-enableAllowlist",
                "--enableDenylist=false",
                "-cert=/c",
                "-key=/k",
                "-cacert=/ca",
                "-v=4",
            ]
        )
    )
    assert args.port == 9443
    assert args.kubeConfig == "/tmp/kc"
    assert args.enableAllowlist is True
    assert args.enableDenylist is False
    assert (args.cert, args.key, args.cacert, args.v) == ("/c", "/k", "/ca", 4)


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gas.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


def test_https_without_certificate_outside_demo_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\n"
        "users:\n- name: u\n  user: {token: t}\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
    )
    result = _run(["serve", "--kubeConfig", str(kubeconfig), "--port", str(free_port())], tmp_path)
    assert result.returncode == 2
    assert "HTTPS needs --cert and --key" in result.stderr


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_no_cluster_without_demo_is_a_one_line_error_and_serves_nothing(tmp_path: Path) -> None:
    """Neither a kubeconfig (no --kubeConfig, no KUBECONFIG, an empty HOME) nor a pod's
    service account (no KUBERNETES_SERVICE_HOST): gas says so and stops, rather than serve
    the demo cluster to a kube-scheduler that expects its real one."""
    port = free_port()
    user = subprocess.Popen(
        [sys.executable, "-m", "gas.cli", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:
        deadline = time.monotonic() + 30
        while user.poll() is None and time.monotonic() < deadline:
            assert not _listening(port), "gas serve listens with no cluster to serve"
            time.sleep(0.05)
    finally:
        if user.poll() is None:
            user.kill()
        out, err = user.communicate(timeout=20)
    assert user.returncode == 1, out + err
    assert not _listening(port)
    (error,) = err.splitlines()
    assert error.endswith(
        "[ERROR] gas: no cluster to serve: no --kubeConfig or KUBECONFIG, and not in a pod (no "
        "in-cluster configuration); --demo serves the built-in demo cluster"
    ), err
    assert out == ""


def test_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    result = _run(["serve", "--kubeConfig", str(tmp_path / "missing"), "--unsafe"], tmp_path)
    assert result.returncode == 1
    assert "cannot load Kubernetes client configuration" in result.stderr


def test_bad_demo_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "demo.yaml"
    bad.write_text("just: a string\n")
    result = _run(["serve", "--demo", "--demoFile", str(bad), "--unsafe"], tmp_path)
    assert result.returncode == 1
    assert "needs a 'nodes' list" in result.stderr


@pytest.mark.parametrize("command", ["serve", "webhook"])
def test_a_limit_that_makes_no_sense_is_a_clear_error_naming_its_flag(
    command: str, tmp_path: Path
) -> None:
    args = [command, "--demo", "--unsafe"] if command == "serve" else [command]
    if command == "webhook":
        args += ["--cert", str(tmp_path / "c"), "--key", str(tmp_path / "k")]
    result = _run([*args, "--port", str(free_port()), "--idleTimeout", "0"], tmp_path)
    assert result.returncode == 2
    assert "--idleTimeout must be more than 0, got 0.0" in result.stderr


# `gas serve` where os.memfd_create is missing (a system other than Linux): the demo's
# certificate and key then go into a folder of their own.
WITHOUT_MEMFD = (
    "import os, sys; del os.memfd_create; from gas.cli import main; sys.exit(main(sys.argv[1:]))"
)
KEY_PLACES = ["memory", "folder"]


class DemoServe:
    """`gas serve --demo` with a TMPDIR of its own, so that what it leaves there is its own."""

    def __init__(self, place: str, tmp_path: Path, *args: str) -> None:
        self.place = place
        self.tmpdir = tmp_path / "tmp"
        self.tmpdir.mkdir()
        self.port = free_port()
        start = ["-c", WITHOUT_MEMFD] if place == "folder" else ["-m", "gas.cli"]
        self.log = tmp_path / "gas.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, *start, "serve", "--demo", "--port", str(self.port), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(self.tmpdir)},
                start_new_session=True,
            )

    def left(self) -> list[str]:
        return sorted(p.name for p in self.tmpdir.iterdir())

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while not _answers(f"https://127.0.0.1:{self.port}/readyz"):
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def certificate(self) -> str:
        return ssl.get_server_certificate(("127.0.0.1", self.port), timeout=5)

    def stop(self, sig: signal.Signals) -> int:
        if self.process.poll() is None:
            if sig == signal.SIGINT:
                os.killpg(self.process.pid, sig)  # a terminal's Ctrl-C: the whole group
            else:
                os.kill(self.process.pid, sig)  # the kubelet's stop: the master alone
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
            raise


def _answers(url: str) -> bool:
    try:
        return requests.get(url, verify=False, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _check_made_while_serving(demo: DemoServe) -> None:
    made = demo.left()
    if demo.place == "memory":
        # Neither the key nor the certificate is ever in a file system.
        assert made == []
        return
    (folder,) = made
    assert folder.startswith("gas-demo-tls-")
    assert stat.S_IMODE((demo.tmpdir / folder).stat().st_mode) == 0o700


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("place", KEY_PLACES)
def test_the_demo_certificate_and_key_do_not_outlive_gas(
    place: str, sig: signal.Signals, tmp_path: Path
) -> None:
    demo = DemoServe(place, tmp_path)
    try:
        demo.wait_ready()
        _check_made_while_serving(demo)
        assert "BEGIN CERTIFICATE" in demo.certificate()
    finally:
        status = demo.stop(sig)
    assert status == 0, demo.log.read_text()
    assert demo.left() == []


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
@pytest.mark.parametrize("place", KEY_PLACES)
def test_a_worker_restart_keeps_the_demo_certificate(place: str, tmp_path: Path) -> None:
    """The worker gunicorn starts in place of a stopped one serves the same certificate:
    the worker that stopped removed nothing, the master keeps it until it exits."""
    demo = DemoServe(place, tmp_path)
    try:
        demo.wait_ready()
        served = demo.certificate()
        (worker,) = child_pids(demo.process.pid)
        os.kill(worker, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while child_pids(demo.process.pid) in ([], [worker]):
            assert time.monotonic() < deadline, demo.log.read_text()
            time.sleep(0.05)
        demo.wait_ready()
        assert demo.certificate() == served
        _check_made_while_serving(demo)
    finally:
        status = demo.stop(signal.SIGTERM)
    assert status == 0, demo.log.read_text()
    assert demo.left() == []


@pytest.mark.parametrize("place", KEY_PLACES)
def test_a_demo_that_cannot_start_leaves_no_certificate(place: str, tmp_path: Path) -> None:
    # The certificate is made before --leaderElect is refused.
    demo = DemoServe(place, tmp_path, "--leaderElect")
    assert demo.process.wait(timeout=60) == 2
    assert "--leaderElect needs a Kubernetes cluster" in demo.log.read_text()
    assert demo.left() == []
