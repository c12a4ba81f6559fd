"""gas's Helm chart (charts/gas) as the tests use it: rendered by the real helm, and the
objects it makes compared with deploy/'s."""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gas"
NAMESPACE = "gas-system"
RELEASE = "gas"

# What the chart adds to every object's labels beside deploy/'s own (its release's
# bookkeeping): left out when the two are compared.
RELEASE_LABELS = frozenset(
    {
        "helm.sh/chart",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/part-of",
        "app.kubernetes.io/version",
    }
)
# Pod template annotations that roll a workload when what it reads changes.
CHECKSUM_PREFIX = "checksum/"

# The ways of installing, as values of the chart, each with the deploy/ folders (and the
# webhook configuration, applied on its own there) that install the same objects.
WAYS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "any-cluster": ({}, ("any-cluster", "any-cluster/webhook-configuration.yaml")),
    "kubeadm": ({"scheduling": "kubeadm"}, (".",)),
    "kubeadm-webhook": (
        {"scheduling": "kubeadm", "kubeadm": {"validatingWebhook": True}},
        (".", "kubeadm-webhook", "kubeadm-webhook/webhook-configuration.yaml"),
    ),
    "kubeadm-labeler": (
        {"scheduling": "kubeadm", "nodeSide": "labeler"},
        (".", "labeler-daemonset.yaml", "-base/node-daemonset.yaml"),
    ),
    "dra": ({"scheduling": "none", "nodeSide": "none", "dra": {"enabled": True}}, ("dra",)),
    "dra-webhook": (
        {"scheduling": "none", "nodeSide": "none", "dra": {"enabled": True, "claimsWebhook": True}},
        ("dra", "dra-webhook", "dra-webhook/webhook-configuration.yaml"),
    ),
}


class HelmError(AssertionError):
    """helm refused: its message is the error."""


def helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    """An environment that keeps helm's caches and settings under `home`, and its cluster
    the one of `kubeconfig` (none: a file that does not exist, so nothing is reached)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}
    env.update(
        HOME=str(home),
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
        KUBECONFIG=str(kubeconfig or home / "no-kubeconfig"),
    )
    return env


def run_helm(
    helm: Path, args: Iterable[str], env: Mapping[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, env=dict(env), timeout=timeout
    )
    if result.returncode != 0:
        raise HelmError(f"helm {' '.join(args)}: {result.stderr.strip()}")
    return result


def values_args(values: Mapping[str, Any], home: Path) -> list[str]:
    """`--values FILE` for a values mapping (nested, as a values file holds it)."""
    if not values:
        return []
    home.mkdir(parents=True, exist_ok=True)
    path = home / f"values-{len(list(home.glob('values-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return ["--values", str(path)]


def template(
    helm: Path,
    home: Path,
    values: Mapping[str, Any] | None = None,
    *,
    kube_version: str = "1.37.2",
    api_versions: Iterable[str] = (),
    namespace: str = NAMESPACE,
    extra: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` of the chart, as objects."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace]
    args += ["--kube-version", kube_version]
    for api in api_versions:
        args += ["--api-versions", api]
    args += values_args(values or {}, home)
    args += list(extra)
    result = run_helm(helm, args, helm_env(home))
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def key(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])


def find(docs: Iterable[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [dict(d) for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


def _drop_empty(mapping: dict[str, Any], *names: str) -> None:
    for name in names:
        if name in mapping and not mapping[name]:
            del mapping[name]


def comparable(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The object without what only says which release made it: the chart's release labels,
    its checksum annotations, a caBundle (deploy/ ships webhook configurations without one)
    and the image pull policy the API server would default to the same. A ConfigMap's
    scheduler configuration is compared as YAML data (deploy/'s has comments)."""
    doc_ = copy.deepcopy(dict(doc))
    metadata = doc_["metadata"]
    for label in RELEASE_LABELS:
        metadata.get("labels", {}).pop(label, None)
    _drop_empty(metadata, "labels", "annotations")
    template_ = doc_.get("spec", {}).get("template")
    if isinstance(template_, dict):
        annotations = template_.get("metadata", {}).get("annotations", {})
        for name in [a for a in annotations if a.startswith(CHECKSUM_PREFIX)]:
            del annotations[name]
        _drop_empty(template_["metadata"], "annotations")
        for container in template_["spec"].get("containers", []):
            if container.get("imagePullPolicy") == "IfNotPresent":
                del container["imagePullPolicy"]
    for webhook in doc_.get("webhooks", []):
        webhook.get("clientConfig", {}).pop("caBundle", None)
    if doc_["kind"] == "ConfigMap" and "config.yaml" in doc_.get("data", {}):
        doc_["data"]["config.yaml"] = yaml.safe_load(doc_["data"]["config.yaml"])
    return doc_
