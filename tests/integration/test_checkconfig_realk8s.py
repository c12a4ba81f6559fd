"""`gas check-config --kubernetesVersion V` agrees with the real kube-scheduler V: every
configuration it passes, that kube-scheduler loads and serves /healthz with; every one it
refuses, kube-scheduler refuses at start. Run on each version's binaries (the `k8s`
fixture), so what 1.37 no longer loads is seen by 1.37 itself."""

from __future__ import annotations

import copy
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import realk8s
from tests.support.gasproc import TLSFiles

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "any-cluster" / "scheduler-config.yaml"

pytestmark = pytest.mark.timeout(150)


def shipped(plane: realk8s.ControlPlane, tls: TLSFiles) -> dict[str, Any]:
    """deploy/any-cluster's configuration, with this machine's files where the pod has its
    mounted ones."""
    (config_map,) = [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    config["clientConnection"]["kubeconfig"] = plane.admin_kubeconfig
    config["leaderElection"] = {"leaderElect": False}
    (extender,) = config["extenders"]
    extender["tlsConfig"].update(caFile=tls.ca, certFile=tls.client_cert, keyFile=tls.client_key)
    return config


def _v1beta3(config: dict[str, Any]) -> None:
    config["apiVersion"] = "kubescheduler.config.k8s.io/v1beta3"


def _policy_field_spelling(config: dict[str, Any]) -> None:
    # The legacy Policy's spelling, unknown to KubeSchedulerConfiguration's strict decoding.
    extender = config["extenders"][0]
    extender["enableHttps"] = extender.pop("enableHTTPS")


def _resource_without_domain(config: dict[str, Any]) -> None:
    config["extenders"][0]["managedResources"][0]["name"] = "i915"


def _two_binders(config: dict[str, Any]) -> None:
    second = copy.deepcopy(config["extenders"][0])
    second["urlPrefix"] = "https://127.0.0.1:9002/scheduler"
    config["extenders"].append(second)


def _prioritize_without_weight(config: dict[str, Any]) -> None:
    config["extenders"][0]["prioritizeVerb"] = "prioritize"
    config["extenders"][0]["weight"] = 0


def _binpack_scored(config: dict[str, Any]) -> None:
    config["extenders"][0].update(prioritizeVerb="prioritize", weight=1)


# (name, change to the shipped configuration, loaded on 1.28, loaded on 1.37)
CASES: list[tuple[str, Callable[[dict[str, Any]], None] | None, bool, bool]] = [
    ("shipped", None, True, True),
    ("scored", _binpack_scored, True, True),
    # Removed in 1.29 on purpose: 1.28 loads it, 1.37 refuses it.
    ("v1beta3_loaded_by_1_28_only", _v1beta3, True, False),
    ("policy_field_spelling", _policy_field_spelling, False, False),
    ("resource_without_domain", _resource_without_domain, False, False),
    ("two_binders", _two_binders, False, False),
    ("prioritize_without_weight", _prioritize_without_weight, False, False),
]


def scheduler_loads(
    plane: realk8s.ControlPlane, name: str, config: dict[str, Any]
) -> tuple[bool, str]:
    """Whether this version's kube-scheduler starts on `config` (its /healthz answers) or
    exits refusing it; with its log."""
    path = plane.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = realk8s.free_port()
    command = [
        str(realk8s.binary("kube-scheduler", plane.version)),
        f"--config={path}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
    ]
    process = realk8s.Process(name, command, plane.workdir / f"{name}.log")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not process.alive():
                return False, process.tail()
            if _https_healthy(port):
                return True, process.tail()
            time.sleep(0.2)
        raise AssertionError(f"{name}: neither started nor refused in 60 s:\n{process.tail()}")
    finally:
        process.stop()


def _https_healthy(port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # kube-scheduler's own self-signed certificate
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", context=context, timeout=1
        ) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def check_config(path: Path, version: str) -> tuple[int, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gas.cli",
            "check-config",
            str(path),
            "--kubernetesVersion",
            version,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def plane(
    tmp_path_factory: pytest.TempPathFactory, k8s: realk8s.Release
) -> Iterator[realk8s.ControlPlane]:
    workdir = tmp_path_factory.mktemp(f"checkconfig-{k8s.version}")
    with realk8s.ControlPlane(workdir, version=k8s.version) as plane:
        yield plane


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_check_config_agrees_with_the_real_scheduler(
    case: tuple[str, Callable[[dict[str, Any]], None] | None, bool, bool],
    plane: realk8s.ControlPlane,
    tls_files: TLSFiles,
) -> None:
    name, change, on_old, on_new = case
    config = shipped(plane, tls_files)
    if change is not None:
        change(config)
    loads, log = scheduler_loads(plane, name, config)
    expected = on_old if plane.version == "1.28" else on_new
    assert loads is expected, f"kube-scheduler {plane.version} on {name}:\n{log}"
    code, report = check_config(plane.workdir / f"{name}.yaml", plane.version)
    assert (code == 0) is loads, f"check-config on {name} for {plane.version}:\n{report}"
