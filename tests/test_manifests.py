"""The shipped scheduler configuration and manifests agree with the code and with the
rules kube-scheduler and the API server apply to them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

from gas.demo import DemoCluster, load_demo_file
from gas.extender import create_app
from gas.ledger import Ledger

ROOT = Path(__file__).resolve().parent.parent
# Fields of an extender entry in kubescheduler.config.k8s.io/v1 (strictly decoded).
V1_EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "bindVerb",
    "weight",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
TLS_FIELDS = {
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
}
DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$")


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def scheduler_config() -> dict[str, Any]:
    (config,) = load_all(ROOT / "extender-configuration" / "scheduler-config.yaml")
    return config


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in load_all(ROOT / "deploy" / "gas.yaml")}


def test_scheduler_config_is_valid_v1(scheduler_config: dict[str, Any]) -> None:
    assert scheduler_config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert scheduler_config["kind"] == "KubeSchedulerConfiguration"
    assert scheduler_config["clientConnection"]["kubeconfig"]
    (extender,) = scheduler_config["extenders"]
    assert set(extender) <= V1_EXTENDER_FIELDS
    assert set(extender["tlsConfig"]) <= TLS_FIELDS
    assert DURATION.match(extender["httpTimeout"])
    assert urlparse(extender["urlPrefix"]).scheme == "https"
    assert not (extender["tlsConfig"].get("insecure") and extender["tlsConfig"].get("caFile"))
    assert extender["nodeCacheCapable"] is True
    assert {r["name"] for r in extender["managedResources"]} == {
        "gpu.intel.com/i915",
        "gpu.intel.com/xe",
    }
    assert "prioritizeVerb" not in extender or extender.get("weight", 0) > 0


def test_scheduler_config_verbs_are_routes_gas_serves(scheduler_config: dict[str, Any]) -> None:
    ledger = Ledger()
    app = create_app(ledger, DemoCluster(ledger, load_demo_file(None)))
    routes = {rule.rule: rule.methods or set() for rule in app.url_map.iter_rules()}
    (extender,) = scheduler_config["extenders"]
    for verb in ("filterVerb", "bindVerb"):
        path = urlparse(extender["urlPrefix"].rstrip("/") + "/" + extender[verb]).path
        assert "POST" in routes[path], path


def test_scheduler_config_points_at_the_service(
    scheduler_config: dict[str, Any], manifests: dict[str, dict[str, Any]]
) -> None:
    (extender,) = scheduler_config["extenders"]
    url = urlparse(extender["urlPrefix"])
    service = manifests["Service"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.hostname == host == extender["tlsConfig"]["serverName"]
    assert url.port == service["spec"]["ports"][0]["port"] == 9001


@pytest.mark.parametrize(
    ("kind", "model"),
    [
        ("Namespace", client.V1Namespace),
        ("ServiceAccount", client.V1ServiceAccount),
        ("ClusterRole", client.V1ClusterRole),
        ("ClusterRoleBinding", client.V1ClusterRoleBinding),
        ("Deployment", client.V1Deployment),
        ("Service", client.V1Service),
    ],
)
def test_manifests_match_the_api_schema(
    manifests: dict[str, dict[str, Any]], kind: str, model: Any
) -> None:
    document = manifests[kind]
    parsed = model.from_dict(document)
    # Nothing dropped: every field of the document is one the schema knows.
    assert client.ApiClient().sanitize_for_serialization(parsed) == document


def test_deployment_runs_one_hardened_replica(manifests: dict[str, dict[str, Any]]) -> None:
    spec = manifests["Deployment"]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    (gas,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert gas["securityContext"]["readOnlyRootFilesystem"] is True
    assert gas["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gas["livenessProbe"]["httpGet"]["path"] == "/healthz"


# Each Kubernetes call gas makes, and the RBAC rule it needs.
CALL_RULES = {
    "list_node": ("", "nodes", {"list", "watch"}),
    "list_pod_for_all_namespaces": ("", "pods", {"list", "watch"}),
    "read_namespaced_pod": ("", "pods", {"get"}),
    "create_namespaced_pod_binding": ("", "pods/binding", {"create"}),
}


def test_rbac_grants_exactly_what_the_code_calls(manifests: dict[str, dict[str, Any]]) -> None:
    source = (ROOT / "gas" / "kube.py").read_text()
    calls = set(re.findall(r"self\._core\.([a-z_]+)", source))
    assert calls == set(CALL_RULES), "a new API call needs a rule here and in deploy/"
    needed: dict[tuple[str, str], set[str]] = {}
    for group, resource, verbs in CALL_RULES.values():
        needed.setdefault((group, resource), set()).update(verbs)
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in manifests["ClusterRole"]["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == needed
