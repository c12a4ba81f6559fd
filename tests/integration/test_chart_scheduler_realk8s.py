"""The chart's default way (any cluster), installed by the real helm on a real
kube-apiserver, run as its pods would run it: the real kube-scheduler on the installed
ConfigMap's profile, `gas serve` and `gas webhook` with the installed Deployment's
arguments, all three with the certificates the chart generated (read back from its
Secrets), and the webhook registered by the installed configuration's caBundle. A GPU pod
created with no schedulerName is sent to gas-scheduler by the webhook and bound through
gas; a GPU pod gas can never place is refused at creation with gas's reason.

What differs from a pod: processes on this machine instead of containers, free ports
instead of the pod's fixed ones, the mounted files at the paths they were read back to,
the ServiceAccount's token in a kubeconfig, and the webhook reached on loopback (no DNS
or Service routing here) with gas's server certificate, which the same CA signed and
which names 127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException

from tests.integration.test_any_cluster_realk8s import (
    SCHEDULER,
    _gpu_node,
    _gpu_pod_bound_by_gas,
    _namespace,
    _pod,
    token_kubeconfig,
)
from tests.support import chart, helmtools, realk8s
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.webhookproc import WebhookProcess

pytestmark = [pytest.mark.timeout(150)]

NAMESPACE = chart.NAMESPACE


@dataclass
class Installed:
    plane: realk8s.ControlPlane
    helm: Path
    home: Path
    deployment: dict[str, Any]
    config: dict[str, Any]
    secrets: dict[str, dict[str, bytes]]


@pytest.fixture(scope="module")
def installed(
    tmp_path_factory: pytest.TempPathFactory, k8s: realk8s.Release
) -> Iterator[Installed]:
    """`helm install gas charts/gas -n gas-system --create-namespace`, the README's
    command (helm 4: what helm 3 renders is the same, test_chart.py), and what it
    installed, read back from the API server."""
    try:
        helm = helmtools.helm(4)
    except helmtools.ToolUnavailable as exc:
        pytest.skip(str(exc))
    home = tmp_path_factory.mktemp("helm")
    with realk8s.ControlPlane(tmp_path_factory.mktemp("plane"), version=k8s.version) as plane:
        install = ["install", "gas", str(chart.CHART), "-n", NAMESPACE, "--create-namespace"]
        install += ["--set", "image.repository=registry.example/gas"]
        if plane.version == "1.28":
            # These 1.28 binaries report no version (v0.0.0-master): the operator of such
            # a build names kube-scheduler's tag, as the chart's error asks.
            install += ["--set", "scheduler.image.tag=v1.28.7"]
        chart.run_helm(helm, install, chart.helm_env(home, Path(plane.admin_kubeconfig)))

        def read(kind: str, name: str) -> dict[str, Any]:
            out = plane.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json").stdout
            return dict(json.loads(out))

        secrets = {
            name: {k: base64.b64decode(v) for k, v in read("secret", name)["data"].items()}
            for name in ("gas-tls", "gas-webhook-tls")
        }
        config = yaml.safe_load(read("configmap", "gas-scheduler-config")["data"]["config.yaml"])
        deployment = read("deployment", "gas-scheduler")
        yield Installed(plane, helm, home, deployment, config, secrets)


def _container(installed: Installed, name: str) -> dict[str, Any]:
    (found,) = [
        c
        for c in installed.deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == name
    ]
    return dict(found)


def _files(installed: Installed, directory: Path) -> TLSFiles:
    """The Secret gas-tls as its volumes mount it, in `directory`."""
    directory.mkdir()
    for key, data in installed.secrets["gas-tls"].items():
        (directory / key).write_bytes(data)
        (directory / key).chmod(0o600)
    return TLSFiles.named_as_gas_certs(directory)


def _args(container: dict[str, Any], replace: dict[str, str]) -> list[str]:
    """The container's arguments after its subcommand, a flag's value swapped where the
    process outside a pod needs another (a port, a file's path)."""
    args = []
    for arg in container["args"][1:]:
        flag = arg.partition("=")[0]
        args.append(f"{flag}={replace[flag]}" if flag in replace else arg)
    return args


def test_the_installed_chart_schedules_gpu_pods_through_gas_and_refuses_what_never_fits(
    installed: Installed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane = installed.plane
    core = client.CoreV1Api(plane.client())
    _namespace(plane, "team-a")
    _gpu_node(core, "gpu-1")
    tls = _files(installed, tmp_path / "gas-tls")
    kubeconfig = token_kubeconfig(plane, SCHEDULER, tmp_path / "gas-scheduler.kubeconfig")
    monkeypatch.setenv("POD_NAME", socket.gethostname())
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)

    gas_port, health_port = realk8s.free_port(), realk8s.free_port()
    gas_args = _args(
        _container(installed, "gas"),
        {
            "--port": str(gas_port),
            "--healthPort": str(health_port),
            "--cert": tls.server_cert,
            "--key": tls.server_key,
            "--cacert": tls.ca,
        },
    )
    assert "--schedulerLease=gas-scheduler" in gas_args
    webhook_port = realk8s.free_port()
    webhook_args = _args(
        _container(installed, "webhook"),
        {"--port": str(webhook_port), "--cert": tls.server_cert, "--key": tls.server_key},
    )
    with contextlib.ExitStack() as stack:
        gas = GasProcess(
            [*gas_args, "--kubeConfig", kubeconfig], tmp_path / "gas.log", tls, port=gas_port
        )
        stack.callback(gas.stop)
        webhook = WebhookProcess(webhook_args, tmp_path / "webhook.log", tls, port=webhook_port)
        stack.callback(webhook.stop)
        webhook.wait_ready()

        # The installed configuration, its Service swapped for the loopback address: its
        # caBundle, the chart's CA, is what the API server checks the webhook by.
        configuration = json.loads(
            plane.kubectl("get", "mutatingwebhookconfiguration", "gas-webhook", "-o", "json").stdout
        )
        (hook,) = configuration["webhooks"]
        assert (
            base64.b64decode(hook["clientConfig"]["caBundle"])
            == installed.secrets["gas-tls"]["ca.crt"]
        )
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{webhook_port}{path}",
            "caBundle": hook["clientConfig"]["caBundle"],
        }
        plane.kubectl("replace", "-f", "-", input=json.dumps(configuration))
        gas.wait_ready()

        # kube-scheduler on the installed profile: gas at its free port, the Secret's files.
        config = installed.config
        config["clientConnection"]["kubeconfig"] = kubeconfig
        (extender,) = config["extenders"]
        assert extender["urlPrefix"] == "https://127.0.0.1:9001/scheduler"
        extender["urlPrefix"] = f"https://127.0.0.1:{gas_port}/scheduler"
        extender["tlsConfig"].update(
            caFile=tls.ca, certFile=tls.client_cert, keyFile=tls.client_key
        )
        secure = realk8s.free_port()
        scheduler = plane.start_scheduler(
            yaml.safe_dump(config),
            name=SCHEDULER,
            args=[
                f"--secure-port={secure}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
            ],
        )
        stack.callback(scheduler.stop)

        # The same checks as deploy/'s profile: a GPU pod with no schedulerName sent to
        # gas-scheduler and bound by gas, its Lease, its Event, the plain pod left alone.
        _gpu_pod_bound_by_gas(plane, core, gas, scheduler, secure)

        # A pod gas can never place (an init container asking for a GPU): refused at
        # creation, with gas's reason.
        never: Any = _pod("never", None)
        setup = {"name": "setup", "image": "busybox"}
        never["spec"]["initContainers"] = [
            {**setup, "resources": {"limits": {"gpu.intel.com/i915": "1"}}}
        ]
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod("team-a", never)
        assert refused.value.status == 403, refused.value.body
        message = json.loads(str(refused.value.body))["message"]
        assert message.startswith('admission webhook "gpu-pods.gas.intel.com" denied'), message
        assert "init container 'setup' requests GPU resources" in message, message
        assert "Forbidden" not in gas.log()


def test_a_second_release_is_refused_before_it_changes_anything(installed: Installed) -> None:
    """Two gas would keep separate books of the same cards: the chart's cluster-wide
    objects have fixed names, so helm refuses a second release that would take them over."""
    plane = installed.plane
    before = plane.kubectl("get", "clusterrole", "gas", "-o", "json").stdout
    env = chart.helm_env(installed.home, Path(plane.admin_kubeconfig))
    install = ["install", "gas-again", str(chart.CHART), "-n", "gpu", "--create-namespace"]
    install += ["--set", "scheduler.image.tag=v1.28.7"]
    with pytest.raises(chart.HelmError, match=r'ClusterRole "gas".*cannot be imported'):
        chart.run_helm(installed.helm, install, env)
    assert plane.kubectl("get", "clusterrole", "gas", "-o", "json").stdout == before
    assert plane.kubectl("get", "deployments", "-n", "gpu", "-o", "name").stdout == ""
