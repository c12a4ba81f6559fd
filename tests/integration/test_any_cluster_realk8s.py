"""deploy/ against a real kube-apiserver and kube-scheduler (v1.28, `../shared/k8s`).

Both ways of installing, rendered by the real `kubectl kustomize`, are applied server side;
the real RBAC authorizer is asked what the accounts may do; and the any-cluster profile's
configuration, as deploy/ renders it, is run by the real kube-scheduler with leader
election on, under the gas-scheduler ServiceAccount's own token, beside a real
`gas serve --schedulerLease` and `gas webhook`, to bind through gas a GPU pod created with
no schedulerName.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gas.core.model import ANNOTATION_CARDS, ANNOTATION_TS
from gas.tools.webhook_config import PATH, webhook_configuration
from tests.support import realk8s
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.webhookproc import WebhookProcess

pytestmark = [
    pytest.mark.timeout(115),
]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ANY_CLUSTER = DEPLOY / "any-cluster"
KUBEADM_WEBHOOK = DEPLOY / "kubeadm-webhook"
WEBHOOK_CONFIGURATIONS = [d / "webhook-configuration.yaml" for d in (ANY_CLUSTER, KUBEADM_WEBHOOK)]
NAMESPACE = "gas-system"
SCHEDULER = "gas-scheduler"
FIELD_MANAGER = "gas-deploy-test"


def render(directory: Path, version: str) -> str:
    done = subprocess.run(
        [str(realk8s.binary("kubectl", version)), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Applied:
    plane: realk8s.ControlPlane
    # Each object written, and the API server's copy read right after its apply (the two
    # ways share the Service name gas-webhook; they are never installed together).
    stored: list[tuple[dict[str, Any], dict[str, Any]]]


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory, k8s: realk8s.Release) -> Iterator[Applied]:
    """A control plane with both ways of installing applied, as an operator applies them
    (server-side apply of `kubectl kustomize`'s output), and the webhook configurations,
    registered on their own (without caBundle here: cert-manager's way)."""
    with realk8s.ControlPlane(tmp_path_factory.mktemp("plane"), version=k8s.version) as plane:
        texts = [render(d, k8s.version) for d in (DEPLOY, KUBEADM_WEBHOOK, ANY_CLUSTER)]
        texts += [path.read_text() for path in WEBHOOK_CONFIGURATIONS]
        stored: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for text in texts:
            apply = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-"]
            plane.kubectl(*apply, input=text)
            written = _objects(text)
            read = json.loads(plane.kubectl("get", "-f", "-", "-o", "json", input=text).stdout)
            items = read["items"] if read.get("kind") == "List" else [read]
            assert len(items) == len(written)
            stored += list(zip(written, items, strict=True))
        yield Applied(plane, stored)


@pytest.fixture
def plane(applied: Applied) -> realk8s.ControlPlane:
    return applied.plane


def _objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_both_ways_apply_server_side_and_are_stored_as_written(applied: Applied) -> None:
    assert {d["kind"] for d, _ in applied.stored} >= {
        "Deployment",
        "DaemonSet",
        "ConfigMap",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for written, stored in applied.stored:
        # Every field written survived the API server's validation and defaulting
        # unchanged (a field it dropped would be a field the manifest misspelt).
        what = f"{written['kind']} {written['metadata']['name']}"
        assert (stored["kind"], stored["metadata"]["name"]) == (
            written["kind"],
            written["metadata"]["name"],
        )
        assert _subset(_comparable(written), stored), what


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """A manifest as the API server stores it: ports and numbers normalised by YAML alone
    stay equal, so compare as JSON values."""
    loaded: dict[str, Any] = json.loads(json.dumps(doc))
    return loaded


def _subset(written: Any, stored: Any) -> bool:
    if isinstance(written, dict):
        return isinstance(stored, dict) and all(
            key in stored and _subset(value, stored[key]) for key, value in written.items()
        )
    if isinstance(written, list):
        return (
            isinstance(stored, list)
            and len(written) == len(stored)
            and all(_subset(w, s) for w, s in zip(written, stored, strict=True))
        )
    return bool(written == stored)


def can(plane: realk8s.ControlPlane, account: str, *request: str) -> bool:
    """The real authorizer's answer for a ServiceAccount of gas's namespace."""
    done = plane.kubectl(
        "auth", "can-i", f"--as=system:serviceaccount:{NAMESPACE}:{account}", *request, check=False
    )
    answer = done.stdout.strip()
    assert answer in ("yes", "no"), done.stderr
    return answer == "yes"


# What kube-scheduler and gas need, as the scheduler's account.
SCHEDULER_NEEDS = [
    # gas: the ledger's list+watch, bind with the annotations, Events, deschedule labels.
    ("list", "nodes"),
    ("watch", "nodes"),
    ("watch", "pods", "--all-namespaces"),
    ("create", "pods", "--subresource=binding", "-n", "team-a"),
    ("patch", "pods", "-n", "team-a"),
    ("create", "events", "-n", "team-a"),
    ("create", "events.events.k8s.io", "-n", "team-a"),
    # The Lease: kube-scheduler renews it, gas reads it.
    ("get", "leases/gas-scheduler", "-n", NAMESPACE),
    ("update", "leases/gas-scheduler", "-n", NAMESPACE),
    ("create", "leases", "-n", NAMESPACE),
    # kube-scheduler's own: preemption, status, its plugins' informers, volume binding.
    ("delete", "pods", "-n", "team-a"),
    ("patch", "pods", "--subresource=status", "-n", "team-a"),
    ("list", "poddisruptionbudgets.policy", "--all-namespaces"),
    ("list", "csinodes.storage.k8s.io"),
    ("list", "storageclasses.storage.k8s.io"),
    ("update", "persistentvolumeclaims", "-n", "team-a"),
    ("list", "persistentvolumes"),
    # Its HTTPS port's delegated authentication and authorisation.
    ("get", "configmaps/extension-apiserver-authentication", "-n", "kube-system"),
    ("create", "tokenreviews.authentication.k8s.io"),
    ("create", "subjectaccessreviews.authorization.k8s.io"),
]
SCHEDULER_REFUSED = [
    ("list", "secrets", "--all-namespaces"),
    ("get", "secrets/gas-tls", "-n", NAMESPACE),
    ("get", "configmaps/kubeadm-config", "-n", "kube-system"),
    ("update", "leases/gas-extender", "-n", NAMESPACE),
    ("get", "leases/gas-scheduler", "-n", "kube-system"),
    ("patch", "nodes"),
    ("delete", "nodes"),
    ("create", "pods", "-n", "team-a"),
    ("update", "pods", "-n", "team-a"),
    ("update", "deployments.apps", "-n", NAMESPACE),
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
]


def test_the_real_authorizer_allows_the_scheduler_what_it_needs_and_no_more(
    plane: realk8s.ControlPlane,
) -> None:
    refused_needs = [r for r in SCHEDULER_NEEDS if not can(plane, SCHEDULER, *r)]
    assert refused_needs == []
    allowed_extras = [r for r in SCHEDULER_REFUSED if can(plane, SCHEDULER, *r)]
    assert allowed_extras == []
    # What Kubernetes' documented binding to system:kube-scheduler brings along: the
    # default scheduler's Lease. The profile names its own, and `gas check-config` refuses
    # a configuration that would take kube-system/kube-scheduler.
    assert can(plane, SCHEDULER, "update", "leases/kube-scheduler", "-n", "kube-system")


def test_the_real_authorizer_keeps_the_kubeadm_account_to_its_own_lease(
    plane: realk8s.ControlPlane,
) -> None:
    assert can(plane, "gas", "create", "pods", "--subresource=binding", "-n", "team-a")
    assert can(plane, "gas", "update", "leases/gas-extender", "-n", NAMESPACE)
    assert not can(plane, "gas", "update", "leases/gas-scheduler", "-n", NAMESPACE)
    assert not can(plane, "gas", "delete", "pods", "-n", "team-a")
    assert not can(plane, "gas", "list", "secrets", "--all-namespaces")
    assert not can(plane, "gas-node", "create", "pods", "--subresource=binding", "-n", "team-a")
    # The validation-only webhook's account: nothing at all.
    for request in (("get", "pods", "-n", "team-a"), ("list", "nodes"), ("create", "events")):
        assert not can(plane, "gas-webhook", *request)


def test_the_real_authorizer_gives_the_node_agent_its_node_and_nothing_more(
    plane: realk8s.ControlPlane,
) -> None:
    """What test_least_privilege finds `gas node` needs and is refused on the API-server
    double's RBAC, asked of the real authorizer with the manifests' own roles."""
    needs = [
        ("get", "nodes/n1"),
        ("patch", "nodes/n1"),
        ("patch", "nodes/n1", "--subresource=status"),
        ("get", "pods", "-n", "default"),
    ]
    assert [r for r in needs if not can(plane, "gas-node", *r)] == []
    refused = [
        ("list", "nodes"),
        ("update", "nodes/n1"),
        ("delete", "pods", "-n", "default"),
        ("patch", "pods", "--subresource=status", "-n", "default"),
        ("create", "pods", "--subresource=binding", "-n", "default"),
    ]
    assert [r for r in refused if can(plane, "gas-node", *r)] == []


# ------------------------------------------------------------------ the profile, end to end


def token_kubeconfig(plane: realk8s.ControlPlane, account: str, path: Path) -> str:
    """A kubeconfig holding a token of the ServiceAccount (TokenRequest), as the pod's
    in-cluster configuration would."""
    token = plane.kubectl(
        "create", "token", account, "-n", NAMESPACE, "--duration=1h"
    ).stdout.strip()
    ca = base64.b64encode(Path(plane.ca_file).read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "real", "cluster": {"server": plane.url, "certificate-authority-data": ca}}
        ],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": account}}],
        "current-context": "real",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


def gas_certs(directory: Path) -> TLSFiles:
    """The files `gas certs` writes, as an operator makes them."""
    done = subprocess.run(
        [sys.executable, "-m", "gas.cli", "certs", "--out", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return TLSFiles.named_as_gas_certs(directory)


def profile_configuration(
    version: str, kubeconfig: str, tls: TLSFiles, gas_port: int
) -> dict[str, Any]:
    """The profile's configuration as the rendered ConfigMap holds it, with what differs
    outside a pod: the kubeconfig (a pod has its in-cluster one), the files of the mounted
    Secret, and gas's port (a free one here)."""
    (config_map,) = [
        d
        for d in _objects(render(ANY_CLUSTER, version))
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gas-scheduler-config"
    ]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    config["clientConnection"]["kubeconfig"] = kubeconfig
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://127.0.0.1:9001/scheduler"
    extender["urlPrefix"] = f"https://127.0.0.1:{gas_port}/scheduler"
    extender["tlsConfig"].update(caFile=tls.ca, certFile=tls.client_cert, keyFile=tls.client_key)
    return config


def _namespace(plane: realk8s.ControlPlane, name: str) -> None:
    plane.kubectl("create", "namespace", name)
    # No controller-manager makes the namespace's default ServiceAccount, which admission
    # gives every pod.
    plane.kubectl("create", "serviceaccount", "default", "-n", name)


def _gpu_node(core: client.CoreV1Api, name: str) -> None:
    realk8s.add_schedulable_node(core, gpu_node(name, "0.1", i915="2", memory_max="16Gi"))


def _pod(name: str, scheduler: str | None) -> dict[str, Any]:
    pod = gpu_pod(name, container(i915="1", memory_max="2Gi"), namespace="team-a")
    del pod["status"]
    if scheduler is None:
        del pod["spec"]["schedulerName"]
    else:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def _healthz(port: int) -> tuple[int, str]:
    """kube-scheduler's /healthz over HTTPS with no client certificate, as kubelet probes."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context) as r:
        return r.status, r.read().decode()


def test_the_real_scheduler_runs_the_profile_and_binds_gpu_pods_through_gas(
    plane: realk8s.ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The webhook configurations applied call Services that have no pods here: the
    # webhook runs on loopback instead, registered as the one deploy/ ships, pointed at it.
    plane.kubectl(
        "delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "gas-webhook"
    )
    core = client.CoreV1Api(plane.client())
    _namespace(plane, "team-a")
    _gpu_node(core, "gpu-1")

    tls = gas_certs(tmp_path / "certs")
    kubeconfig = token_kubeconfig(plane, SCHEDULER, tmp_path / "gas-scheduler.kubeconfig")
    # In the pod, POD_NAME is the pod's name and its hostname, which starts
    # kube-scheduler's identity; here both run on this machine.
    monkeypatch.setenv("POD_NAME", socket.gethostname())
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    with contextlib.ExitStack() as stack:
        gas = GasProcess(
            ["--kubeConfig", kubeconfig, "--schedulerLease", SCHEDULER, "--v", "4"],
            tmp_path / "gas.log",
            tls,
        )
        stack.callback(gas.stop)
        # gas's certificate from `gas certs` carries 127.0.0.1, where the API server calls.
        webhook = WebhookProcess([], tmp_path / "webhook.log", tls)
        stack.callback(webhook.stop)
        _profile_binds_through_gas(plane, core, tls, kubeconfig, gas, webhook)


def _profile_binds_through_gas(
    plane: realk8s.ControlPlane,
    core: client.CoreV1Api,
    tls: TLSFiles,
    kubeconfig: str,
    gas: GasProcess,
    webhook: WebhookProcess,
) -> None:
    webhook.wait_ready()
    url = f"https://127.0.0.1:{webhook.port}{PATH}"
    registered = webhook_configuration(Path(tls.ca).read_bytes(), url=url)
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(registered))
    gas.wait_ready()
    # Ready, synced, but no scheduler leads yet: the verbs are refused.
    refused = gas.post("/scheduler/filter", {"Pod": _pod("early", SCHEDULER), "NodeNames": []})
    assert refused.status_code == 503, refused.text

    health = realk8s.free_port()
    config = profile_configuration(plane.version, kubeconfig, tls, gas.port)
    # In a pod, its HTTPS port's delegated authentication and authorisation use the
    # in-cluster configuration; here the same account's kubeconfig, named.
    delegation = [f"--authentication-kubeconfig={kubeconfig}"]
    delegation += [f"--authorization-kubeconfig={kubeconfig}"]
    scheduler = plane.start_scheduler(
        yaml.safe_dump(config),
        name=SCHEDULER,
        args=[f"--secure-port={health}", *delegation],
    )
    try:
        _gpu_pod_bound_by_gas(plane, core, gas, scheduler, health)
    finally:
        # SIGTERM: it gives the Lease up, for the next test's schedulers.
        scheduler.stop()


def _gpu_pod_bound_by_gas(
    plane: realk8s.ControlPlane,
    core: client.CoreV1Api,
    gas: GasProcess,
    scheduler: realk8s.Process,
    health: int,
) -> None:
    # As a user writes them: no schedulerName. The webhook sends the GPU pod to
    # gas-scheduler and leaves the plain one to the default scheduler.
    gpu_body: Any = _pod("gpu", None)
    plain_body: Any = gpu_pod("plain", container(), namespace="team-a")
    del plain_body["status"], plain_body["spec"]["schedulerName"]
    created = core.create_namespaced_pod("team-a", gpu_body).to_dict()
    assert created["spec"]["scheduler_name"] == SCHEDULER
    core.create_namespaced_pod("team-a", plain_body)

    def bound() -> dict[str, Any] | None:
        pod = core.read_namespaced_pod("gpu", "team-a").to_dict()
        return pod if pod["spec"]["node_name"] else None

    try:
        pod = wait_for(bound, timeout=60, what="the GPU pod bound")
    except TimeoutError as exc:
        raise AssertionError(
            f"not bound\nkube-scheduler:\n{scheduler.tail()}\ngas:\n{gas.log()[-4000:]}"
        ) from exc
    assert pod["spec"]["node_name"] == "gpu-1"
    annotations = pod["metadata"]["annotations"]
    assert annotations[ANNOTATION_CARDS] == "card0" and ANNOTATION_TS in annotations

    # The Lease is the scheduler's, held under this host's name: the one gas follows.
    lease = json.loads(
        plane.kubectl("get", "lease", SCHEDULER, "-n", NAMESPACE, "-o", "json").stdout
    )
    assert lease["spec"]["holderIdentity"].startswith(socket.gethostname() + "_")

    # The Event says who scheduled it.
    events = json.loads(plane.kubectl("get", "events", "-n", "team-a", "-o", "json").stdout)[
        "items"
    ]
    scheduled = [
        e for e in events if e["reason"] == "Scheduled" and e["involvedObject"]["name"] == "gpu"
    ]
    assert scheduled and scheduled[0]["reportingComponent"] == SCHEDULER

    # No default scheduler runs: the plain pod waits, untouched by gas-scheduler.
    time.sleep(2)
    plain = core.read_namespaced_pod("plain", "team-a").to_dict()
    assert plain["spec"]["scheduler_name"] == "default-scheduler"
    assert plain["spec"]["node_name"] is None

    # The probes of the Deployment: /healthz without credentials.
    assert _healthz(health) == (200, "ok")
    log = scheduler.log()
    # Its account read what it needed (the authentication reader's ConfigMap among
    # it): nothing was forbidden, nothing left unread.
    assert "forbidden" not in log.lower(), scheduler.tail()
    assert "won't work" not in log and "Unable to get configmap" not in log, scheduler.tail()
    assert "Forbidden" not in gas.log()


# ------------------------------------------------------------------ two pods, one binder


def _start_pod_scheduler(
    plane: realk8s.ControlPlane, pod: str, config: dict[str, Any]
) -> realk8s.Process:
    """kube-scheduler as in the pod `pod`: in a UTS namespace of its own whose hostname is
    the pod's name, so that its identity is `<pod>_<uuid>` as in a cluster."""
    path = plane.workdir / f"{pod}.config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [
        "unshare",
        "--uts",
        "sh",
        "-c",
        f'hostname {pod} && exec "$0" "$@"',
        str(realk8s.binary("kube-scheduler", plane.version)),
        f"--config={path}",
        "--secure-port=0",
        "--bind-address=127.0.0.1",
    ]
    return realk8s.Process(pod, command, plane.workdir / f"{pod}.log")


def _holder(plane: realk8s.ControlPlane) -> str:
    done = plane.kubectl("get", "lease", SCHEDULER, "-n", NAMESPACE, "-o", "json", check=False)
    if done.returncode != 0:
        return ""
    holder: str = json.loads(done.stdout)["spec"].get("holderIdentity") or ""
    return holder.split("_", 1)[0]


def _why_unbound(
    core: client.CoreV1Api, name: str, scheduler: realk8s.Process, gas: GasProcess
) -> str:
    """What a pod left pending shows: its scheduling condition (kube-scheduler writes why
    the last attempt failed), the scheduler's log, and gas's log without its Lease reads."""
    pod = core.read_namespaced_pod(name, "team-b").to_dict()
    conditions = json.dumps(pod["status"].get("conditions"), default=str)
    own = [line for line in gas.log().splitlines() if "/leases/" not in line]
    # The condition last: a report that keeps only the end of the output keeps it.
    return (
        f"kube-scheduler:\n{scheduler.tail(60)}\n"
        "gas, without its Lease reads:\n" + "\n".join(own[-60:]) + "\n"
        f"pod {name} conditions: {conditions}"
    )


def test_two_scheduler_pods_one_gas_binds_and_the_other_takes_over(
    plane: realk8s.ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pods' worth of kube-scheduler + gas, each scheduler calling its own gas: only
    the gas beside the leading scheduler answers; when that pod stops, the other pod's
    scheduler takes the Lease and its gas binds."""
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --uts is not permitted here (it needs root or user namespaces)")
    plane.kubectl(
        "delete",
        "mutatingwebhookconfiguration,validatingwebhookconfiguration",
        "gas-webhook",
        "--ignore-not-found",
    )
    core = client.CoreV1Api(plane.client())
    _namespace(plane, "team-b")
    _gpu_node(core, "gpu-2")
    tls = gas_certs(tmp_path / "certs")
    kubeconfig = token_kubeconfig(plane, SCHEDULER, tmp_path / "gas-scheduler.kubeconfig")
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    pods = ("gas-scheduler-a", "gas-scheduler-b")
    with contextlib.ExitStack() as stack:
        gas: dict[str, GasProcess] = {}
        schedulers: dict[str, realk8s.Process] = {}
        for pod in pods:
            monkeypatch.setenv("POD_NAME", pod)
            args = ["--kubeConfig", kubeconfig, "--schedulerLease", SCHEDULER, "--v", "4"]
            gas[pod] = GasProcess(args, tmp_path / f"gas-{pod}.log", tls)
            stack.callback(gas[pod].stop)
        for pod in pods:
            gas[pod].wait_ready()
            config = profile_configuration(plane.version, kubeconfig, tls, gas[pod].port)
            schedulers[pod] = _start_pod_scheduler(plane, pod, config)
            stack.callback(schedulers[pod].stop)
        leader = wait_for(lambda: _holder(plane) in pods and _holder(plane), what="a leader")
        (standby,) = [p for p in pods if p != leader]

        # Only the leader's gas answers; the standby's is synced but refuses.
        probe = {"Pod": _pod("probe", SCHEDULER), "NodeNames": ["gpu-2"]}
        assert gas[standby].post("/scheduler/filter", probe).status_code == 503
        assert gas[leader].post("/scheduler/filter", probe).status_code == 200

        def bound(name: str) -> dict[str, Any] | None:
            pod: dict[str, Any] = core.read_namespaced_pod(name, "team-b").to_dict()
            return pod if pod["spec"]["node_name"] else None

        first: Any = _pod("first", SCHEDULER)
        first["metadata"]["namespace"] = "team-b"
        core.create_namespaced_pod("team-b", first)
        wait_for(lambda: bound("first"), timeout=60, what="the first pod bound")
        assert "first" in gas[leader].log() and "first" not in gas[standby].log()

        # The leader's pod stops (a rollout, a drain): its scheduler gives the Lease up.
        schedulers[leader].stop()
        gas[leader].stop()
        wait_for(lambda: _holder(plane) == standby, timeout=60, what="the standby leading")
        second: Any = _pod("second", SCHEDULER)
        second["metadata"]["namespace"] = "team-b"
        core.create_namespaced_pod("team-b", second)
        try:
            pod = wait_for(lambda: bound("second"), timeout=60, what="the second pod bound")
        except TimeoutError as exc:
            raise AssertionError(
                _why_unbound(core, "second", schedulers[standby], gas[standby])
            ) from exc
        assert ANNOTATION_CARDS in pod["metadata"]["annotations"]
        assert "second" in gas[standby].log()


def test_reapplying_a_configuration_without_ca_bundle_erases_the_installed_one(
    plane: realk8s.ControlPlane, tmp_path: Path
) -> None:
    """Why the webhook configurations of deploy/ are applied on their own, not by the
    kustomizations: `kubectl apply` of the copy without caBundle, after `gas certs`' copy
    was applied, drops the caBundle, and the API server can no longer verify the webhook."""
    name = "gas-webhook-reapply"
    without = yaml.safe_load(WEBHOOK_CONFIGURATIONS[0].read_text())
    without["metadata"]["name"] = name
    tls = gas_certs(tmp_path / "certs")
    with_bundle = webhook_configuration(Path(tls.ca).read_bytes())
    with_bundle["metadata"]["name"] = name

    def bundle() -> str | None:
        stored = json.loads(
            plane.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout
        )
        value: str | None = stored["webhooks"][0]["clientConfig"].get("caBundle")
        return value

    try:
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(without))
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(with_bundle))
        assert bundle() == with_bundle["webhooks"][0]["clientConfig"]["caBundle"]
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(without))
        assert bundle() is None
    finally:
        plane.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")
