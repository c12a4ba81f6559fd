"""The shipped scheduler configuration and manifests agree with the code and with the
rules kube-scheduler, kustomize and the API server apply to them."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

from gas.cluster.demo import DemoCluster, load_demo_file
from gas.cluster.leader import LEASE_NAME
from gas.core.ledger import Ledger
from gas.dra.driver import DRIVER
from gas.kubeapi.core import RawCoordinationV1Api, RawCoreV1Api
from gas.kubeapi.dra import RawResourceV1Api
from gas.kubeapi.prepared import PreparedApi
from gas.serving.extender import create_app
from tests.support import realk8s

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
NAMESPACE = "gas-system"
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
# The fields of kustomize.config.k8s.io/v1beta1 Kustomization (kustomize v5).
KUSTOMIZATION_FIELDS = {
    "apiVersion",
    "kind",
    "metadata",
    "resources",
    "components",
    "namespace",
    "namePrefix",
    "nameSuffix",
    "labels",
    "commonLabels",
    "commonAnnotations",
    "images",
    "replicas",
    "patches",
    "patchesStrategicMerge",
    "patchesJson6902",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "replacements",
    "vars",
    "crds",
    "openapi",
    "buildMetadata",
    "sortOptions",
    "configurations",
    "generators",
    "transformers",
    "validators",
    "helmCharts",
    "helmGlobals",
}
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "CustomResourceDefinition",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "DeviceClass",
}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}
# In deploy/ but applied on its own (`kubectl apply -f`), not by the kustomization: the
# label-only labeller, for clusters where another component hands out the devices.
OPTIONAL_MANIFESTS = {"labeler-daemonset.yaml"}
# Applied on its own too: the webhook configuration without caBundle (`gas certs` writes it
# with one; re-applying this one would erase it).
WEBHOOK_CONFIGURATION = "webhook-configuration.yaml"
# The two ways of installing: the kubeadm way (gas inside the default scheduler) and any
# cluster (a scheduler of gas's own); deploy/base is what they share.
KUBEADM = DEPLOY
ANY_CLUSTER = DEPLOY / "any-cluster"
BASE = DEPLOY / "base"
# The Namespace, shared by base/ and the DRA way.
NAMESPACE_DIR = DEPLOY / "namespace"
# Optional, with the kubeadm way: the validation-only webhook.
KUBEADM_WEBHOOK = DEPLOY / "kubeadm-webhook"
# The DRA way: gas dra on the nodes labelled for it, beside either way or alone.
DRA = DEPLOY / "dra"
DRA_LABEL = "gpu.gas.intel.com/dra"
# Optional, with the DRA way alone: the webhook that turns gas pods into DRA claims.
DRA_WEBHOOK = DEPLOY / "dra-webhook"
KUSTOMIZATIONS = (KUBEADM, BASE, NAMESPACE_DIR, ANY_CLUSTER, KUBEADM_WEBHOOK, DRA, DRA_WEBHOOK)
# Namespaced objects outside gas-system: kube-scheduler's authentication delegation reads a
# ConfigMap of kube-system, and the Role that allows it lives there.
KUBE_SYSTEM_OBJECTS = {("RoleBinding", "gas-scheduler-authentication-reader")}


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest_files(directory: Path | None = None) -> list[Path]:
    """The manifests of one kustomization's folder, or of all deploy/ (every folder)."""
    paths = directory.glob("*.yaml") if directory is not None else DEPLOY.rglob("*.yaml")
    return sorted(p for p in paths if p.name != "kustomization.yaml")


def _label(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


def all_documents() -> Iterator[tuple[str, int, dict[str, Any]]]:
    for path in manifest_files():
        for index, doc in enumerate(load_all(path)):
            yield _label(path), index, doc


def find(kind: str, name: str) -> dict[str, Any]:
    found = [
        d for _, _, d in all_documents() if d["kind"] == kind and d["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} documents in deploy/"
    return found[0]


def kustomization_of(directory: Path) -> dict[str, Any]:
    (document,) = load_all(directory / "kustomization.yaml")
    return document


def way_files(directory: Path) -> list[Path]:
    """The files a kustomization applies: its resources, folders (bases) followed."""
    files: list[Path] = []
    for resource in kustomization_of(directory)["resources"]:
        path = (directory / resource).resolve()
        files.extend(way_files(path) if path.is_dir() else [path])
    return files


def way_documents(directory: Path) -> list[dict[str, Any]]:
    """What `kubectl kustomize directory` builds, as these tests understand kustomize: the
    documents of its files, images set by its `images` entries."""
    kustomization = kustomization_of(directory)
    return [
        _kustomized(doc, kustomization) for path in way_files(directory) for doc in load_all(path)
    ]


def way_find(directory: Path, kind: str, name: str) -> dict[str, Any]:
    found = [
        d for d in way_documents(directory) if d["kind"] == kind and d["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} documents in {_label(directory)}"
    return found[0]


@pytest.fixture(scope="module")
def scheduler_config() -> dict[str, Any]:
    (config,) = load_all(ROOT / "extender-configuration" / "scheduler-config.yaml")
    return config


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    return kustomization_of(KUBEADM)


PROFILE_KEY = "config.yaml"


def profile_config() -> dict[str, Any]:
    """The any-cluster scheduler's KubeSchedulerConfiguration, from its ConfigMap."""
    config_map = find("ConfigMap", "gas-scheduler-config")
    config: dict[str, Any] = yaml.safe_load(config_map["data"][PROFILE_KEY])
    return config


@pytest.fixture(scope="module", params=["kubeadm", "any-cluster"])
def either_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Each shipped KubeSchedulerConfiguration that registers gas."""
    if request.param == "kubeadm":
        (config,) = load_all(ROOT / "extender-configuration" / "scheduler-config.yaml")
        return config
    return profile_config()


# ------------------------------------------------------------------ scheduler configuration


def test_scheduler_config_is_valid_v1(either_config: dict[str, Any]) -> None:
    assert either_config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert either_config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = either_config["extenders"]
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


def test_scheduler_config_verbs_are_routes_gas_serves(either_config: dict[str, Any]) -> None:
    ledger = Ledger()
    app = create_app(ledger, DemoCluster(ledger, load_demo_file(None)))
    routes = {rule.rule: rule.methods or set() for rule in app.url_map.iter_rules()}
    (extender,) = either_config["extenders"]
    for verb in ("filterVerb", "preemptVerb", "bindVerb"):
        path = urlparse(extender["urlPrefix"].rstrip("/") + "/" + extender[verb]).path
        assert "POST" in routes[path], path


# A commented key stands with its '#' in the keys' column.
SCORING_LINES = re.compile(r"^( *)# *((?:prioritizeVerb|weight): .+)$", re.MULTILINE)


@pytest.mark.parametrize(
    "path",
    [
        ROOT / "extender-configuration" / "scheduler-config.yaml",
        ROOT / "deploy" / "any-cluster" / "scheduler-config.yaml",
    ],
    ids=["kubeadm", "any-cluster"],
)
def test_the_commented_scoring_lines_reach_gas_when_uncommented(path: Path) -> None:
    """binpack and spread need prioritize: the lines each configuration shows for it, put
    back where they stand, make a configuration whose call reaches gas's prioritize."""
    text = path.read_text()
    assert len(SCORING_LINES.findall(text)) == 2
    scored = SCORING_LINES.sub(lambda m: m.group(1) + m.group(2), text)
    (doc,) = yaml.safe_load_all(scored)
    config = yaml.safe_load(doc["data"][PROFILE_KEY]) if doc["kind"] == "ConfigMap" else doc
    (extender,) = config["extenders"]
    assert extender["weight"] == 1
    url = extender["urlPrefix"].rstrip("/") + "/" + extender["prioritizeVerb"]
    assert urlparse(url).path == "/scheduler/prioritize"


def test_kubeadm_scheduler_config_points_at_the_service(
    scheduler_config: dict[str, Any],
) -> None:
    # A static pod has no in-cluster configuration: the kubeconfig must be named.
    assert scheduler_config["clientConnection"]["kubeconfig"]
    (extender,) = scheduler_config["extenders"]
    url = urlparse(extender["urlPrefix"])
    service = find("Service", "gas-extender")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.hostname == host == extender["tlsConfig"]["serverName"]
    assert url.port == service["spec"]["ports"][0]["port"] == 9001


# ------------------------------------------------------------------ every manifest


def _model(doc: dict[str, Any]) -> Any:
    """The client's model class for a document: `apps/v1` `Deployment` -> V1Deployment."""
    version = doc["apiVersion"].rsplit("/", 1)[-1]
    name = version[:1].upper() + version[1:] + doc["kind"]
    if doc["apiVersion"] == "v1" and doc["kind"] == "Event":
        name = "CoreV1Event"
    model = getattr(client, name, None)
    assert model is not None, f"no client model {name} for {doc['apiVersion']} {doc['kind']}"
    return model


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(doc, id=f"{file}#{index}-{doc.get('kind')}")
        for file, index, doc in all_documents()
    ],
)
def test_every_manifest_matches_the_api_schema(doc: dict[str, Any]) -> None:
    parsed = _model(doc).from_dict(doc)
    # Nothing dropped: every field of the document is one the schema knows (a misspelt or
    # misplaced field would be silently ignored by `kubectl apply`).
    assert client.ApiClient().sanitize_for_serialization(parsed) == doc


def test_manifests_name_their_namespace() -> None:
    """Namespaced objects carry the namespace themselves, so kustomize's namespace field
    changes nothing and each file also works with `kubectl apply -f`."""
    assert find("Namespace", NAMESPACE)
    assert kustomization_of(KUBEADM)["namespace"] == NAMESPACE
    # Unset: kustomize would move the kube-system RoleBinding into gas-system.
    assert "namespace" not in kustomization_of(ANY_CLUSTER)
    for file, _, doc in all_documents():
        namespace = doc["metadata"].get("namespace")
        what = f"{file}: {doc['kind']} {doc['metadata']['name']}"
        if doc["kind"] in CLUSTER_SCOPED_KINDS:
            assert namespace is None, what
        elif (doc["kind"], doc["metadata"]["name"]) in KUBE_SYSTEM_OBJECTS:
            assert namespace == "kube-system", what
        else:
            assert namespace == NAMESPACE, what
        for subject in doc.get("subjects") or []:
            if subject["kind"] == "ServiceAccount":
                assert subject["namespace"] == NAMESPACE, what


def installation(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file, document) of everything one way of installing may apply: its kustomizations
    and the files applied on their own."""
    optional = {KUBEADM: [KUBEADM_WEBHOOK], DRA: [DRA_WEBHOOK]}.get(directory, [])
    directories = [directory, *optional]
    paths = [p for d in directories for p in way_files(d)]
    paths += [
        d / WEBHOOK_CONFIGURATION for d in directories if (d / WEBHOOK_CONFIGURATION).is_file()
    ]
    if directory == KUBEADM:
        paths += [DEPLOY / name for name in sorted(OPTIONAL_MANIFESTS)]
    return [(_label(p), doc) for p in paths for doc in load_all(p)]


@pytest.mark.parametrize("directory", [KUBEADM, ANY_CLUSTER, DRA], ids=_label)
def test_no_two_documents_name_the_same_object(directory: Path) -> None:
    """Within a way of installing, whatever its parts: an object of one part applied over
    another's would change it silently. (The two ways share base/ and the webhook's
    Service name, but are never installed together.)"""
    seen: dict[tuple[str, str, str], str] = {}
    for file, doc in installation(directory):
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        assert key not in seen, f"{key} in {seen.get(key)} and {file}"
        seen[key] = file


def test_every_manifest_belongs_to_a_way_of_installing() -> None:
    files = {f for d in (KUBEADM, ANY_CLUSTER, DRA) for f, _ in installation(d)}
    assert {_label(p) for p in manifest_files()} == files
    # The two ways share only base/, and the name of the Service the webhook
    # configurations call.
    kubeadm = {(d["kind"], d["metadata"]["name"]) for f, d in installation(KUBEADM)}
    shared = kubeadm & {(d["kind"], d["metadata"]["name"]) for f, d in installation(ANY_CLUSTER)}
    base = {(d["kind"], d["metadata"]["name"]) for p in way_files(BASE) for d in load_all(p)}
    assert shared == base | {("Service", "gas-webhook")}


# ------------------------------------------------------------------ kustomizations


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=_label)
def test_kustomization_lists_every_manifest(directory: Path) -> None:
    resources = kustomization_of(directory)["resources"]
    assert len(resources) == len(set(resources)), "a file is listed twice"
    files = {r for r in resources if not (directory / r).is_dir()}
    on_disk = {path.name for path in manifest_files(directory)}
    assert files - on_disk == set(), "listed but missing: kubectl apply -k would fail"
    optional = {
        KUBEADM: OPTIONAL_MANIFESTS,
        ANY_CLUSTER: {WEBHOOK_CONFIGURATION},
        KUBEADM_WEBHOOK: {WEBHOOK_CONFIGURATION},
        DRA_WEBHOOK: {WEBHOOK_CONFIGURATION},
    }.get(directory, set())
    assert on_disk - files == optional, "in deploy/ but not applied by the kustomization"


def test_each_way_installs_what_it_needs() -> None:
    shared = {"namespace/namespace.yaml", "base/gas-role.yaml", "base/node-daemonset.yaml"}
    kubeadm = {_label(p) for p in way_files(KUBEADM)}
    assert kubeadm == shared | {"rbac.yaml", "deployment.yaml", "service.yaml", "pdb.yaml"}
    any_cluster = {_label(p) for p in way_files(ANY_CLUSTER)}
    assert any_cluster == shared | {
        f"any-cluster/{name}"
        for name in (
            "rbac.yaml",
            "scheduler-config.yaml",
            "deployment.yaml",
            "webhook-service.yaml",
            "pdb.yaml",
        )
    }
    # Every manifest belongs to a way, or is the optional labeller.
    assert {_label(p) for p in way_files(KUBEADM_WEBHOOK)} == {"kubeadm-webhook/webhook.yaml"}
    assert {_label(p) for p in way_files(DRA_WEBHOOK)} == {"dra-webhook/webhook.yaml"}


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=_label)
def test_kustomization_is_well_formed(directory: Path) -> None:
    kustomization = kustomization_of(directory)
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert set(kustomization) <= KUSTOMIZATION_FIELDS
    for resource in kustomization["resources"]:
        path = Path(resource)
        assert not path.is_absolute(), resource
        # kustomize loads no file from outside the kustomization's folder; only a folder
        # holding a kustomization of its own (a base) may be elsewhere.
        if ".." in path.parts:
            assert (directory / path / "kustomization.yaml").is_file(), resource
    # An `images` entry that matches no container would leave the real image untouched.
    repositories = {
        _image_name(c["image"])
        for p in way_files(directory)
        for d in load_all(p)
        for c in _containers(d)
    }
    for entry in kustomization.get("images") or []:
        assert set(entry) <= {"name", "newName", "newTag", "digest"}
        assert entry["name"] in repositories, entry


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] not in WORKLOAD_KINDS:
        return []
    spec = doc["spec"]["template"]["spec"]
    return list(spec.get("initContainers") or []) + list(spec["containers"])


def _image_name(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def _kustomized(doc: dict[str, Any], kustomization: dict[str, Any]) -> dict[str, Any]:
    """What kustomize makes of a document with this kustomization's namespace and images."""
    for container in _containers(doc):
        for entry in kustomization.get("images") or []:
            if _image_name(container["image"]) == entry["name"]:
                name = entry.get("newName", entry["name"])
                tag = container["image"][len(entry["name"]) :]
                container["image"] = name + (f":{entry['newTag']}" if "newTag" in entry else tag)
    return doc


def kustomize_build(directory: Path, k8s: realk8s.Release) -> list[dict[str, Any]]:
    """`kubectl kustomize` of that version's real kubectl (each embeds its kustomize v5)."""
    command = str(realk8s.binary("kubectl", k8s.version))
    result = subprocess.run(
        [command, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])


@pytest.mark.parametrize(
    "directory", [KUBEADM, ANY_CLUSTER, KUBEADM_WEBHOOK, DRA, DRA_WEBHOOK], ids=_label
)
def test_kubectl_kustomize_builds_exactly_the_files(directory: Path, k8s: realk8s.Release) -> None:
    built = kustomize_build(directory, k8s)
    assert sorted(built, key=_key) == sorted(way_documents(directory), key=_key)


def test_kustomize_sets_the_kube_scheduler_image_from_the_kustomization(
    k8s: realk8s.Release,
) -> None:
    (entry,) = [
        e
        for e in kustomization_of(ANY_CLUSTER)["images"]
        if e["name"] == "registry.k8s.io/kube-scheduler"
    ]
    built = kustomize_build(ANY_CLUSTER, k8s)
    (deployment,) = [d for d in built if _key(d) == ("Deployment", NAMESPACE, "gas-scheduler")]
    images = {c["name"]: c["image"] for c in _containers(deployment)}
    assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{entry['newTag']}"
    # The tag the manifest names is the entry's: the file alone (kubectl apply -f) runs it.
    assert (
        find("Deployment", "gas-scheduler")["spec"]["template"]["spec"]["containers"][0]["image"]
        == images["kube-scheduler"]
    )


# ------------------------------------------------------------------ the gas workload


def test_deployment_runs_hardened_replicas_with_leader_election() -> None:
    deployment = find("Deployment", "gas")
    spec = deployment["spec"]
    # Only the leader is Ready: a rollout must not wait for a new pod to become Ready
    # while the old leader runs (it never would), so all old pods may go at once.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": spec["replicas"]},
    }
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "gas"
    (gas,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert gas["securityContext"]["readOnlyRootFilesystem"] is True
    assert gas["securityContext"]["allowPrivilegeEscalation"] is False
    assert gas["resources"]["requests"]["cpu"] and gas["resources"]["requests"]["memory"]
    # The kubelet's probes present no client certificate: a probe of the mutual-TLS port
    # could never succeed, so they go to the plain health port.
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = gas[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTP", "health")
    assert gas["ports"] == [
        {"name": "https", "containerPort": 9001},
        {"name": "health", "containerPort": 9002},
    ]
    assert "--leaderElect" in gas["args"] and "--healthPort=9002" in gas["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in gas["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = spec["template"]["metadata"]["labels"]
    assert _selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], labels)


def test_deployment_serves_the_tls_secret() -> None:
    pod = find("Deployment", "gas")["spec"]["template"]["spec"]
    (gas,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in gas["volumeMounts"] if volumes[m["name"]].get("secret")]
    assert volumes[mount["name"]]["secret"] == {"secretName": "gas-tls"}
    assert mount["readOnly"] is True
    directory = mount["mountPath"].rstrip("/")
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in gas["args"] if "=" in arg)
    assert gas["args"][0] == "serve"
    assert flags == {
        "cert": f"{directory}/tls.crt",
        "key": f"{directory}/tls.key",
        "cacert": f"{directory}/ca.crt",
        "healthPort": "9002",
    }


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_service_and_budget_select_the_extender_and_nothing_else() -> None:
    template = find("Deployment", "gas")["spec"]["template"]
    service = find("Service", "gas-extender")["spec"]["selector"]
    budget = find("PodDisruptionBudget", "gas")["spec"]["selector"]["matchLabels"]
    gas_labels = template["metadata"]["labels"]
    assert _selects(find("Deployment", "gas")["spec"]["selector"]["matchLabels"], gas_labels)
    assert _selects(service, gas_labels) and _selects(budget, gas_labels)
    for file, _, doc in all_documents():
        if doc["kind"] in WORKLOAD_KINDS and doc["metadata"]["name"] != "gas":
            labels = doc["spec"]["template"]["metadata"].get("labels") or {}
            assert not _selects(service, labels), f"{file}: the Service would route to it"
            assert not _selects(budget, labels), f"{file}: the budget would count it"


def test_disruption_budget_never_blocks_a_drain() -> None:
    """Only the leader is Ready, so the budget sees one healthy pod: `minAvailable: 1`
    would make every eviction of the leader fail, and a node drain would hang; the budget
    must allow the one Ready pod down."""
    replicas = find("Deployment", "gas")["spec"]["replicas"]
    ready = 1
    budget = find("PodDisruptionBudget", "gas")
    assert budget["apiVersion"] == "policy/v1"
    spec = budget["spec"]
    assert ("minAvailable" in spec) != ("maxUnavailable" in spec)
    if "maxUnavailable" in spec:
        assert isinstance(spec["maxUnavailable"], int)
        assert replicas - spec["maxUnavailable"] < ready
    else:
        assert isinstance(spec["minAvailable"], int) and spec["minAvailable"] < ready


# ------------------------------------------------------------------ the any-cluster scheduler


def _scheduler_pod() -> dict[str, Any]:
    pod: dict[str, Any] = find("Deployment", "gas-scheduler")["spec"]["template"]["spec"]
    return pod


def _container(name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in _scheduler_pod()["containers"] if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def _flags(args: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in args if "=" in arg)


def _mounted_files(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every file a container sees from a Secret or ConfigMap: path -> (object, key)."""
    volumes = {v["name"]: v for v in _scheduler_pod()["volumes"]}
    files: dict[str, tuple[str, str]] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        source = volume.get("secret") or volume.get("configMap")
        if source is None:
            continue
        name = source.get("secretName") or source["name"]
        keys = {i["path"]: i["key"] for i in source.get("items") or []}
        if not keys:
            keys = {k: k for k in _keys_of(name)}
        for path, key in keys.items():
            files[f"{mount['mountPath'].rstrip('/')}/{path}"] = (name, key)
    return files


def _keys_of(name: str) -> set[str]:
    if name == "gas-scheduler-config":
        return set(find("ConfigMap", name)["data"])
    # The Secrets come from `gas certs`: tls.crt and tls.key in a TLS Secret.
    return {"tls.crt", "tls.key"}


def test_scheduler_deployment_runs_two_hardened_pods_spread_over_nodes() -> None:
    deployment = find("Deployment", "gas-scheduler")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    # Every pod is Ready (readiness is not leadership): a rollout can wait for each.
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    labels = spec["template"]["metadata"]["labels"]
    assert _selects(spec["selector"]["matchLabels"], labels)
    pod = _scheduler_pod()
    assert pod["serviceAccountName"] == "gas-scheduler"
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], labels)
    assert [c["name"] for c in pod["containers"]] == ["kube-scheduler", "gas", "webhook"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork")
    for container in pod["containers"]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, container["name"]
        requests = container["resources"]["requests"]
        assert requests["cpu"] and requests["memory"], container["name"]
        assert container["resources"]["limits"]["memory"], container["name"]
        # Every mount of a Secret or ConfigMap is read-only.
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in container["volumeMounts"]:
            if "emptyDir" not in volumes[mount["name"]]:
                assert mount["readOnly"] is True, (container["name"], mount)


def test_kube_scheduler_runs_the_profile_from_its_config_map() -> None:
    scheduler = _container("kube-scheduler")
    assert _image_name(scheduler["image"]) == "registry.k8s.io/kube-scheduler"
    assert scheduler["command"][0] == "kube-scheduler"
    flags = _flags(scheduler["command"][1:])
    files = _mounted_files(scheduler)
    assert files[flags["config"]] == ("gas-scheduler-config", PROFILE_KEY)
    # The files its extender entry names are there, from the Secret of `gas certs`.
    tls = profile_config()["extenders"][0]["tlsConfig"]
    assert files[tls["caFile"]] == ("gas-tls", "ca.crt")
    assert files[tls["certFile"]] == ("gas-tls", "client.crt")
    assert files[tls["keyFile"]] == ("gas-tls", "client.key")
    # Probed as kubeadm probes its static pod: /healthz of its own HTTPS port, which
    # answers without credentials; no readiness probe (a standby scheduler is healthy).
    (port,) = scheduler["ports"]
    assert port == {"name": "scheduler", "containerPort": 10259}
    for probe in ("startupProbe", "livenessProbe"):
        get = scheduler[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == ("/healthz", "scheduler", "HTTPS")
        assert "host" not in get
    assert "readinessProbe" not in scheduler


def test_profile_is_gas_scheduler_with_its_own_lease_and_gas_on_loopback() -> None:
    config = profile_config()
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "gas-scheduler"
    # In the pod, the ServiceAccount's in-cluster configuration.
    assert config["clientConnection"]["kubeconfig"] == ""
    assert config["clientConnection"]["qps"] >= 100
    assert config["clientConnection"]["burst"] >= 2 * config["clientConnection"]["qps"]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceNamespace": NAMESPACE,
        "resourceName": LEASES["gas-scheduler"],
    }
    (extender,) = config["extenders"]
    url = urlparse(extender["urlPrefix"])
    gas = _flags(_container("gas")["args"])
    assert (url.hostname, url.port) == (gas["host"], int(gas["port"])) == ("127.0.0.1", 9001)
    assert {extender[v] for v in ("filterVerb", "preemptVerb", "bindVerb")} == {
        "filter",
        "preempt",
        "bind",
    }
    # First fit, gas's default, scores nothing: the call is left out, as in the kubeadm one.
    assert "prioritizeVerb" not in extender and "weight" not in extender
    assert extender["ignorable"] is False and extender["enableHTTPS"] is True
    # Checked against the address itself, which every certificate of `gas certs` carries.
    from gas.tools.certs import LOOPBACK_IPS

    assert "serverName" not in extender["tlsConfig"] and url.hostname in LOOPBACK_IPS


def test_gas_follows_the_schedulers_lease_and_is_probed_on_its_health_port() -> None:
    gas = _container("gas")
    assert gas["args"][0] == "serve"
    flags = _flags(gas["args"])
    assert "--leaderElect" not in gas["args"]
    assert flags["schedulerLease"] == profile_config()["leaderElection"]["resourceName"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in gas["env"]}
    # kube-scheduler's identity starts with the hostname, which is the pod's name.
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    files = _mounted_files(gas)
    assert files[flags["cert"]] == ("gas-tls", "tls.crt")
    assert files[flags["key"]] == ("gas-tls", "tls.key")
    assert files[flags["cacert"]] == ("gas-tls", "ca.crt")
    assert not any(key == "client.key" for _, key in files.values())
    (port,) = gas["ports"]
    assert port == {"name": "health", "containerPort": int(flags["healthPort"])}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = gas[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTP", "health")


def test_webhook_container_serves_the_service_with_its_own_certificate() -> None:
    webhook = _container("webhook")
    assert webhook["args"][0] == "webhook"
    flags = _flags(webhook["args"])
    assert flags["schedulerName"] == profile_config()["profiles"][0]["schedulerName"]
    files = _mounted_files(webhook)
    assert files[flags["cert"]] == ("gas-webhook-tls", "tls.crt")
    assert files[flags["key"]] == ("gas-webhook-tls", "tls.key")
    assert not any(name == "gas-tls" for name, _ in files.values())
    (port,) = webhook["ports"]
    assert port == {"name": "webhook", "containerPort": int(flags["port"])}
    # The webhook asks no client certificate, so HTTPS probes work.
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = webhook[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTPS", "webhook")
    service = way_find(ANY_CLUSTER, "Service", "gas-webhook")
    (service_port,) = service["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (443, "webhook")
    labels = find("Deployment", "gas-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert _selects(service["spec"]["selector"], labels)


def test_webhook_counts_the_annotation_problems_gas_counts() -> None:
    """--enableAllowlist and --enableDenylist decide which gas-allow / gas-deny problems
    refuse a pod: the webhook must refuse exactly what gas's filter would."""
    toggles = {"--enableAllowlist", "--enableDenylist"}

    def enabled(args: list[str]) -> set[str]:
        return {a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in toggles}

    assert enabled(_container("webhook")["args"]) == enabled(_container("gas")["args"])


def test_scheduler_pods_arguments_are_the_commands_flags() -> None:
    from gas.cli import COMMANDS, _go_style, build_parser

    if "webhook" not in COMMANDS:
        pytest.skip("this build has no `gas webhook` command yet")
    (kubeadm_webhook,) = way_find(KUBEADM_WEBHOOK, "Deployment", "gas-webhook")["spec"]["template"][
        "spec"
    ]["containers"]
    for container, command in (
        (_container("gas"), "serve"),
        (_container("webhook"), "webhook"),
        (kubeadm_webhook, "webhook"),
    ):
        name = container["name"]
        try:
            args = build_parser().parse_args(_go_style(container["args"]))
        except SystemExit:
            pytest.fail(f"gas does not take the {name} container's arguments: {container['args']}")
        assert args.command == command


def test_webhook_configuration_is_the_one_gas_builds() -> None:
    try:
        from gas.tools.webhook_config import webhook_configuration
    except ImportError:
        pytest.skip("gas.tools.webhook_config is not there yet")
    (shipped,) = load_all(ANY_CLUSTER / WEBHOOK_CONFIGURATION)
    assert shipped == webhook_configuration(None)
    (webhook,) = shipped["webhooks"]
    assert "caBundle" not in webhook["clientConfig"]
    service = way_find(ANY_CLUSTER, "Service", "gas-webhook")
    reference = webhook["clientConfig"]["service"]
    assert (reference["namespace"], reference["name"]) == (NAMESPACE, "gas-webhook")
    assert reference["port"] == service["spec"]["ports"][0]["port"]
    # Its own namespace is excluded, so the scheduler pods are never waiting on themselves.
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn" and NAMESPACE in expression["values"]


def test_scheduler_budget_keeps_one_pod_and_selects_only_the_scheduler() -> None:
    budget = find("PodDisruptionBudget", "gas-scheduler")
    assert budget["spec"] == {
        "minAvailable": 1,
        "selector": {
            "matchLabels": find("Deployment", "gas-scheduler")["spec"]["selector"]["matchLabels"]
        },
    }
    assert budget["spec"]["minAvailable"] < find("Deployment", "gas-scheduler")["spec"]["replicas"]
    for file, _, doc in all_documents():
        if doc["kind"] in WORKLOAD_KINDS and doc["metadata"]["name"] != "gas-scheduler":
            labels = doc["spec"]["template"]["metadata"].get("labels") or {}
            selector = budget["spec"]["selector"]["matchLabels"]
            assert not _selects(selector, labels), f"{file}: the budget would count it"
            webhook = way_find(ANY_CLUSTER, "Service", "gas-webhook")["spec"]["selector"]
            assert not _selects(webhook, labels), f"{file}: gas-webhook would route to it"


def test_gas_check_config_passes_the_profile_with_its_deployment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gas.tools.checkconfig.command import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    files = [str(ANY_CLUSTER / "scheduler-config.yaml"), str(ANY_CLUSTER / "deployment.yaml")]
    code = run(parser.parse_args([*files, "--kubernetesVersion", "1.28"]))
    out = capsys.readouterr().out
    assert (code, out) == (0, "OK\n")


# ------------------------------------------------------------------ the kubeadm way's webhook


# The calls of `gas webhook --draClaims` (its claim templates), and the rules they need:
# granted by no shipped manifest (the switch is off there), and exactly these where it is
# turned on (docs/webhook.md; test_webhook_dra_realk8s runs it on them alone).
WEBHOOK_CLAIM_CALLS = {
    "ResourceV1Api.read_namespaced_resource_claim_template": (
        "resource.k8s.io",
        "resourceclaimtemplates",
        {"get"},
    ),
    "ResourceV1Api.create_namespaced_resource_claim_template": (
        "resource.k8s.io",
        "resourceclaimtemplates",
        {"create"},
    ),
}


def webhook_claim_rules() -> list[dict[str, Any]]:
    """WEBHOOK_CLAIM_CALLS as RBAC rules, one per (group, resource)."""
    needed: dict[tuple[str, str], set[str]] = {}
    for group, resource, verbs in WEBHOOK_CLAIM_CALLS.values():
        needed.setdefault((group, resource), set()).update(verbs)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
        for (group, resource), verbs in sorted(needed.items())
    ]


def test_the_webhook_calls_only_what_dra_claims_need_and_only_its_manifest_grants_it() -> None:
    # The webhook's own modules: where it builds its one client, and what calls it. (Its
    # imports reach the extender's modules, whose calls run under gas serve only.)
    serving = ROOT / "gas" / "serving"
    own = ["webhook.py", "webhook_app.py", "admission.py", "claim_templates.py"]
    sources = [(serving / name).read_text() for name in own]
    assert api_calls(sources) == set(WEBHOOK_CLAIM_CALLS)
    for file, _, doc in all_documents():
        if doc.get("kind") in ("Role", "ClusterRole") and file != "dra-webhook/webhook.yaml":
            for rule in doc.get("rules") or []:
                assert "resourceclaimtemplates" not in rule.get("resources", []), file
    # deploy/dra-webhook: exactly these rules, bound to its webhook's account alone, whose
    # pods run --draClaims and mount the token; the other webhooks keep none.
    role = way_find(DRA_WEBHOOK, "ClusterRole", "gas-webhook-claims")
    assert [
        {**rule, "verbs": sorted(rule["verbs"])} for rule in role["rules"]
    ] == webhook_claim_rules()
    binding = way_find(DRA_WEBHOOK, "ClusterRoleBinding", "gas-webhook-claims")
    assert binding["roleRef"]["name"] == "gas-webhook-claims"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gas-webhook-claims", "namespace": NAMESPACE}
    ]
    assert bindings_of("gas-webhook-claims") == [("ClusterRole", None, "gas-webhook-claims")]
    deployment = way_find(DRA_WEBHOOK, "Deployment", "gas-webhook")
    pod = deployment["spec"]["template"]["spec"]
    (webhook,) = pod["containers"]
    assert webhook["args"][0] == "webhook" and "--draClaims" in webhook["args"]
    assert "--validateOnly" not in webhook["args"]
    assert pod["serviceAccountName"] == "gas-webhook-claims"
    assert pod["automountServiceAccountToken"] is True
    assert webhook["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    service = way_find(DRA_WEBHOOK, "Service", "gas-webhook")
    assert _selects(
        service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"]
    )


def test_kubeadm_webhook_validates_only_and_holds_no_rights() -> None:
    deployment = way_find(KUBEADM_WEBHOOK, "Deployment", "gas-webhook")
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    assert _selects(deployment["spec"]["selector"]["matchLabels"], labels)
    (webhook,) = pod["containers"]
    assert webhook["args"][0] == "webhook" and "--validateOnly" in webhook["args"]
    flags = _flags(webhook["args"])
    (port,) = webhook["ports"]
    assert port == {"name": "webhook", "containerPort": int(flags["port"])}
    for probe in ("readinessProbe", "livenessProbe"):
        assert webhook[probe]["httpGet"]["scheme"] == "HTTPS"
    assert webhook["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    # It makes no API call: no token mounted, nothing bound to its account.
    assert (
        pod["serviceAccountName"] == "gas-webhook" and pod["automountServiceAccountToken"] is False
    )
    assert bindings_of("gas-webhook") == []
    service = way_find(KUBEADM_WEBHOOK, "Service", "gas-webhook")
    assert _selects(service["spec"]["selector"], labels)
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    for file, doc in installation(KUBEADM):
        if doc["kind"] in WORKLOAD_KINDS and doc["metadata"]["name"] != "gas-webhook":
            other = doc["spec"]["template"]["metadata"].get("labels") or {}
            assert not _selects(service["spec"]["selector"], other), file
    budget = way_find(KUBEADM_WEBHOOK, "PodDisruptionBudget", "gas-webhook")
    assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    assert _selects(budget["spec"]["selector"]["matchLabels"], labels)


def test_kubeadm_webhook_configuration_is_the_validating_one_gas_builds() -> None:
    try:
        from gas.tools.webhook_config import webhook_configuration
    except ImportError:
        pytest.skip("gas.tools.webhook_config is not there yet")
    (shipped,) = load_all(KUBEADM_WEBHOOK / WEBHOOK_CONFIGURATION)
    assert shipped == webhook_configuration(None, validate_only=True)
    assert shipped["kind"] == "ValidatingWebhookConfiguration"


def test_dra_webhook_configuration_is_the_one_gas_builds_for_dra_claims() -> None:
    from gas.tools.webhook_config import webhook_configuration

    (shipped,) = load_all(DRA_WEBHOOK / WEBHOOK_CONFIGURATION)
    assert shipped == webhook_configuration(None, dra_claims=True)
    assert shipped["webhooks"][0]["sideEffects"] == "NoneOnDryRun"


# ------------------------------------------------------------------ RBAC against the code

# Each Kubernetes call `gas serve` makes, and the RBAC rule it needs.
CALL_RULES = {
    "CoreV1Api.list_node": ("", "nodes", {"list", "watch"}),
    "CoreV1Api.list_pod_for_all_namespaces": ("", "pods", {"list", "watch"}),
    "CoreV1Api.read_namespaced_pod": ("", "pods", {"get"}),
    "CoreV1Api.patch_namespaced_pod": ("", "pods", {"patch"}),
    "CoreV1Api.create_namespaced_pod_binding": ("", "pods/binding", {"create"}),
    "CoreV1Api.create_namespaced_event": ("", "events", {"create"}),
    "CoordinationV1Api.read_namespaced_lease": ("coordination.k8s.io", "leases", {"get"}),
    "CoordinationV1Api.create_namespaced_lease": ("coordination.k8s.io", "leases", {"create"}),
    "CoordinationV1Api.replace_namespaced_lease": ("coordination.k8s.io", "leases", {"update"}),
    "CoreV1Api.patch_namespaced_event": ("", "events", {"patch"}),
    "EventsV1Api.create_namespaced_event": ("events.k8s.io", "events", {"create"}),
    "EventsV1Api.patch_namespaced_event": ("events.k8s.io", "events", {"patch"}),
}
# Granted ahead of the code: Events are being extended to update repeated Events (patch)
# and to use the events.k8s.io API. Every other rule must be used by a call.
GRANTED_AHEAD = {
    "CoreV1Api.patch_namespaced_event",
    "EventsV1Api.create_namespaced_event",
    "EventsV1Api.patch_namespaced_event",
}
# The client package loads its classes lazily: `vars()` would not list them.
API_CLASSES = {
    name: getattr(client, name)
    for name in dir(client)
    if name.endswith("Api") and isinstance(getattr(client, name), type)
}
_NOT_CALLS = {"close", "api_client"}
# gas's own classes that make an API class's calls under its method names (gas/kubeapi/;
# test_kubeapi and test_node_kubeapi check that each sends what its namesake sends). Only
# the methods the API class has count: the stand-ins' other methods are not calls.
STAND_INS: dict[str, tuple[type, str]] = {
    "RawCoreV1Api": (RawCoreV1Api, "CoreV1Api"),
    "PreparedApi": (PreparedApi, "CoreV1Api"),
    "RawCoordinationV1Api": (RawCoordinationV1Api, "CoordinationV1Api"),
    "RawResourceV1Api": (RawResourceV1Api, "ResourceV1Api"),
}


def _module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _gas_imports(tree: ast.AST) -> set[str]:
    """The gas modules a piece of code imports, at any depth (lazy imports included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("gas")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gas"):
            assert node.module is not None
            found.add(node.module)
            # `from gas.serving import server` imports the module gas.serving.server.
            for alias in node.names:
                if _module_path(f"{node.module}.{alias.name}") is not None:
                    found.add(f"{node.module}.{alias.name}")
    return found


def _follow(pending: set[str]) -> dict[str, Path]:
    """These modules and every gas module they import, transitively."""
    modules: dict[str, Path] = {}
    while pending:
        module = pending.pop()
        path = _module_path(module)
        if module in modules or path is None:
            continue
        modules[module] = path
        pending |= _gas_imports(ast.parse(path.read_text()))
    return modules


def serve_modules() -> dict[str, Path]:
    """Every gas module the `gas serve` process can run: the imports of `cli.serve`, and
    theirs, transitively. Other commands (`inspect`, `label-node`, `certs`) run under
    someone else's credentials, not gas's ServiceAccount."""
    cli = ast.parse((ROOT / "gas" / "cli.py").read_text())
    (serve,) = [n for n in cli.body if isinstance(n, ast.FunctionDef) and n.name == "serve"]
    return _follow(_gas_imports(serve))


NODE_AGENT = ROOT / "gas" / "node" / "agent.py"


def node_modules() -> dict[str, Path]:
    """Every gas module the `gas node` process can run: its entry point `gas.node.agent`
    and its imports, transitively; before that module exists, every module of gas/node."""
    if NODE_AGENT.is_file():
        return _follow({"gas.node.agent"})
    node = ROOT / "gas" / "node"
    return _follow({f"gas.node.{path.stem}" for path in node.glob("*.py")})


def api_calls(sources: list[str]) -> set[str]:
    """`Class.method` for every API method of a client class gas constructs that the
    sources name (called, or passed on as the watch's list function)."""
    text = "\n".join(sources)
    classes = {name: (cls, name) for name, cls in API_CLASSES.items()} | STAND_INS
    constructed = {m for m in re.findall(r"\b([A-Z]\w*Api)\s*\(", text) if m in classes}
    calls = set()
    for attribute in set(re.findall(r"\.\s*([a-z][a-z0-9_]*)\b", text)):
        method = attribute.removesuffix("_with_http_info")
        for name in constructed:
            cls, api = classes[name]
            if method not in _NOT_CALLS and all(
                callable(getattr(c, method, None)) for c in (cls, API_CLASSES[api])
            ):
                calls.add(f"{api}.{method}")
    return calls


# The Lease each ServiceAccount may renew: gas's own election (kubeadm way), or the
# scheduler's (any cluster), which kube-scheduler renews and gas reads.
LEASES = {"gas": LEASE_NAME, "gas-scheduler": "gas-scheduler"}
# Roles the API server itself keeps (bootstrap RBAC): bound, never defined, in deploy/.
BOOTSTRAP_ROLES = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}


def bindings_of(account: str) -> list[tuple[str, str | None, str]]:
    """(role kind, binding namespace, role name) of every binding to this ServiceAccount of
    gas's namespace."""
    roles: list[tuple[str, str | None, str]] = []
    for _, _, doc in all_documents():
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
            for s in doc["subjects"]
        ):
            roles.append(
                (doc["roleRef"]["kind"], doc["metadata"].get("namespace"), doc["roleRef"]["name"])
            )
    return roles


def granted_to(account: str) -> dict[tuple[str, str], set[str]]:
    """(group, resource) -> verbs, over every role of deploy/ bound to this ServiceAccount
    of gas's namespace (the bootstrap roles aside)."""
    roles = [r for r in bindings_of(account) if (r[0], r[2]) not in BOOTSTRAP_ROLES]
    assert roles, f"nothing is granted to the {account} ServiceAccount"
    granted: dict[tuple[str, str], set[str]] = {}
    for kind, namespace, name in roles:
        role = find(kind, name)
        assert role["metadata"].get("namespace") == (namespace if kind == "Role" else None)
        for rule in role["rules"]:
            assert not rule.get("nonResourceURLs")
            # Names only where RBAC can check them (not `create`), and only the Lease's, or
            # (gas dra) its own driver's entries of the claims' status, in every namespace.
            names = rule.get("resourceNames")
            if names and account == "gas-dra":
                assert rule == DRA_DRIVER_RULE and kind == "ClusterRole", rule
            elif names:
                assert names == [LEASES[account]] and "create" not in rule["verbs"], rule
                assert rule["resources"] == ["leases"] and kind == "Role", rule
                assert namespace == NAMESPACE, rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def test_the_scan_sees_calls_however_they_are_spelt() -> None:
    source = """
        self._core = client.CoreV1Api(api_client)
        events = EventsV1Api(api_client)
        reflector(self._core.list_node)
        self._core.read_namespaced_pod_with_http_info(name, namespace)
        events.create_namespaced_event(namespace, body)
        response.close()
        path.read_text()
    """
    assert api_calls([source]) == {
        "CoreV1Api.list_node",
        "CoreV1Api.read_namespaced_pod",
        # The same method name on both constructed APIs: both rules are required.
        "CoreV1Api.create_namespaced_event",
        "EventsV1Api.create_namespaced_event",
    }


def test_the_scan_reads_gas_stand_ins_as_the_api_they_stand_for() -> None:
    source = """
        self._core = RawCoreV1Api(api_client)
        self._api = PreparedApi(api_client)
        reflector(self._core.list_node)
        self._api.create_namespaced_pod_binding(name, namespace, body, timeout)
        self._api.request("GET", path, None, timeout)
        leases = RawCoordinationV1Api(api_client)
        leases.replace_namespaced_lease(name, namespace, body)
    """
    assert api_calls([source]) == {
        "CoreV1Api.list_node",
        "CoreV1Api.create_namespaced_pod_binding",
        "CoordinationV1Api.replace_namespaced_lease",
    }


def test_serve_modules_are_those_gas_serve_runs() -> None:
    modules = serve_modules()
    assert {
        "gas.cluster.kube",
        "gas.cluster.leader",
        "gas.kubeapi.core",
        "gas.kubeapi.prepared",
        "gas.serving.extender",
        "gas.core.ledger",
        "gas.serving.server",
    } <= set(modules)
    assert not {
        "gas.tools.inspector.command",
        "gas.tools.inspector.read",
        "gas.tools.label_node",
        "gas.tools.certs",
    } & set(modules)


def test_gas_serve_and_gas_node_construct_no_generated_api_class() -> None:
    """Their calls go through gas/kubeapi/: a generated API class would cost each process
    its module and models (21 MiB for `CoreV1Api`)."""
    for modules in (serve_modules(), node_modules()):
        text = "\n".join(path.read_text() for path in modules.values())
        constructed = set(re.findall(r"\b([A-Z]\w*Api)\s*\(", text))
        # A class of gas's own may share a generated one's name (`NodeApi`).
        own = set(re.findall(r"^class ([A-Z]\w*Api)\b", text, re.MULTILINE))
        assert (constructed - own) & set(API_CLASSES) == set()
        assert "RawCoreV1Api" in constructed


def test_rbac_grants_exactly_what_the_code_calls() -> None:
    calls = api_calls([path.read_text() for path in serve_modules().values()])
    assert calls - set(CALL_RULES) == set(), "a new API call needs a rule here and in deploy/"
    unused = set(CALL_RULES) - calls
    assert unused <= GRANTED_AHEAD, f"rules for calls gas no longer makes: {unused}"
    needed: dict[tuple[str, str], set[str]] = {}
    for group, resource, verbs in CALL_RULES.values():
        needed.setdefault((group, resource), set()).update(verbs)
    assert granted_to("gas") == needed
    # Under the scheduler's account gas makes the same calls; the Lease rules it holds are
    # kube-scheduler's (gas only reads the Lease there).
    assert granted_to("gas-scheduler") == needed


def test_the_scheduler_account_is_bound_as_kubernetes_documents_for_a_second_scheduler() -> None:
    bootstrap = {r for r in bindings_of("gas-scheduler") if (r[0], r[2]) in BOOTSTRAP_ROLES}
    assert bootstrap == {
        ("ClusterRole", None, "system:kube-scheduler"),
        ("ClusterRole", None, "system:volume-scheduler"),
        # A RoleBinding in kube-system: the one ConfigMap that Role names is there.
        ("Role", "kube-system", "extension-apiserver-authentication-reader"),
    }
    # No other account is given the scheduler's rights, nor the scheduler the node agent's.
    for account in ("gas", "gas-node"):
        assert not {(r[0], r[2]) for r in bindings_of(account)} & BOOTSTRAP_ROLES
    assert {r[2] for r in bindings_of("gas-scheduler")} - {n for _, n in BOOTSTRAP_ROLES} == {
        "gas",
        "gas-scheduler-leader-election",
    }


# Each Kubernetes call `gas node` makes, and the RBAC rule it needs.
NODE_CALL_RULES = {
    "CoreV1Api.read_node": ("", "nodes", {"get"}),
    "CoreV1Api.patch_node": ("", "nodes", {"patch"}),
    "CoreV1Api.patch_node_status": ("", "nodes/status", {"patch"}),
    "CoreV1Api.list_pod_for_all_namespaces": ("", "pods", {"list", "watch"}),
    "CoreV1Api.read_namespaced_pod": ("", "pods", {"get"}),
    "CoreV1Api.patch_namespaced_pod": ("", "pods", {"patch"}),
    "CoreV1Api.create_namespaced_event": ("", "events", {"create"}),
    "CoreV1Api.patch_namespaced_event": ("", "events", {"patch"}),
    "CoreV1Api.create_namespaced_pod_eviction": ("", "pods/eviction", {"create"}),
}
# Granted ahead of the code: updating a repeated Event. Every other rule must be used by a
# call.
NODE_GRANTED_AHEAD = {"CoreV1Api.patch_namespaced_event"}
# The device plugin's calls, granted ahead too while gas/node/agent.py is not there yet.
DEVICE_PLUGIN_CALLS = {
    "CoreV1Api.list_pod_for_all_namespaces",
    "CoreV1Api.read_namespaced_pod",
    "CoreV1Api.patch_namespaced_pod",
    "CoreV1Api.create_namespaced_event",
}


def test_node_modules_are_those_gas_node_runs() -> None:
    modules = node_modules()
    assert {
        "gas.host.discovery",
        "gas.host.labels",
        "gas.node.capacity",
        "gas.node.publish",
        "gas.host.kubeapi",
        "gas.kubeapi.core",
    } <= set(modules)
    # The extender's and the operator commands' modules run under other credentials; the
    # HTTP server of its metrics port makes no API call.
    layers = {m.split(".")[1] for m in modules}
    assert layers <= {"node", "host", "kubeapi", "core", "httpserver"}, sorted(modules)


def test_node_rbac_grants_exactly_what_the_code_calls() -> None:
    calls = api_calls([path.read_text() for path in node_modules().values()])
    assert calls - set(NODE_CALL_RULES) == set(), "a new call needs a rule here and in deploy/"
    unused = set(NODE_CALL_RULES) - calls
    ahead = NODE_GRANTED_AHEAD | (set() if NODE_AGENT.is_file() else DEVICE_PLUGIN_CALLS)
    assert unused <= ahead, f"rules for calls gas node no longer makes: {unused}"
    needed: dict[tuple[str, str], set[str]] = {}
    for group, resource, verbs in NODE_CALL_RULES.values():
        needed.setdefault((group, resource), set()).update(verbs)
    assert granted_to("gas-node") == needed


def test_the_extender_and_the_agent_do_not_share_rights() -> None:
    """Each process has its own ServiceAccount: the extender cannot write nodes, and the
    agent cannot bind pods or read Leases."""
    extender, agent = granted_to("gas"), granted_to("gas-node")
    assert ("", "nodes/status") not in extender and "patch" not in extender[("", "nodes")]
    assert ("", "pods/binding") not in agent
    assert not any(group == "coordination.k8s.io" for group, _ in agent)


# ------------------------------------------------------------------ the node agent


def test_node_daemonset_runs_gas_node_with_what_it_needs() -> None:
    daemonset = find("DaemonSet", "gas-node")
    pod = daemonset["spec"]["template"]["spec"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert _selects(daemonset["spec"]["selector"]["matchLabels"], labels)
    assert pod["serviceAccountName"] == "gas-node"
    assert find("ServiceAccount", "gas-node")["metadata"]["namespace"] == NAMESPACE
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    (agent,) = pod["containers"]
    assert agent["args"][0] == "node"
    env = {
        e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in agent["env"]
    }
    assert env == {"NODE_NAME": "spec.nodeName", "MALLOC_ARENA_MAX": "2"}
    requests = agent["resources"]["requests"]
    assert requests["cpu"] and requests["memory"] and agent["resources"]["limits"]["memory"]

    # The host paths, each where gas node looks for it, read-only unless it writes there.
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert {path: volumes[m["name"]]["path"] for path, m in mounts.items()} == {
        "/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",
        "/sys": "/sys",
        "/run/udev": "/run/udev",
        "/host/proc": "/proc",
    }
    writable = {path for path, m in mounts.items() if not m.get("readOnly")}
    assert writable == {"/var/lib/kubelet/device-plugins"}

    # Root for the kubelet's root-owned sockets, but nothing more: no capability but the
    # one reading the host's processes needs (test_agents_read_the_hosts_processes_...),
    # no privilege, no writable root file system.
    security = agent["securityContext"]
    assert "privileged" not in security
    assert security["capabilities"] == {"add": ["SYS_PTRACE"], "drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def _matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for expression in term["matchExpressions"]:
        value = labels.get(expression["key"])
        if expression["operator"] == "In":
            if value not in expression["values"]:
                return False
        else:
            assert expression["operator"] == "NotIn", expression
            if value in expression["values"]:
                return False
    return True


def test_node_daemonset_lands_on_gpu_nodes_only() -> None:
    pod = find("DaemonSet", "gas-node")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]

    def schedulable(labels: dict[str, str]) -> bool:
        linux = _selects(pod["nodeSelector"], labels)
        return linux and any(_matches(term, labels) for term in terms)

    linux = {"kubernetes.io/os": "linux"}
    assert schedulable(linux | {"intel.feature.node.kubernetes.io/gpu": "true"})
    assert schedulable(linux | {"feature.node.kubernetes.io/pci-0300_8086.present": "true"})
    assert schedulable(linux | {"feature.node.kubernetes.io/pci-0380_8086.present": "true"})
    assert not schedulable(linux)
    assert not schedulable(linux | {"feature.node.kubernetes.io/pci-0300_10de.present": "true"})
    assert not schedulable({"intel.feature.node.kubernetes.io/gpu": "true"})
    # A node labelled for the DRA way runs gas dra instead (never both on one node).
    gpu = linux | {"intel.feature.node.kubernetes.io/gpu": "true"}
    assert not schedulable(gpu | {DRA_LABEL: "true"})
    assert schedulable(gpu | {DRA_LABEL: "false"})
    dra = find("DaemonSet", "gas-dra")["spec"]["template"]["spec"]
    assert _selects(dra["nodeSelector"], gpu | {DRA_LABEL: "true"})
    assert not _selects(dra["nodeSelector"], gpu)
    # A tainted GPU node still gets its agent.
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_node_daemonset_arguments_are_gas_node_flags() -> None:
    from gas.cli import COMMANDS, _go_style, build_parser

    if "node" not in COMMANDS:
        pytest.skip("this build has no `gas node` command yet")
    (agent,) = find("DaemonSet", "gas-node")["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(_go_style(agent["args"]))
    assert args.command == "node"
    # The port the manifest names is the one gas node serves its metrics on.
    (port,) = agent["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", args.metrics_port)


@pytest.mark.parametrize("name", ["gas-node", "gas-dra"])
def test_agents_read_the_hosts_processes_through_a_read_only_mount_and_sys_ptrace(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each agent reads the containers' GPU use from the host's /proc: mounted read-only
    where its --proc-root says, not by joining the host's PID namespace; and reading another
    process's fd/ and fdinfo/ is a ptrace read, so SYS_PTRACE, and no other capability."""
    from gas.cli import _go_style, build_parser

    pod = find("DaemonSet", name)["spec"]["template"]["spec"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    (agent,) = pod["containers"]
    monkeypatch.setenv("NODE_NAME", "node-1")
    args = build_parser().parse_args(_go_style(agent["args"]))
    assert args.usage_interval > 0
    volumes = {v["name"]: v for v in pod["volumes"]}
    (proc,) = [m for m in agent["volumeMounts"] if m["mountPath"] == args.proc_root]
    assert proc["readOnly"] is True
    assert volumes[proc["name"]]["hostPath"] == {"path": "/proc", "type": "Directory"}
    # The only mount of the host's /proc, and not over the container's own /proc.
    assert [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/proc"] == [
        volumes[proc["name"]]
    ]
    assert args.proc_root != "/proc"
    security = agent["securityContext"]
    assert security["capabilities"] == {"add": ["SYS_PTRACE"], "drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False and "privileged" not in security


# ------------------------------------------------------------------ the DRA driver

# Each Kubernetes call `gas dra` makes, and the RBAC rule it needs.
DRA_CALL_RULES = {
    "CoreV1Api.read_node": ("", "nodes", {"get"}),
    "CoreV1Api.list_node": ("", "nodes", {"list", "watch"}),
    "CoreV1Api.read_namespaced_pod": ("", "pods", {"get"}),
    "ResourceV1Api.list_resource_slice": ("resource.k8s.io", "resourceslices", {"list", "watch"}),
    "ResourceV1Api.create_resource_slice": ("resource.k8s.io", "resourceslices", {"create"}),
    "ResourceV1Api.replace_resource_slice": ("resource.k8s.io", "resourceslices", {"update"}),
    "ResourceV1Api.delete_resource_slice": ("resource.k8s.io", "resourceslices", {"delete"}),
    "ResourceV1Api.read_namespaced_resource_claim": ("resource.k8s.io", "resourceclaims", {"get"}),
    "ResourceV1Api.replace_namespaced_resource_claim_status": (
        "resource.k8s.io",
        "resourceclaims/status",
        {"update"},
    ),
    # The usage watch: the pods on its node, Events on those over their share, evictions.
    "CoreV1Api.list_pod_for_all_namespaces": ("", "pods", {"list", "watch"}),
    "CoreV1Api.create_namespaced_event": ("", "events", {"create"}),
    "CoreV1Api.patch_namespaced_event": ("", "events", {"patch"}),
    "CoreV1Api.create_namespaced_pod_eviction": ("", "pods/eviction", {"create"}),
}
# Granted ahead of the code, as to gas node: updating a repeated Event. Every other rule
# must be used by a call.
DRA_GRANTED_AHEAD = {"CoreV1Api.patch_namespaced_event"}
# What a write of a claim's status.devices needs besides its own rule (Kubernetes 1.36 and
# later): the driver's verb on its own entries, allowed on claims of its node only.
DRA_STATUS_WRITE = "ResourceV1Api.replace_namespaced_resource_claim_status"
DRA_DRIVER_RULE = {
    "apiGroups": ["resource.k8s.io"],
    "resources": ["resourceclaims/driver"],
    "resourceNames": [DRIVER],
    "verbs": ["associated-node:update"],
}


def dra_modules() -> dict[str, Path]:
    """Every gas module the `gas dra` process can run: its entry point `gas.dra.agent` and
    its imports, transitively."""
    return _follow({"gas.dra.agent"})


def test_dra_modules_are_those_gas_dra_runs() -> None:
    modules = dra_modules()
    assert {
        "gas.dra.agent",
        "gas.dra.claim_status",
        "gas.dra.preparer",
        "gas.dra.publish",
        "gas.host.kubeapi",
        "gas.kubeapi.core",
        "gas.kubeapi.dra",
        "gas.kubeapi.reflector",
    } <= set(modules)
    # The extender's, the webhook's and the operator commands' modules run under other
    # credentials; the HTTP server of its metrics port makes no API call.
    layers = {m.split(".")[1] for m in modules}
    assert layers <= {"dra", "host", "kubeapi", "core", "httpserver"}, sorted(modules)
    # Its calls go through gas/kubeapi/, as gas serve's and gas node's do.
    text = "\n".join(path.read_text() for path in modules.values())
    constructed = set(re.findall(r"\b([A-Z]\w*Api)\s*\(", text))
    assert constructed & set(API_CLASSES) == set()
    assert {"RawCoreV1Api", "RawResourceV1Api"} <= constructed


def test_dra_rbac_grants_exactly_what_the_code_calls() -> None:
    calls = api_calls([path.read_text() for path in dra_modules().values()])
    assert calls - set(DRA_CALL_RULES) == set(), "a new call needs a rule here and in deploy/"
    unused = set(DRA_CALL_RULES) - calls
    assert unused <= DRA_GRANTED_AHEAD, f"rules for calls gas dra no longer makes: {unused}"
    assert DRA_STATUS_WRITE in calls
    needed: dict[tuple[str, str], set[str]] = {}
    for group, resource, verbs in DRA_CALL_RULES.values():
        needed.setdefault((group, resource), set()).update(verbs)
    (group,) = DRA_DRIVER_RULE["apiGroups"]
    (resource,) = DRA_DRIVER_RULE["resources"]
    needed.setdefault((group, resource), set()).update(DRA_DRIVER_RULE["verbs"])
    assert granted_to("gas-dra") == needed
    # The driver's rule names the driver: a rule without the name would let gas dra write
    # every driver's entries.
    role = find("ClusterRole", "gas-dra")
    named = [rule for rule in role["rules"] if "resourceclaims/driver" in rule["resources"]]
    assert named == [DRA_DRIVER_RULE]
    assert bindings_of("gas-dra") == [("ClusterRole", None, "gas-dra")]


def test_dra_daemonset_surges_and_probes_its_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    from gas.cli import COMMANDS, _go_style, build_parser
    from gas.dra.metrics import LIVENESS_PATH
    from gas.dra.plugin import PROBE_TIMEOUT

    assert "dra" in COMMANDS
    daemonset = find("DaemonSet", "gas-dra")
    spec = daemonset["spec"]
    # The new pod serves beside the old one until it is ready: no node is left without its
    # driver (a DaemonSet that surges must keep maxUnavailable 0).
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "gas-dra"
    (driver,) = pod["containers"]
    env = {
        e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in driver["env"]
    }
    assert env == {
        "NODE_NAME": "spec.nodeName",
        "POD_UID": "metadata.uid",
        "MALLOC_ARENA_MAX": "2",
    }
    # The variables the manifest sets are those gas dra's flags read.
    monkeypatch.setenv("NODE_NAME", "node-1")
    monkeypatch.setenv("POD_UID", "pod-uid-1")
    args = build_parser().parse_args(_go_style(driver["args"]))
    assert args.command == "dra"
    assert (args.node_name, args.pod_uid) == ("node-1", "pod-uid-1")
    # The liveness answer is served on the metrics port, which the manifest names.
    (port,) = driver["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", args.metrics_port)
    probe = driver["livenessProbe"]
    assert probe["httpGet"] == {"path": LIVENESS_PATH, "port": "metrics"}
    # One probe calls two sockets, each for up to PROBE_TIMEOUT: the kubelet waits for its
    # answer, and probes no more often than one can take.
    assert probe["timeoutSeconds"] > 2 * PROBE_TIMEOUT
    assert probe["periodSeconds"] >= probe["timeoutSeconds"]
    assert probe["failureThreshold"] > 1
