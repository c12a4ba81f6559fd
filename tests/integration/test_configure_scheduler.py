"""scripts/configure-scheduler.sh on kubeadm kube-scheduler manifests of several Kubernetes
versions: dry run, apply, idempotence, backup and revert, and clear failures."""

from __future__ import annotations

import copy
import difflib
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "configure-scheduler.sh"
SHIPPED_CONFIG = ROOT / "extender-configuration" / "scheduler-config.yaml"
FIXTURES = ROOT / "tests" / "fixtures"
MANIFESTS = sorted(FIXTURES.glob("kube-scheduler-v1.*.yaml"))
KUBECONFIG_FLAG = "--kubeconfig=/etc/kubernetes/scheduler.conf"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@dataclass
class Node:
    """A control-plane node's files, in a temporary directory."""

    manifest: Path
    gas_dir: Path

    @property
    def backup(self) -> Path:
        return self.manifest.parent / f".{self.manifest.name}.gas-backup"

    @property
    def config(self) -> Path:
        return self.gas_dir / "scheduler-config.yaml"


@pytest.fixture(params=MANIFESTS, ids=[p.stem for p in MANIFESTS])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Node:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    manifest = manifests / "kube-scheduler.yaml"
    shutil.copyfile(request.param, manifest)
    manifest.chmod(0o600)  # as kubeadm writes it
    return Node(manifest, tmp_path / "gas")


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ, PYTHON=sys.executable)
    environment.update(env or {})
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )


def configure(node: Node, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return run("--manifest", node.manifest, "--dir", node.gas_dir, *args)


def scheduler(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def without_gas(pod: dict[str, Any], node: Node, config_path: str | None = None) -> dict[str, Any]:
    """The pod with exactly the script's changes taken out again."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    container = scheduler(pod)
    config_path = config_path or str(node.config)
    command = container["command"]
    command.remove(f"--config={config_path}")
    command.insert(command.index("--leader-elect=true"), KUBECONFIG_FLAG)
    container["volumeMounts"] = [
        m for m in container["volumeMounts"] if not m["name"].startswith("gas-")
    ]
    spec["volumes"] = [v for v in spec["volumes"] if not v["name"].startswith("gas-")]
    del spec["dnsPolicy"]
    return pod


def test_fixtures_are_kubeadm_manifests_of_three_versions() -> None:
    versions = []
    for path in MANIFESTS:
        pod = yaml.safe_load(path.read_text())
        container = scheduler(pod)
        assert pod["kind"] == "Pod" and pod["spec"]["hostNetwork"] is True
        assert KUBECONFIG_FLAG in container["command"]
        versions.append(container["image"].rsplit(":", 1)[1].rsplit(".", 1)[0])
    assert versions == ["v1.25", "v1.28", "v1.30"]


def test_dry_run_prints_a_diff_and_changes_nothing(node: Node) -> None:
    before = node.manifest.read_bytes()
    result = configure(node, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"--- a{node.manifest}" in out and f"+++ b{node.manifest}" in out
    assert f"+    - --config={node.config}" in out
    assert f"-    - {KUBECONFIG_FLAG}" in out
    assert "+  dnsPolicy: ClusterFirstWithHostNet" in out
    assert f"would copy {SHIPPED_CONFIG} to {node.config}" in out
    assert node.manifest.read_bytes() == before
    assert not node.backup.exists() and not node.gas_dir.exists()


def test_apply_loads_the_config_and_keeps_everything_else(node: Node) -> None:
    original_text = node.manifest.read_text()
    original = yaml.safe_load(original_text)
    result = configure(node)
    assert result.returncode == 0, result.stderr
    assert f"updated {node.manifest}" in result.stdout
    assert "removed --kubeconfig" in result.stdout and "ignores it" in result.stdout

    pod = yaml.safe_load(node.manifest.read_text())
    container = scheduler(pod)
    command = container["command"]
    assert command[0] == "kube-scheduler"
    assert f"--config={node.config}" in command
    assert not any(a.startswith("--kubeconfig") for a in command)
    # The serving and delegated-auth kubeconfigs still apply with --config: kept.
    assert "--authentication-kubeconfig=/etc/kubernetes/scheduler.conf" in command
    assert "--authorization-kubeconfig=/etc/kubernetes/scheduler.conf" in command
    assert command[1:] == sorted(command[1:])  # kubeadm's order

    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts["gas-certs"] == {
        "mountPath": str(node.gas_dir),
        "name": "gas-certs",
        "readOnly": True,
    }
    assert mounts["gas-scheduler-config"] == {
        "mountPath": str(node.config),
        "name": "gas-scheduler-config",
        "readOnly": True,
    }
    assert volumes["gas-certs"]["hostPath"] == {
        "path": str(node.gas_dir),
        "type": "DirectoryOrCreate",
    }
    assert volumes["gas-scheduler-config"]["hostPath"] == {"path": str(node.config), "type": "File"}
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    # Everything else (other args, probes, kubeconfig volume, extra volumes) is untouched.
    assert without_gas(pod, node) == original

    # The configuration was copied as is, private to root.
    assert node.config.read_bytes() == SHIPPED_CONFIG.read_bytes()
    assert stat.S_IMODE(node.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(node.manifest.stat().st_mode) == 0o600
    # kubelet runs every non-hidden file in its directory: nothing else may appear there.
    assert sorted(p.name for p in node.manifest.parent.iterdir()) == sorted(
        [node.manifest.name, node.backup.name]
    )


def test_apply_changes_only_the_lines_it_must(node: Node) -> None:
    """The manifest is rewritten from data, yet in kubeadm's layout: the diff is ours only."""
    before = node.manifest.read_text().splitlines()
    assert configure(node).returncode == 0
    after = node.manifest.read_text().splitlines()
    diff = list(difflib.unified_diff(before, after, lineterm="", n=0))[2:]
    removed = [line[1:] for line in diff if line.startswith("-")]
    added = [line[1:].strip() for line in diff if line.startswith("+")]
    assert removed == [f"    - {KUBECONFIG_FLAG}"]
    gas_dir, config = str(node.gas_dir), str(node.config)
    assert added == [
        f"- --config={config}",
        f"- mountPath: {gas_dir}",
        "name: gas-certs",
        "readOnly: true",
        f"- mountPath: {config}",
        "name: gas-scheduler-config",
        "readOnly: true",
        "dnsPolicy: ClusterFirstWithHostNet",
        "- hostPath:",
        f"path: {gas_dir}",
        "type: DirectoryOrCreate",
        "name: gas-certs",
        "- hostPath:",
        f"path: {config}",
        "type: File",
        "name: gas-scheduler-config",
    ]


def test_second_run_changes_nothing(node: Node) -> None:
    assert configure(node).returncode == 0
    manifest = node.manifest.read_bytes()
    backup = node.backup.read_bytes()
    stamp = node.manifest.stat().st_mtime_ns
    result = configure(node)
    assert result.returncode == 0, result.stderr
    assert "nothing to change" in result.stdout
    assert node.manifest.read_bytes() == manifest and node.manifest.stat().st_mtime_ns == stamp
    assert node.backup.read_bytes() == backup
    dry = configure(node, "--dry-run")
    assert dry.returncode == 0 and "nothing to change" in dry.stdout and "---" not in dry.stdout


def test_backup_then_revert_restores_the_original_bytes(node: Node) -> None:
    original = node.manifest.read_bytes()
    assert configure(node).returncode == 0
    assert node.backup.read_bytes() == original
    assert stat.S_IMODE(node.backup.stat().st_mode) == 0o600
    dry = configure(node, "--revert", "--dry-run")
    assert dry.returncode == 0 and f"-    - --config={node.config}" in dry.stdout
    assert node.manifest.read_bytes() != original
    result = configure(node, "--revert")
    assert result.returncode == 0, result.stderr
    assert node.manifest.read_bytes() == original
    assert stat.S_IMODE(node.manifest.stat().st_mode) == 0o600
    assert not node.backup.exists()
    # Nothing left to revert, and a new apply makes a fresh backup.
    again = configure(node, "--revert")
    assert again.returncode == 1 and "nothing to revert" in again.stderr
    assert configure(node).returncode == 0 and node.backup.read_bytes() == original


def test_a_regenerated_manifest_gets_a_fresh_backup(node: Node, tmp_path: Path) -> None:
    """After kubeadm upgrade rewrites the manifest, the old backup is no longer the original."""
    assert configure(node).returncode == 0
    upgraded = node.manifest.read_text()
    upgraded_original = yaml.safe_load(node.backup.read_text())
    scheduler(upgraded_original)["command"].append("--v=2")
    node.manifest.write_text(yaml.safe_dump(upgraded_original, sort_keys=False))
    assert upgraded != node.manifest.read_text()
    assert configure(node).returncode == 0
    assert yaml.safe_load(node.backup.read_text()) == upgraded_original


def test_existing_config_flag_is_replaced(node: Node) -> None:
    pod = yaml.safe_load(node.manifest.read_text())
    scheduler(pod)["command"].append("--config=/etc/kubernetes/old-scheduler-config.yaml")
    node.manifest.write_text(yaml.safe_dump(pod, sort_keys=False))
    result = configure(node)
    assert result.returncode == 0
    assert "replaced --config=/etc/kubernetes/old-scheduler-config.yaml" in result.stdout
    command = scheduler(yaml.safe_load(node.manifest.read_text()))["command"]
    assert [a for a in command if a.startswith("--config")] == [f"--config={node.config}"]


def test_kubeconfig_flag_stays_when_the_config_has_none(node: Node, tmp_path: Path) -> None:
    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    del config["clientConnection"]
    path = tmp_path / "no-kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    result = configure(node, "--config", path)
    assert result.returncode == 0
    assert "has no clientConnection.kubeconfig" in result.stderr
    assert "in-cluster" in result.stderr
    command = scheduler(yaml.safe_load(node.manifest.read_text()))["command"]
    assert KUBECONFIG_FLAG in command and f"--config={node.config}" in command


def test_no_copy_uses_the_config_where_it_is(node: Node, tmp_path: Path) -> None:
    elsewhere = tmp_path / "etc" / "my-scheduler.yaml"
    elsewhere.parent.mkdir()
    shutil.copyfile(SHIPPED_CONFIG, elsewhere)
    result = configure(node, "--no-copy", "--config", elsewhere)
    assert result.returncode == 0, result.stderr
    assert not node.gas_dir.exists()
    pod = yaml.safe_load(node.manifest.read_text())
    assert f"--config={elsewhere}" in scheduler(pod)["command"]
    mounts = {m["name"]: m["mountPath"] for m in scheduler(pod)["volumeMounts"]}
    assert mounts["gas-scheduler-config"] == str(elsewhere)
    assert without_gas(pod, node, str(elsewhere)) == yaml.safe_load(node.backup.read_text())


def test_config_the_scheduler_cannot_load_is_refused(node: Node, tmp_path: Path) -> None:
    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    config["apiVersion"] = "kubescheduler.config.k8s.io/v1beta3"
    path = tmp_path / "beta.yaml"
    path.write_text(yaml.safe_dump(config))
    before = node.manifest.read_bytes()
    result = configure(node, "--config", path)
    version = scheduler(yaml.safe_load(before))["image"].rsplit(":v", 1)[1]
    if version.startswith("1.30"):
        assert result.returncode == 1
        assert "does not load" in result.stderr and result.stderr.count("\n") == 1
        assert node.manifest.read_bytes() == before
    else:
        assert result.returncode == 0, result.stderr


def test_policy_configmap_is_not_a_config(node: Node) -> None:
    policy = ROOT / "extender-configuration" / "scheduler-extender-policy-configmap.yaml"
    result = configure(node, "--config", policy)
    assert result.returncode == 1
    assert "not a KubeSchedulerConfiguration" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_manifest_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "manifests" / "kube-scheduler.yaml"
    result = run("--manifest", missing, "--dir", tmp_path / "gas")
    assert result.returncode == 1
    assert result.stderr == f"configure-scheduler.sh: manifest {missing} not found\n"
    assert not (tmp_path / "gas").exists()


def test_missing_pyyaml_is_a_clear_error(node: Node, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "yaml.py").write_text("raise ImportError('hidden for the test')\n")
    result = run(
        "--manifest", node.manifest, "--dir", node.gas_dir, env={"PYTHONPATH": str(shadow)}
    )
    assert result.returncode == 1
    assert "PyYAML is missing" in result.stderr and "Traceback" not in result.stderr
    assert not node.backup.exists()


def test_help(tmp_path: Path) -> None:
    result = run("--help")
    assert result.returncode == 0
    for flag in ("--manifest", "--config", "--dir", "--no-copy", "--dry-run", "--revert"):
        assert flag in result.stdout
