"""The real helm 3 and helm 4, and kubectl 1.37.1, of tests/support/helmtools.py run here:
each reports its pinned version, and helm creates, lints and renders a chart."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import helmtools


def _run(command: list[str | Path], home: Path) -> str:
    """Run a helm or kubectl with its state under `home`, away from any real cluster."""
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env.update(
        HOME=str(home),
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
        KUBECONFIG=str(home / "no-kubeconfig"),
    )
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=home,
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def test_helm_reports_its_pinned_version(
    helm: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    major: int = request.node.callspec.params["helm"]
    version = _run([helm, "version", "--short"], tmp_path).strip()
    assert version.split("+")[0] == helmtools.HELM_WHEELS[major].helm_version
    assert version.startswith(f"v{major}.")


def test_helm_creates_lints_and_renders_a_chart(helm: Path, tmp_path: Path) -> None:
    _run([helm, "create", "scratch"], tmp_path)
    chart = tmp_path / "scratch"
    assert (chart / "Chart.yaml").is_file()
    lint = _run([helm, "lint", "--strict", chart], tmp_path)
    assert "0 chart(s) failed" in lint
    rendered = _run([helm, "template", "demo", chart, "--namespace", "scratch-ns"], tmp_path)
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered) if doc}
    assert {"Deployment", "Service", "ServiceAccount"} <= kinds


def test_newest_kubectl_is_1_37_1(newest_kubectl: Path, tmp_path: Path) -> None:
    out = _run([newest_kubectl, "version", "--client", "-o", "json"], tmp_path)
    assert json.loads(out)["clientVersion"]["gitVersion"] == helmtools.KUBECTL_VERSION == "v1.37.1"
