"""gas installed as a user installs it: `pip install gas-gpu-sharing` with no extras.

Every command but `gas node` works without grpcio, protobuf and pyudev (the `node` and
`labeler` extras); `gas node` says which extra to install. The first test checks the import
structure cheaply, in a process whose imports of those packages fail; the others build the
wheel, check the name it is published under (PyPI's `gas` is another project) and install it
in a fresh virtualenv, with its dependencies from PyPI.
"""

from __future__ import annotations

import email.parser
import importlib.util
import re
import shutil
import subprocess
import sys
import textwrap
import time
import venv
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
import requests

from tests.support.fakesysfs import FakeCard, write_sysfs
from tests.support.gasproc import free_port

ROOT = Path(__file__).resolve().parents[2]
# The distribution's name; the import package and the command stay `gas`.
DISTRIBUTION = "gas-gpu-sharing"
NODE_HINT = f"pip install '{DISTRIBUTION}[node]'"
LABELER_HINT = f"pip install '{DISTRIBUTION}[labeler]'"
# `pip install 'NAME[extra,...]'` (or "..."), as gas's messages and the docs write it.
INSTALL_HINT = re.compile(r"""pip install ['"]([^'"\[\s]+)\[([\w,]+)\]""")

SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: /etc/kubernetes/scheduler.conf}
extenders:
  - urlPrefix: https://gas-extender.gas-system.svc:9001/scheduler
    filterVerb: filter
    prioritizeVerb: prioritize
    preemptVerb: preempt
    bindVerb: bind
    weight: 1
    enableHTTPS: true
    nodeCacheCapable: true
    ignorable: false
    tlsConfig:
      caFile: /etc/gas/ca.crt
      certFile: /etc/gas/client.crt
      keyFile: /etc/gas/client.key
    managedResources:
      - {name: gpu.intel.com/i915, ignoredByScheduler: false}
      - {name: gpu.intel.com/xe, ignoredByScheduler: false}
"""

# Imports of the extras' packages fail in the child, as they do where they are not installed.
WITHOUT_EXTRAS = textwrap.dedent(
    """
    import sys

    class WithoutExtras:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("grpc", "pyudev") or name.startswith("google.protobuf"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, WithoutExtras())
    """
)


def _python_without_extras(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_the_command_line_is_built_without_the_extras() -> None:
    done = _python_without_extras(
        """
        from gas.cli import COMMANDS, main

        for name in ["serve", *COMMANDS]:
            try:
                main([name, "--help"])
            except SystemExit as exc:
                assert exc.code == 0, (name, exc.code)
        assert not {m for m in sys.modules if m.split(".")[0] in ("grpc", "pyudev")}
        sys.exit(main(["node", "--node-name", "n1"]))
        """
    )
    assert done.returncode == 2, done.stderr
    assert NODE_HINT in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gas's wheel, built from the tree as pip builds it for a user."""
    work = tmp_path_factory.mktemp("wheel")
    wheels = work / "wheels"
    # Built from a copy of what the package is made of: setuptools writes build/ and
    # gas_gpu_sharing.egg-info beside setup.py, which must not race with anyone else's build here.
    source = work / "source"
    source.mkdir()
    shutil.copy(ROOT / "setup.py", source)
    shutil.copytree(ROOT / "gas", source / "gas", ignore=shutil.ignore_patterns("__pycache__"))
    # This virtualenv's setuptools when it has one; else pip fetches one to build with.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation]
    _check([*build, "--wheel-dir", str(wheels), str(source)])
    (built,) = wheels.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with gas's wheel installed, no extras; its bin directory."""
    env_dir = tmp_path_factory.mktemp("install") / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    # Dependencies from the index, through pip's own cache (a second run downloads nothing).
    # Not compiled at install: byte-compiling every dependency took half the install's time,
    # and the commands compile what they import.
    _check(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-compile",
            str(wheel),
        ],
        timeout=540,
    )
    return bin_dir


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.HeaderParser().parsestr(archive.read(name).decode())


def _install_hints() -> list[tuple[str, str, str]]:
    """Every `pip install 'NAME[extras]'` in gas's code and docs: (file, NAME, extras)."""
    files = [*sorted((ROOT / "gas").rglob("*.py")), ROOT / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    return [
        (str(path.relative_to(ROOT)), name, extras)
        for path in files
        for name, extras in INSTALL_HINT.findall(path.read_text())
    ]


def test_the_wheel_is_gas_gpu_sharing_and_every_install_hint_names_it(wheel: Path) -> None:
    metadata = _metadata(wheel)
    assert metadata["Name"] == DISTRIBUTION
    assert wheel.name.startswith(f"{DISTRIBUTION.replace('-', '_')}-")
    extras = set(metadata.get_all("Provides-Extra") or [])
    hints = _install_hints()
    # The hints of the agents (`gas node` and `gas dra` share one) and of udev discovery,
    # and the docs' at least.
    assert {h[0] for h in hints if h[0].startswith("gas/")} >= {
        "gas/host/flags.py",
        "gas/host/discovery.py",
    }, hints
    # `.` is a clone's own directory (the Dockerfile's, a developer's); any other name is
    # what pip fetches from PyPI, so it must be this distribution's, with its extras.
    named = [(where, name) for where, name, _ in hints if name not in (".", metadata["Name"])]
    assert named == []
    unknown = [(where, e) for where, _, es in hints for e in es.split(",") if e not in extras]
    assert unknown == []


def _check(command: Sequence[str], timeout: float = 120) -> None:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"


def _gas(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir.parent)}
    return subprocess.run(
        [str(bin_dir / "gas"), *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.timeout(600)
def test_a_wheel_installed_without_extras_runs_every_command_but_node(
    installed: Path, tmp_path: Path
) -> None:
    pip_list = subprocess.run(
        [str(installed / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    assert f"{DISTRIBUTION}==" in pip_list
    assert "grpcio" not in pip_list and "pyudev" not in pip_list and "protobuf" not in pip_list

    for args in (
        ["--help"],
        ["--version"],
        ["serve", "--help"],
        ["certs", "--help"],
        ["inspect", "--help"],
        ["check-config", "--help"],
        ["label-node", "--help"],
        ["node", "--help"],
    ):
        done = _gas(installed, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr

    done = _gas(installed, "certs", "--out", str(tmp_path / "certs"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "certs" / "tls.crt").is_file()

    config = tmp_path / "scheduler-config.yaml"
    config.write_text(SCHEDULER_CONFIG)
    done = _gas(installed, "check-config", str(config))
    assert (done.returncode, done.stdout) == (0, "OK\n"), done.stdout + done.stderr

    # label-node reads a sysfs tree without pyudev; through udev it names the extra.
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1)])
    done = _gas(installed, "label-node", "--node", "n1", "--dry-run", "--sysfs-root", str(sysfs))
    assert done.returncode == 0, done.stderr
    assert '"gpu.intel.com/cards": "card0.card1"' in done.stdout
    done = _gas(installed, "label-node", "--node", "n1", "--dry-run")
    assert done.returncode != 0
    assert LABELER_HINT in done.stderr and "Traceback" not in done.stderr

    done = _gas(installed, "node", "--node-name", "n1")
    assert done.returncode == 2
    assert NODE_HINT in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(600)
def test_a_wheel_installed_without_extras_serves_the_demo(installed: Path) -> None:
    port = free_port()
    env = {"PATH": f"{installed}:/usr/bin:/bin", "HOME": str(installed.parent)}
    server = subprocess.Popen(
        [str(installed / "gas"), "serve", "--demo", "--unsafe", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[0]
            try:
                ready = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                if ready.status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "gas serve --demo never became ready"
            time.sleep(0.2)
        reply = requests.post(
            f"http://127.0.0.1:{port}/scheduler/filter",
            json={
                "Pod": {
                    "metadata": {"name": "p", "namespace": "default", "uid": "u"},
                    "spec": {
                        "containers": [
                            {"name": "c", "resources": {"limits": {"gpu.intel.com/i915": "1"}}}
                        ]
                    },
                },
                "NodeNames": ["demo-1card", "demo-cpu-only"],
            },
            timeout=10,
        ).json()
        assert reply["NodeNames"] == ["demo-1card"]
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0].decode()
    assert "Traceback" not in output, output
