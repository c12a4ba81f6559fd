"""`gas webhook --draClaims` registered with the real kube-apiserver 1.37: an unchanged
`gpu.intel.com/memory.max` pod is stored as a pod of a DRA claim, from a
ResourceClaimTemplate the webhook made in the pod's namespace with the rights of a user
that may only get and create such templates (RBAC on, as in a cluster)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gas.core.admission import Settings, decide
from gas.core.dra_claims import POD_CLAIM
from gas.tools.webhook_config import WEBHOOK_NAME, webhook_configuration
from tests.integration.test_manifests import webhook_claim_rules
from tests.support import realk8s
from tests.support.admission import I915, MEM, container, gpu_pod
from tests.support.gasproc import make_tls_files
from tests.support.webhookproc import WebhookProcess

VERSION = "1.37"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(bool(realk8s.missing(VERSION)), reason=str(realk8s.missing(VERSION))),
]

APPS = "apps"
USER = "gas-webhook-claims"
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
TEMPLATES = f"/apis/resource.k8s.io/v1/namespaces/{APPS}/resourceclaimtemplates"
MILLI = "gpu.intel.com/millicores"
# Exactly the rules of the calls the webhook makes, as test_manifests holds them to its code.
RULES = webhook_claim_rules()


@dataclass
class Cluster:
    plane: realk8s.ControlPlane
    webhook: WebhookProcess


def pod(name: str, limits: dict[str, str], **kwargs: Any) -> dict[str, Any]:
    """A pod as a user writes it, in APPS, with no schedulerName."""
    made = gpu_pod(name, limits, scheduler=None, **kwargs)
    annotations = made["metadata"].get("annotations")
    made["metadata"] = {"name": name, "namespace": APPS}
    if annotations:
        made["metadata"]["annotations"] = annotations
    for app in made["spec"]["containers"]:
        app["command"] = ["sleep", "3600"]
    return made


def create(cluster: Cluster, body: dict[str, Any], dry_run: bool = False) -> tuple[int, Any]:
    query = "?dryRun=All" if dry_run else ""
    return cluster.plane.request("POST", f"/api/v1/namespaces/{APPS}/pods{query}", body)


def templates(cluster: Cluster) -> dict[str, dict[str, Any]]:
    status, answer = cluster.plane.request("GET", TEMPLATES)
    assert status == 200, answer
    return {item["metadata"]["name"]: item for item in answer["items"]}


def expected_template(body: dict[str, Any]) -> str:
    """The template name the pure conversion gives `body`."""
    decision = decide(body, "CREATE", Settings(dra_claims=True))
    assert decision.template is not None
    name: str = decision.template["metadata"]["name"]
    return name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("webhook-dra")
    tls = make_tls_files(workdir)
    with realk8s.ControlPlane(workdir / "plane", version=VERSION) as plane:
        plane.prepare_namespace(APPS)
        for path, body in (
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                {"metadata": {"name": USER}, "rules": RULES},
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "metadata": {"name": USER},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": USER,
                    },
                    "subjects": [
                        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}
                    ],
                },
            ),
        ):
            status, answer = plane.request("POST", path, body)
            assert status == 201, answer
        kubeconfig = plane.kubeconfig("webhook", USER)
        webhook = WebhookProcess(
            ["--draClaims", "--kubeConfig", kubeconfig, "--v", "4"],
            workdir / "webhook.log",
            tls,
        )
        try:
            webhook.wait_status("/readyz", 200)
            configuration = webhook_configuration(
                Path(tls.ca).read_bytes(),
                url=f"https://127.0.0.1:{webhook.port}/admission/pods",
                dra_claims=True,
            )
            assert configuration["webhooks"][0]["sideEffects"] == "NoneOnDryRun"
            status, answer = plane.request("POST", CONFIGURATIONS, configuration)
            assert status == 201, answer
            cluster = Cluster(plane, webhook)
            wait_registered(cluster)
            yield cluster
        finally:
            webhook.stop()


def wait_registered(cluster: Cluster) -> None:
    """The API server learns of webhook configurations through an informer; dry runs
    (which make no template) tell when it calls the webhook."""
    deadline = time.monotonic() + 30
    probe = pod("probe", {I915: "1"})
    while True:
        status, answer = create(cluster, probe, dry_run=True)
        assert status == 201, answer
        if answer["spec"].get("resourceClaims"):
            return
        assert time.monotonic() < deadline, f"webhook never called:\n{cluster.webhook.log()}"
        time.sleep(0.2)


def test_a_memory_pod_is_stored_with_a_claim_of_its_memory(cluster: Cluster) -> None:
    body = pod("trainer", {I915: "2", MEM: "6Gi", MILLI: "300", "cpu": "1"})
    status, stored = create(cluster, body)
    assert status == 201, stored
    name = expected_template(body)
    assert stored["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM, "resourceClaimTemplateName": name}
    ]
    (app,) = stored["spec"]["containers"]
    assert app["resources"]["limits"] == {"cpu": "1"}
    assert app["resources"]["requests"] == {"cpu": "1"}
    assert app["resources"]["claims"] == [
        {"name": POD_CLAIM, "request": "c0-gpu0"},
        {"name": POD_CLAIM, "request": "c0-gpu1"},
    ]
    # Left to kube-scheduler, which places claims itself.
    assert stored["spec"]["schedulerName"] == "default-scheduler"
    template = templates(cluster)[name]
    assert template["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gas-webhook"}
    devices = template["spec"]["spec"]["devices"]
    for request in devices["requests"]:
        exactly = request["exactly"]
        assert exactly["deviceClassName"] == "gpu.gas.intel.com"
        assert exactly["capacity"]["requests"] == {"memory": "3Gi", "millicores": "150"}
        assert exactly["allocationMode"] == "ExactCount"  # the API server's default
    assert devices["constraints"] == [
        {"requests": ["c0-gpu0", "c0-gpu1"], "distinctAttribute": "gpu.gas.intel.com/cardIndex"}
    ]

    # A second pod of the shape shares the template; one of another shape gets its own.
    status, again = create(cluster, pod("trainer-2", {I915: "2", MEM: "6Gi", MILLI: "300"}))
    assert status == 201, again
    assert again["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == name
    other = pod("small", {I915: "1", MEM: "1000Mi"})
    status, small = create(cluster, other)
    assert status == 201, small
    small_name = expected_template(other)
    assert small["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == small_name
    made = templates(cluster)
    assert {name, small_name} <= set(made)
    # 1000Mi asked, 1Gi claimed: the device's policy would round it up to that anyway.
    (small_request,) = made[small_name]["spec"]["spec"]["devices"]["requests"]
    assert small_request["exactly"]["capacity"]["requests"] == {"memory": "1Gi"}


def test_a_dry_run_makes_no_template(cluster: Cluster) -> None:
    body = pod("dry", {I915: "1", MEM: "5Gi"})
    status, answer = create(cluster, body, dry_run=True)
    assert status == 201, answer
    name = expected_template(body)
    assert answer["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == name
    assert name not in templates(cluster)


def test_what_cannot_map_is_refused_at_creation(cluster: Cluster) -> None:
    body = pod("numa", {I915: "1", MEM: "1Gi"}, annotations={"gas-allocate-single-numa": "1"})
    status, answer = create(cluster, body)
    assert status == 403, answer
    assert answer["message"].startswith(
        f'admission webhook "{WEBHOOK_NAME}" denied the request: gpu: pod annotation '
        "gas-allocate-single-numa cannot be carried by a DRA claim"
    )
    # The extender's own refusals stand, in its words.
    status, answer = create(cluster, pod("half", {I915: "1", MEM: "1.5"}))
    assert status == 403, answer
    assert "quantity '1500m' is not a whole number" in answer["message"]


def test_a_template_changed_by_hand_is_not_used(cluster: Cluster) -> None:
    body = pod("tampered", {I915: "1", MEM: "7Gi"})
    name = expected_template(body)
    forged = {
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "c0-gpu0", "exactly": {"deviceClassName": "gpu.gas.intel.com"}}
                    ]
                }
            }
        },
    }
    status, answer = cluster.plane.request("POST", TEMPLATES, forged)
    assert status == 201, answer
    status, answer = create(cluster, body)
    assert status == 500, answer
    assert (
        f"ResourceClaimTemplate {APPS}/{name} exists but makes another claim" in (answer["message"])
    )
    assert "not admitted" in cluster.webhook.log()


def test_pods_without_gpus_and_other_containers_are_untouched(cluster: Cluster) -> None:
    plain = pod("plain", {})
    plain["spec"]["containers"] = [container("app", {"cpu": "1"})]
    status, stored = create(cluster, plain)
    assert status == 201, stored
    assert "resourceClaims" not in stored["spec"]
    mixed = pod("mixed", {})
    mixed["spec"]["containers"] = [
        container("sidecar", {"cpu": "1"}),
        container("app", {I915: "1", MEM: "2Gi"}),
    ]
    status, stored = create(cluster, mixed)
    assert status == 201, stored
    sidecar, app = stored["spec"]["containers"]
    assert "claims" not in sidecar["resources"]
    assert app["resources"]["claims"] == [{"name": POD_CLAIM, "request": "c1-gpu0"}]
