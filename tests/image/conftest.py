"""The image, built once per session by scripts/build-image.sh, and a way to run it as the
manifests do.

The tests run containers with podman (or docker with a running daemon). This project's
machines need podman told to use runc with explicit limits (crun cannot start containers
under their hybrid cgroups, and the default limits cannot be raised there): that is written
into a containers.conf of the session's own, never into the image."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gas import __version__

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 900
# Exit status of build-image.sh when this machine cannot build the image at all.
CANNOT_BUILD = 3
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
"""


@dataclass
class Engine:
    """podman or docker, with the environment the session runs it in."""

    tool: str
    env: dict[str, str] = field(default_factory=dict)

    def __call__(
        self, *args: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.tool, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{self.tool} {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def run(
        self,
        image: str,
        args: Sequence[str],
        options: Sequence[str] = (),
        timeout: float = 60,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """A container run to its end: `run --rm OPTIONS IMAGE ARGS`."""
        return self("run", "--rm", *options, image, *args, timeout=timeout, check=check)

    @contextmanager
    def started(self, image: str, args: Sequence[str], options: Sequence[str]) -> Iterator[str]:
        """A container left running for the block; removed after it. Yields its name."""
        name = f"gas-test-{uuid.uuid4().hex[:12]}"
        self("run", "--detach", "--name", name, *options, image, *args)
        try:
            yield name
        finally:
            self("rm", "--force", name, check=False)

    def logs(self, name: str) -> str:
        result = self("logs", name, check=False)
        return result.stdout + result.stderr


# How the manifests run each process (deploy/): read-only root filesystem, no privilege
# escalation, every capability dropped; the extender as the image's user with an emptyDir
# at /tmp, the node agent as root.
EXTENDER = (
    "--user=10001:10001",
    "--read-only",
    "--tmpfs=/tmp",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
)
NODE_AGENT = ("--user=0:0", "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges")


def _engine(tmp: Path) -> Engine | str:
    """The engine to run containers with, or why there is none."""
    env = dict(os.environ)
    if shutil.which("podman"):
        conf = tmp / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        env.setdefault("CONTAINERS_CONF", str(conf))
        engine = Engine("podman", env)
        info = engine("info", check=False)
        if info.returncode == 0:
            return engine
        return f"podman does not work here: {(info.stderr or info.stdout).strip()[-300:]}"
    if shutil.which("docker"):
        engine = Engine("docker", env)
        if engine("info", check=False, timeout=20).returncode == 0:
            return engine
        return "docker is installed but its daemon does not answer, and there is no podman"
    return "no container engine to run the image (podman, or docker with its daemon)"


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    found = _engine(tmp_path_factory.mktemp("engine"))
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def image(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """gas:<version>, built by scripts/build-image.sh with the engine's own tool, once per
    run: under pytest-xdist each worker has a session of its own, and the workers that need
    the image wait for the one that builds it (two builds at once took as long each as one
    alone, on two cores)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return _built(engine)
    shared = tmp_path_factory.getbasetemp().parent  # the workers' common directory
    with open(shared / f"image-{run}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        outcome = shared / f"image-{run}.outcome"
        if outcome.exists():
            kind, _, text = outcome.read_text().partition(" ")
            if kind == "skip":
                pytest.skip(text)
            assert kind == "built", f"another worker's scripts/build-image.sh: {text}"
            return text
        try:
            tag = _built(engine)
        except pytest.skip.Exception as exc:
            outcome.write_text(f"skip {exc.msg}")
            raise
        except BaseException as exc:
            outcome.write_text(f"failed {exc}")
            raise
        outcome.write_text(f"built {tag}")
        return tag


def _built(engine: Engine) -> str:
    env = dict(engine.env, GAS_IMAGE_TOOL=engine.tool)
    try:
        result = subprocess.run(
            [str(ROOT / "scripts" / "build-image.sh")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"scripts/build-image.sh took over {BUILD_TIMEOUT} s: {exc.stderr!r}")
    if result.returncode == CANNOT_BUILD:
        pytest.skip(f"cannot build the image here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, f"scripts/build-image.sh failed:\n{result.stderr}"
    return f"gas:{__version__}"
