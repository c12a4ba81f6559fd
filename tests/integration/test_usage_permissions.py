"""Reading another process's GPU use on the real kernel, with and without the right to.

A real root process holds an fd whose link reads `/dev/dri/renderD128`, as a container's
process holding a GPU does (here a file at that path in its own mount namespace: this
machine has no GPU, so its fdinfo is a plain file's). The proc root gas reads holds only
that process, a link to its real `/proc/<pid>`, so every check on its `fd/` and
`fdinfo/` is the kernel's own.

- As deploy/ runs the agents (root, every capability dropped but the ones the manifests
  add: `SYS_PTRACE`), its fd is read.
- As root without `CAP_SYS_PTRACE` (the process holds capabilities the reader lacks), the
  kernel lists its `fd/` but refuses every link; as another user, it refuses the listing.
  Either way gas says so once, and reports no use rather than a zero: `gas top` and a
  `gas node` agent over several rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiserver import ApiServerDouble
from tests.support.capabilities import deployed_capabilities
from tests.support.fakesysfs import FakeCard, write_sysfs
from tests.support.nodeproc import NodeRig
from tests.support.polling import wait_for
from tests.support.promtext import metric
from tests.support.realk8s import ROOT, free_port

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the reader drops its rights"),
    pytest.mark.skipif(
        not (shutil.which("setpriv") and shutil.which("unshare")),
        reason="needs setpriv and unshare (util-linux)",
    ),
]

DENIED = "whose open files could not be listed (permission denied)"
READ_BUT_NO_STATS = "DRM fd(s) print no usage stats"
NO_CAPABILITIES = ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all", "--"]
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"]


@pytest.fixture(scope="module")
def readable() -> Iterator[Path]:
    """A folder every user can read (pytest's own are root's alone): the proc root and
    the sysfs, for the reader running as another user."""
    with tempfile.TemporaryDirectory(prefix="gas-usage-") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


@pytest.fixture(scope="module")
def holder(readable: Path) -> Iterator[Path]:
    """The proc root: one real root process holding a `/dev/dri/renderD128` fd."""
    script = (
        "mount -t tmpfs tmpfs /dev && mkdir /dev/dri && : > /dev/dri/renderD128 "
        "&& exec sleep 600 3</dev/dri/renderD128"
    )
    # unshare and sh exec in turn: the pid is the sleeping holder's.
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    )

    def holding() -> bool:
        try:
            return os.readlink(f"/proc/{process.pid}/fd/3") == "/dev/dri/renderD128"
        except OSError:
            return False

    try:
        wait_for(holding, 10, "the holder's fd")
        root = readable / "proc"
        root.mkdir()
        (root / str(process.pid)).symlink_to(f"/proc/{process.pid}")
        yield root
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def sysfs(readable: Path) -> Path:
    return write_sysfs(readable / "sys", [FakeCard(0)])


def top(prefix: list[str], proc: Path, sysfs: Path, *more: str) -> tuple[str, str]:
    command = [sys.executable, "-m", "gas.cli", "top", "--proc-root", str(proc)]
    result = subprocess.run(
        [*prefix, *command, "--sysfs-root", str(sysfs), *more],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


def test_the_manifests_give_both_agents_the_same_capabilities() -> None:
    assert deployed_capabilities("deploy/base/node-daemonset.yaml") == deployed_capabilities(
        "deploy/dra/daemonset.yaml"
    )


def test_as_deployed_the_holders_fds_are_read(holder: Path, sysfs: Path) -> None:
    _, err = top(deployed_capabilities("deploy/base/node-daemonset.yaml"), holder, sysfs, "--json")
    assert DENIED not in err
    # Its DRM fd was found and its fdinfo read: a plain file's, with no DRM keys.
    assert f"gas top: 1 {READ_BUT_NO_STATS}" in err


@pytest.mark.parametrize(
    "prefix", [NO_CAPABILITIES, NOBODY], ids=["root-without-sys-ptrace", "another-user"]
)
def test_without_the_right_gas_top_says_so_once_and_reports_no_zero(
    prefix: list[str], holder: Path, sysfs: Path
) -> None:
    out, err = top(prefix, holder, sysfs, "--json")
    said = [line for line in err.splitlines() if DENIED in line]
    assert len(said) == 1 and said[0].startswith("gas top: 1 process(es)"), err
    assert "CAP_SYS_PTRACE" in said[0]
    assert READ_BUT_NO_STATS not in err
    report: dict[str, Any] = json.loads(out)
    (card,) = report["cards"]
    assert report["complete"] is False
    assert card["memoryBytes"] is None and card["other"]["memoryBytes"] is None
    assert card["pods"] == [] and card["other"]["complete"] is False
    table, _ = top(prefix, holder, sysfs)
    assert "n/a of 16.0Gi" in table and "partial result" in table


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as answer:
        body: bytes = answer.read()
    return body


def test_an_agent_without_sys_ptrace_says_so_once_over_its_rounds(
    holder: Path, apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    # Root, as deploy/ runs gas node (its socket goes in the kubelet's root-owned folder),
    # but without CAP_SYS_PTRACE.
    apiserver.add_node({"metadata": {"name": "n1"}})
    port = free_port()
    extra = ["--proc-root", str(holder), "--usage-interval", "0.2"]
    extra += ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
    rig = NodeRig(
        apiserver, kubeconfig, "n1", [FakeCard(0)], tmp_path, extra=extra, prefix=NO_CAPABILITIES
    )
    try:
        rig.wait_registered()

        def rounds() -> float:
            text = fetch(f"http://127.0.0.1:{port}/metrics").decode()
            return metric(text, "gas_gpu_usage_scan_seconds_count") or 0.0

        wait_for(lambda: rounds() >= 5, 30, "five rounds")
        assert json.loads(fetch(f"http://127.0.0.1:{port}/usage"))["containers"] == []
    finally:
        rig.close()
    log = rig.agent.log()
    assert log.count(DENIED) == 1, log
    assert "CAP_SYS_PTRACE" in log
