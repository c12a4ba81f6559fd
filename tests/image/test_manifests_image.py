"""deploy/'s manifests and the image they run agree: who runs the process, what it is, the
ports it listens on and is probed on, and the paths it reads and writes on a read-only root
filesystem. Every folder of deploy/ is read, whatever its layout."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.image.conftest import Engine

pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IMAGE_USER = 10001
# Where each command listens by default (gas/cli.py, gas/node/command.py,
# gas/serving/webhook.py), and the flags that move or add a listener.
DEFAULT_PORTS = {"serve": 9001, "webhook": 9443, "node": 9102, "dra": 9103}
PORT_FLAGS = {
    "serve": ("--port", "--healthPort"),
    "webhook": ("--port",),
    "node": ("--metrics-port",),
    "dra": ("--metrics-port",),
}
# The node side runs as root: the kubelet's folders are root's.
ROOT_COMMANDS = {"node", "dra"}
# Commands served by gunicorn, whose workers keep heartbeat files in /tmp.
GUNICORN = {"serve", "webhook"}


@dataclass(frozen=True)
class GasContainer:
    where: str
    pod: dict[str, Any]
    container: dict[str, Any]

    @property
    def args(self) -> list[str]:
        return [str(a) for a in self.container.get("args") or []]

    @property
    def command(self) -> str:
        return self.args[0]

    def flag(self, name: str) -> str | None:
        for arg in self.args:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        for arg, value in zip(self.args, self.args[1:], strict=False):
            if arg == name:
                return value
        return None

    def security(self, key: str) -> Any:
        own = self.container.get("securityContext") or {}
        if key in own:
            return own[key]
        return (self.pod.get("securityContext") or {}).get(key)

    def ports(self) -> dict[str, int]:
        """Named container ports (unnamed under their number)."""
        return {
            str(p.get("name", p["containerPort"])): int(p["containerPort"])
            for p in self.container.get("ports") or []
        }

    def listens(self) -> dict[int, str]:
        """The ports the command opens, each with the scheme it speaks."""
        found: dict[int, str] = {}
        for flag in PORT_FLAGS.get(self.command, ()):
            value = self.flag(flag)
            if value is not None:
                port = int(value)
            else:
                port = 0 if flag == "--healthPort" else DEFAULT_PORTS[self.command]
            if port:
                secure = flag == "--port" and "--unsafe" not in self.args
                found[port] = "HTTPS" if secure else "HTTP"
        return found

    def mounts(self) -> dict[str, dict[str, Any]]:
        """Mount path -> the pod's volume mounted there."""
        volumes = {v["name"]: v for v in self.pod.get("volumes") or []}
        return {
            m["mountPath"]: volumes[m["name"]] for m in self.container.get("volumeMounts") or []
        }


def _pod_specs(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield where, node
        for value in node.values():
            yield from _pod_specs(value, where)
    elif isinstance(node, list):
        for item in node:
            yield from _pod_specs(item, where)


def gas_containers() -> list[GasContainer]:
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or path.name == "kustomization.yaml":
                continue
            metadata = doc.get("metadata") or {}
            name = f"{path.relative_to(ROOT)} {doc.get('kind')}/{metadata.get('name')}"
            for where, pod in _pod_specs(doc.get("spec"), name):
                for container in pod["containers"]:
                    if re.fullmatch(r"(.*/)?gas(:[^/]*)?(@.*)?", container.get("image", "")):
                        found.append(GasContainer(f"{where} {container['name']}", pod, container))
    return found


CONTAINERS = gas_containers()


@pytest.fixture(scope="module")
def config(engine: Engine, image: str) -> dict[str, Any]:
    inspected = json.loads(engine("image", "inspect", image).stdout)
    config: dict[str, Any] = inspected[0]["Config"]
    return config


def test_deploy_runs_gas_in_several_containers() -> None:
    commands = {c.command for c in CONTAINERS}
    assert {"serve", "node", "dra"} <= commands, [c.where for c in CONTAINERS]


def test_the_image_runs_gas_as_its_own_user(config: dict[str, Any]) -> None:
    assert config["Entrypoint"] == ["gas"]
    assert config["Cmd"] == ["serve"]
    assert config["User"] == f"{IMAGE_USER}:{IMAGE_USER}"
    assert "9001/tcp" in config["ExposedPorts"]
    path = next(e.split("=", 1)[1] for e in config["Env"] if e.startswith("PATH="))
    assert path.split(":")[0] == "/opt/gas/bin"


@pytest.mark.parametrize("gas", CONTAINERS, ids=lambda c: c.where)
def test_manifest_and_image_agree(gas: GasContainer, config: dict[str, Any]) -> None:
    # The image's entry point runs the container's args: no command of its own.
    assert gas.container.get("command") in (None, ["gas"]), gas.where
    # Who: the node side as root (the kubelet's folders are root's), the rest as the
    # image's user, which runAsNonRoot can check only because the image names it by number.
    uid = gas.security("runAsUser")
    if uid is None:
        uid = int(config["User"].split(":")[0])
    assert uid == (0 if gas.command in ROOT_COMMANDS else IMAGE_USER), gas.where
    if gas.security("runAsNonRoot"):
        assert uid != 0
    # Locked down as tests/image/test_image.py runs it.
    assert gas.security("readOnlyRootFilesystem") is True, gas.where
    assert gas.security("allowPrivilegeEscalation") is False, gas.where
    assert (gas.security("capabilities") or {}).get("drop") == ["ALL"], gas.where
    mounts = gas.mounts()
    # gunicorn writes its workers' heartbeat files in /tmp: an emptyDir, the root being
    # read-only.
    if gas.command in GUNICORN:
        assert "emptyDir" in mounts.get("/tmp", {}), f"{gas.where}: no emptyDir at /tmp"
    # Nothing mounted over gas itself.
    for path in mounts:
        assert not "/opt/gas/bin/gas".startswith(path.rstrip("/") + "/"), (gas.where, path)
    # Every file named in the args is in a mounted volume (or is one: --proc-root).
    for arg in gas.args:
        value = arg.split("=", 1)[-1]
        if value.startswith("/"):
            inside = [m for m in mounts if (value + "/").startswith(m.rstrip("/") + "/")]
            assert inside, (gas.where, arg)
    # Ports: each declared port is one the command listens on; each probe reaches one of
    # them, in the scheme it speaks.
    listens = gas.listens()
    ports = gas.ports()
    for name, number in ports.items():
        assert number in listens, f"{gas.where}: port {name} ({number}) is not listened on"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = (gas.container.get(probe) or {}).get("httpGet")
        if get is None:
            continue
        port = get["port"]
        number = ports[port] if isinstance(port, str) else int(port)
        assert listens.get(number) == get.get("scheme", "HTTP"), (gas.where, probe, get)


def test_each_command_the_manifests_run_starts_in_the_image_as_they_run_it(
    engine: Engine, image: str
) -> None:
    """`gas <command> --help` for each command and user of the manifests, on a read-only
    root with no capabilities: the command exists in the image and its Python imports."""
    for gas in {(c.command, c.security("runAsUser")): c for c in CONTAINERS}.values():
        uid = gas.security("runAsUser")
        uid = IMAGE_USER if uid is None else uid
        options = (
            f"--user={uid}:{uid}",
            "--read-only",
            "--tmpfs=/tmp",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--network=none",
        )
        result = engine.run(image, [gas.command, "--help"], options, check=False)
        assert result.returncode == 0, f"{gas.where}: {result.stderr}"
        assert f"gas {gas.command}" in result.stdout
