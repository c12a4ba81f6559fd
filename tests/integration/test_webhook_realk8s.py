"""`gas webhook` registered with a real kube-apiserver (v1.28, `../shared/k8s`), so that
`matchConditions`, `namespaceSelector`, `failurePolicy` and the JSON patch are applied as a
cluster applies them. The configuration is `webhook_configuration(...)` itself, pointed at
the webhook on loopback."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gas.tools.webhook_config import WEBHOOK_NAME, webhook_configuration
from tests.support import realk8s
from tests.support.admission import I915, MEM, container, gpu_pod
from tests.support.gasproc import TLSFiles, free_port, make_tls_files
from tests.support.webhookproc import WebhookProcess

pytestmark = [
    pytest.mark.timeout(110),
]

APPS = "apps"
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
# The API server hands admission the quantity in its canonical form: 1.5 is 1500m.
REASON = "gpu: container 'app' gpu.intel.com/memory.max: quantity '1500m' is not a whole number"


@dataclass
class Cluster:
    plane: realk8s.ControlPlane
    webhook: WebhookProcess
    tls: TLSFiles
    port: int
    workdir: Path


def pod(name: str, namespace: str = APPS, **kwargs: Any) -> dict[str, Any]:
    """A pod as a user writes it: no schedulerName, the API server defaults it."""
    kwargs.setdefault("scheduler", None)
    made = gpu_pod(name, **kwargs)
    made["metadata"] = {
        k: v for k, v in made["metadata"].items() if k in ("name", "annotations")
    } | {"namespace": namespace}
    return made


def create(
    cluster: Cluster, body: dict[str, Any], dry_run: bool = False
) -> tuple[int, dict[str, Any]]:
    namespace = body["metadata"]["namespace"]
    query = "?dryRun=All" if dry_run else ""
    status, answer = cluster.plane.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods{query}", body
    )
    return status, answer


def start_webhook(workdir: Path, tls: TLSFiles, port: int, name: str) -> WebhookProcess:
    process = WebhookProcess([], workdir / f"{name}.log", tls, port=port)
    try:
        process.wait_status("/readyz", 200)
    except BaseException:
        process.stop()
        raise
    return process


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, k8s: realk8s.Release) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp(f"webhook-real-{k8s.version}")
    # A CA and the webhook's certificate for 127.0.0.1, the host of the URL registered.
    tls = make_tls_files(workdir)
    port = free_port()
    with realk8s.ControlPlane(workdir / "plane", version=k8s.version) as plane:
        cluster = Cluster(plane, start_webhook(workdir, tls, port, "webhook-0"), tls, port, workdir)
        try:
            for namespace in (APPS, "kube-system"):
                plane.prepare_namespace(namespace)
            configuration = webhook_configuration(
                Path(tls.ca).read_bytes(), url=f"https://127.0.0.1:{port}/admission/pods"
            )
            status, answer = plane.request("POST", CONFIGURATIONS, configuration)
            assert status == 201, answer
            wait_registered(cluster)
            yield cluster
        finally:
            cluster.webhook.stop()


def wait_registered(cluster: Cluster) -> None:
    """The API server reads webhook configurations through an informer: the first GPU pod
    may come before it knows; dry runs tell when it does."""
    deadline = time.monotonic() + 30
    probe = pod("probe")
    while True:
        status, answer = create(cluster, probe, dry_run=True)
        assert status == 201, answer
        if answer["spec"]["schedulerName"] == "gas-scheduler":
            return
        assert time.monotonic() < deadline, f"webhook never called:\n{cluster.webhook.log()}"
        time.sleep(0.2)


def test_a_gpu_pod_gets_gas_scheduler(cluster: Cluster) -> None:
    status, created = create(cluster, pod("trainer"))
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "gas-scheduler"
    # Nothing else changed by the webhook: the resources are the user's.
    (app,) = created["spec"]["containers"]
    assert app["resources"]["limits"] == {I915: "1", MEM: "1Gi"}
    # Edits of the pod (UPDATE) go through: the webhook is not even asked.
    status, patched = cluster.plane.request("GET", f"/api/v1/namespaces/{APPS}/pods/trainer", None)
    assert status == 200
    patched["metadata"]["labels"] = {"edited": "yes"}
    status, answer = cluster.plane.request(
        "PUT", f"/api/v1/namespaces/{APPS}/pods/trainer", patched
    )
    assert status == 200, answer
    assert answer["spec"]["schedulerName"] == "gas-scheduler"


def test_a_malformed_gpu_pod_is_refused_with_the_filters_reason(cluster: Cluster) -> None:
    bad = pod("broken", limits={I915: "1", MEM: "1.5"})
    status, answer = create(cluster, bad)
    assert status == 403, answer
    assert answer["reason"] == "Forbidden"
    assert answer["message"] == f'admission webhook "{WEBHOOK_NAME}" denied the request: {REASON}'
    # The same for a server-side dry run, and as the user sees it at kubectl apply.
    assert create(cluster, bad, dry_run=True) == (status, answer)
    done = cluster.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert done.returncode != 0
    assert f'admission webhook "{WEBHOOK_NAME}" denied the request: {REASON}' in done.stderr
    assert "refused pod apps/broken" in cluster.webhook.log()
    # A problem the API server itself would let through: refused all the same.
    init = pod("init", init=[container("setup", {I915: "1"})])
    status, answer = create(cluster, init)
    assert status == 403
    assert "init container 'setup' requests GPU resources" in answer["message"]


def test_pods_left_alone(cluster: Cluster) -> None:
    plain = pod("plain", limits={"cpu": "100m"})
    status, created = create(cluster, plain)
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "default-scheduler"
    mine = copy.deepcopy(pod("mine"))
    mine["spec"]["schedulerName"] = "my-scheduler"
    assert create(cluster, mine)[1]["spec"]["schedulerName"] == "my-scheduler"
    kept = pod("kept", annotations={"gas-keep-scheduler": "true"})
    assert create(cluster, kept)[1]["spec"]["schedulerName"] == "default-scheduler"
    # kube-system is outside the namespaceSelector: not even asked.
    system = pod("system-gpu", namespace="kube-system")
    status, created = create(cluster, system)
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert "system-gpu" not in cluster.webhook.log()


def test_with_the_webhook_down_only_gpu_pods_are_refused(cluster: Cluster) -> None:
    cluster.webhook.stop()
    try:
        status, created = create(cluster, pod("plain-while-down", limits={"cpu": "100m"}))
        assert status == 201, created
        status, answer = create(cluster, pod("gpu-while-down"))
        assert status >= 500, answer
        assert f'failed calling webhook "{WEBHOOK_NAME}"' in answer["message"]
        status, _ = cluster.plane.request(
            "GET", f"/api/v1/namespaces/{APPS}/pods/gpu-while-down", None
        )
        assert status == 404
        # kube-system still takes GPU pods.
        status, created = create(cluster, pod("system-while-down", namespace="kube-system"))
        assert status == 201, created
    finally:
        cluster.webhook = start_webhook(cluster.workdir, cluster.tls, cluster.port, "webhook-1")
    status, created = create(cluster, pod("gpu-after"))
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "gas-scheduler"


def test_validate_only_for_kubeadm_installs(cluster: Cluster) -> None:
    """The ValidatingWebhookConfiguration of `gas certs --validatingWebhook` with `gas
    webhook --validateOnly`: bad GPU pods refused, good ones left to the default scheduler."""
    plane = cluster.plane
    validating_path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    port = free_port()
    checker = WebhookProcess(
        ["--validateOnly"], cluster.workdir / "validating.log", cluster.tls, port
    )
    try:
        checker.wait_status("/readyz", 200)
        status, answer = plane.request("DELETE", f"{CONFIGURATIONS}/gas-webhook", None)
        assert status == 200, answer
        configuration = webhook_configuration(
            Path(cluster.tls.ca).read_bytes(),
            url=f"https://127.0.0.1:{port}/admission/pods",
            validate_only=True,
        )
        status, answer = plane.request("POST", validating_path, configuration)
        assert status == 201, answer
        # Not a fractional quantity: the API server's own validation, which comes before
        # validating webhooks, refuses that itself (422).
        bad = pod("bad-validated", annotations={"gas-policy": "tightest"})
        deadline = time.monotonic() + 30
        while (status := create(cluster, bad, dry_run=True)[0]) == 201:
            assert time.monotonic() < deadline, checker.log()
            time.sleep(0.2)
        status, answer = create(cluster, bad)
        assert status == 403
        assert answer["message"] == (
            f'admission webhook "{WEBHOOK_NAME}" denied the request: gpu: pod annotation '
            "gas-policy is 'tightest', not one of first-fit, binpack, spread"
        )
        status, created = create(cluster, pod("good-validated"))
        assert status == 201, created
        assert created["spec"]["schedulerName"] == "default-scheduler"
        assert "refused pod apps/bad-validated" in checker.log()
    finally:
        checker.stop()
        plane.request("DELETE", f"{validating_path}/gas-webhook", None)
        configuration = webhook_configuration(
            Path(cluster.tls.ca).read_bytes(),
            url=f"https://127.0.0.1:{cluster.port}/admission/pods",
        )
        plane.request("POST", CONFIGURATIONS, configuration)
    wait_registered(cluster)


def test_an_opt_out_that_is_not_true_is_warned_at_kubectl_apply(cluster: Cluster) -> None:
    odd = pod("odd-opt-out", annotations={"gas-keep-scheduler": "yes"})
    done = cluster.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(odd))
    assert done.stdout.strip() == "pod/odd-opt-out created"
    assert (
        "Warning: annotation gas-keep-scheduler is 'yes', not \"true\": the pod is sent to "
        "gas-scheduler"
    ) in done.stderr
    status, stored = cluster.plane.request("GET", f"/api/v1/namespaces/{APPS}/pods/odd-opt-out")
    assert status == 200 and stored["spec"]["schedulerName"] == "gas-scheduler"
