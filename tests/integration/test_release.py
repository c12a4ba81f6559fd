"""One version: gas/__init__.py's. `gas --version`, the package setup.py builds, the image tag
scripts/build-image.sh gives, and every image of gas that deploy/ names (its kustomizations'
`images:` and the manifests themselves), and the Helm chart's version and appVersion all
say it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gas import __version__

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IMAGE = "gas"


def _documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                yield path, doc


def _repository(image: str) -> str:
    """`gas` of `gas:0.1.0`, `registry:5000/gas` of `registry:5000/gas:0.1.0`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def _images(node: Any) -> Iterator[str]:
    """Every container image in a manifest, wherever its pod template sits."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c["image"] for c in value if isinstance(c, dict) and "image" in c)
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


def test_gas_version_is_the_package_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gas.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == f"gas {__version__}"
    built = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert built.stdout.strip().splitlines()[-1] == __version__


def test_the_image_script_tags_the_package_version() -> None:
    result = subprocess.run(
        [str(ROOT / "scripts" / "build-image.sh"), "--print-tag"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == f"{IMAGE}:{__version__}"


def test_every_kustomization_sets_the_gas_image_to_the_version() -> None:
    kustomizations = [(p, d) for p, d in _documents() if p.name == "kustomization.yaml"]
    assert kustomizations, "no kustomization.yaml under deploy/"
    tagged = []
    for path, doc in kustomizations:
        for entry in doc.get("images") or []:
            if entry.get("name") != IMAGE:
                continue
            tagged.append(path)
            assert entry.get("newTag") == __version__, f"{path}: {entry}"
            assert "newName" not in entry, f"{path}: the release names no registry: {entry}"
    # deploy/ itself at least: `kubectl apply -k deploy/` must run this release.
    assert DEPLOY / "kustomization.yaml" in tagged


def test_every_manifest_runs_this_release_of_gas() -> None:
    images = [(path, image) for path, doc in _documents() for image in _images(doc)]
    ours = [(path, image) for path, image in images if _repository(image) == IMAGE]
    assert ours, "no manifest under deploy/ runs the gas image"
    for path, image in ours:
        assert image == f"{IMAGE}:{__version__}", f"{path.relative_to(ROOT)}: {image}"


def test_the_chart_is_gas_version_and_runs_its_image() -> None:
    """charts/gas's version and appVersion are gas's, and its image tag defaults to the
    appVersion (`helm package` then names the archive gas-<version>.tgz: test_chart.py)."""
    chart = yaml.safe_load((ROOT / "charts" / "gas" / "Chart.yaml").read_text())
    assert (chart["name"], chart["version"], chart["appVersion"]) == (
        "gas",
        __version__,
        __version__,
    )
    values = yaml.safe_load((ROOT / "charts" / "gas" / "values.yaml").read_text())
    assert values["image"] == {"repository": IMAGE, "tag": "", "pullPolicy": "IfNotPresent"}
