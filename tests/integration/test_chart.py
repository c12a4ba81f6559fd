"""charts/gas rendered by the real helm 3 and 4: the same objects as deploy/ for every way
of installing, its certificates, the kube-scheduler tag it takes from the cluster, the
values it refuses, and a package named for its version. The chart on a real API server:
test_chart_realk8s.py."""

from __future__ import annotations

import base64
import ipaddress
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import gas
from gas.core.model import PLACEMENT_POLICIES
from tests.integration import test_manifests as manifests
from tests.support import chart, helmtools

SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"


def deploy_objects(parts: tuple[str, ...]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What deploy/ installs for one way: kustomization folders as kustomize builds them,
    single files (a webhook configuration, applied on its own), less the objects of a
    file named with a leading "-" (a way that swaps one file for another). The Namespace
    is left out: helm installs into one (--create-namespace)."""
    docs: list[dict[str, Any]] = []
    dropped: set[tuple[str, str, str]] = set()
    for part in parts:
        if part.startswith("-"):
            dropped |= {chart.key(d) for d in manifests.load_all(manifests.DEPLOY / part[1:])}
            continue
        path = (manifests.DEPLOY / part).resolve()
        docs += manifests.way_documents(path) if path.is_dir() else manifests.load_all(path)
    return {
        chart.key(d): chart.comparable(d)
        for d in docs
        if d["kind"] != "Namespace" and chart.key(d) not in dropped
    }


def kube_version_of(way: str) -> str:
    # deploy/ pins kube-scheduler v1.28.7; the chart takes the tag from the cluster.
    return "1.34.1" if way.startswith("dra") else "1.28.7"


def test_lint_strict(helm: Path, tmp_path: Path) -> None:
    result = chart.run_helm(helm, ["lint", "--strict", str(chart.CHART)], chart.helm_env(tmp_path))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("way", sorted(chart.WAYS))
def test_each_way_renders_the_objects_deploy_installs(helm: Path, tmp_path: Path, way: str) -> None:
    """One source of truth: object by object, the chart and deploy/ agree (the chart adds
    only its Secrets, its release labels and checksum annotations), so every check
    deploy/ passes (least-privilege RBAC held to the code, check-config, the API schema,
    the images) holds for the chart too."""
    values, parts = chart.WAYS[way]
    rendered = chart.template(helm, tmp_path, values, kube_version=kube_version_of(way))
    got = {chart.key(d): chart.comparable(d) for d in rendered if d["kind"] != "Secret"}
    want = deploy_objects(parts)
    assert sorted(got) == sorted(want)
    for key in sorted(want):
        assert got[key] == want[key], key


def test_every_way_of_deploy_has_its_chart_values() -> None:
    covered = {
        (manifests.DEPLOY / part.lstrip("-")).resolve()
        for _, parts in chart.WAYS.values()
        for part in parts
    }
    for directory in manifests.KUSTOMIZATIONS:
        if directory in (manifests.BASE, manifests.NAMESPACE_DIR):
            continue  # parts of the others, not ways of their own
        assert directory.resolve() in covered, directory


def _rendered_image(docs: list[dict[str, Any]], container: str) -> str:
    deployment = chart.find(docs, "Deployment", "gas-scheduler")
    (found,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == container
    ]
    return str(found["image"])


@pytest.mark.parametrize(
    ("cluster", "tag"),
    [
        ("1.33.2-eks-0a1b2c3", "v1.33.2"),
        ("v1.30.14+k3s1", "v1.30.14"),
        ("1.37.2", "v1.37.2"),
        ("v1.31.0-gke.1234000", "v1.31.0"),
    ],
)
def test_kube_scheduler_tag_follows_the_cluster(
    helm: Path, tmp_path: Path, cluster: str, tag: str
) -> None:
    docs = chart.template(helm, tmp_path, kube_version=cluster)
    assert _rendered_image(docs, "kube-scheduler") == f"{SCHEDULER_IMAGE}:{tag}"


def test_a_cluster_without_a_version_stamp_installs_with_the_tag_set(
    helm: Path, tmp_path: Path
) -> None:
    values = {"scheduler": {"image": {"tag": "v1.28.7"}}, "dra": {"enabled": True}}
    values |= {"scheduling": "none", "nodeSide": "none"}
    assert chart.template(helm, tmp_path, values, kube_version="0.0.0-master+c8dcb00")
    docs = chart.template(
        helm, tmp_path, {"scheduler": {"image": {"tag": "v1.28.7"}}}, kube_version="0.0.0-master"
    )
    assert _rendered_image(docs, "kube-scheduler") == f"{SCHEDULER_IMAGE}:v1.28.7"


def test_kube_scheduler_tag_and_gas_image_can_be_set(helm: Path, tmp_path: Path) -> None:
    values = {
        "scheduler": {"image": {"tag": "v1.36.3"}},
        "image": {"repository": "registry.example/gas", "tag": "9.9.9"},
    }
    docs = chart.template(helm, tmp_path, values)
    assert _rendered_image(docs, "kube-scheduler") == f"{SCHEDULER_IMAGE}:v1.36.3"
    assert _rendered_image(docs, "gas") == "registry.example/gas:9.9.9"
    assert _rendered_image(docs, "webhook") == "registry.example/gas:9.9.9"


def _certificate(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def _secret_data(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    secret = chart.find(docs, "Secret", name)
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def _verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    public_key = ca.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    public_key.verify(
        cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
    )
    assert cert.issuer == ca.subject


def _names(cert: x509.Certificate) -> set[str]:
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*sans.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
    }


@pytest.mark.parametrize("namespace", ["gas-system", "gpu"])
def test_generated_certificates_share_one_ca_with_the_webhooks_ca_bundle(
    helm: Path, tmp_path: Path, namespace: str
) -> None:
    docs = chart.template(helm, tmp_path, namespace=namespace)
    gas_tls = _secret_data(docs, "gas-tls")
    webhook_tls = _secret_data(docs, "gas-webhook-tls")
    ca = _certificate(gas_tls["ca.crt"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    configuration = chart.find(docs, "MutatingWebhookConfiguration", "gas-webhook")
    (webhook,) = configuration["webhooks"]
    assert base64.b64decode(webhook["clientConfig"]["caBundle"]).decode() == gas_tls["ca.crt"]
    assert webhook_tls["ca.crt"] == gas_tls["ca.crt"]

    server = _certificate(gas_tls["tls.crt"])
    client = _certificate(gas_tls["client.crt"])
    webhook_cert = _certificate(webhook_tls["tls.crt"])
    for cert in (server, client, webhook_cert):
        _verify_signed_by(cert, ca)
    assert _names(server) == {
        f"gas-extender.{namespace}.svc",
        f"gas-extender.{namespace}.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    }
    assert ipaddress.ip_address("127.0.0.1") in x509.load_pem_x509_certificate(
        gas_tls["tls.crt"].encode()
    ).extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.IPAddress
    )
    assert _names(webhook_cert) >= {f"gas-webhook.{namespace}.svc"}
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-scheduler"
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    # The webhook never sees gas's own namespace or the control plane's.
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert set(expression["values"]) == {namespace, "kube-system"}


def test_kubeadm_keeps_the_schedulers_client_certificate_out_of_gas_pods(
    helm: Path, tmp_path: Path
) -> None:
    docs = chart.template(helm, tmp_path, {"scheduling": "kubeadm"})
    assert set(_secret_data(docs, "gas-tls")) == {"ca.crt", "tls.crt", "tls.key"}
    client = _secret_data(docs, "gas-scheduler-client")
    assert set(client) == {"ca.crt", "client.crt", "client.key"}
    _verify_signed_by(_certificate(client["client.crt"]), _certificate(client["ca.crt"]))


def test_cert_manager_issues_the_certificates_and_injects_the_ca(
    helm: Path, tmp_path: Path
) -> None:
    docs = chart.template(helm, tmp_path, {"certificates": {"source": "cert-manager"}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    certificates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    assert set(certificates) == {"gas-ca", "gas-tls", "gas-scheduler-client", "gas-webhook"}
    assert certificates["gas-ca"]["spec"]["isCA"] is True
    for name in ("gas-tls", "gas-scheduler-client", "gas-webhook"):
        assert certificates[name]["spec"]["issuerRef"] == {"name": "gas-ca", "kind": "Issuer"}
    assert "127.0.0.1" in certificates["gas-tls"]["spec"]["ipAddresses"]
    assert certificates["gas-webhook"]["spec"]["dnsNames"][0] == "gas-webhook.gas-system.svc"
    configuration = chart.find(docs, "MutatingWebhookConfiguration", "gas-webhook")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "gas-system/gas-webhook"
    }
    (webhook,) = configuration["webhooks"]
    assert "caBundle" not in webhook["clientConfig"]
    # kube-scheduler's files from the client Certificate's Secret, under the names its
    # configuration reads.
    pod = chart.find(docs, "Deployment", "gas-scheduler")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "scheduler-tls"]
    assert volume["secret"]["secretName"] == "gas-scheduler-client"
    assert {i["key"]: i["path"] for i in volume["secret"]["items"]} == {
        "ca.crt": "ca.crt",
        "tls.crt": "client.crt",
        "tls.key": "client.key",
    }


def test_cert_manager_with_an_issuer_of_the_operators(helm: Path, tmp_path: Path) -> None:
    issuer = {"name": "corporate", "kind": "ClusterIssuer"}
    values = {"certificates": {"source": "cert-manager", "certManager": {"issuerRef": issuer}}}
    docs = chart.template(helm, tmp_path, values)
    assert not [d for d in docs if d["kind"] == "Issuer"]
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    assert {d["metadata"]["name"] for d in certificates} == {
        "gas-tls",
        "gas-scheduler-client",
        "gas-webhook",
    }
    assert all(d["spec"]["issuerRef"] == issuer for d in certificates)


def test_existing_secrets_are_mounted_and_their_ca_is_the_bundle(
    helm: Path, tmp_path: Path
) -> None:
    bundle = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    values = {
        "certificates": {
            "source": "existing",
            "existing": {
                "gasSecret": "my-gas",
                "webhookSecret": "my-webhook",
                "caBundle": bundle.decode(),
            },
        }
    }
    docs = chart.template(helm, tmp_path, values)
    assert not [d for d in docs if d["kind"] in ("Secret", "Certificate")]
    pod = chart.find(docs, "Deployment", "gas-scheduler")["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"scheduler-tls": "my-gas", "gas-tls": "my-gas", "webhook-tls": "my-webhook"}
    (webhook,) = chart.find(docs, "MutatingWebhookConfiguration", "gas-webhook")["webhooks"]
    assert webhook["clientConfig"]["caBundle"] == bundle.decode()


def test_existing_secrets_without_a_ca_are_refused_with_what_to_do(
    helm: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        chart.HelmError, match=r"certificates\.existing\.caBundle.*gas-system/gas-tls"
    ):
        chart.template(helm, tmp_path, {"certificates": {"source": "existing"}})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"policy": "best-fit"}, r"policy.*(first-fit|must be one of)"),
        ({"scheduler": {"replicas": "two"}}, r"replicas"),
        ({"scheduling": "kube-adm"}, r"scheduling"),
        ({"webhook": {"failurePolicy": "fail"}}, r"failurePolicy"),
        ({"nodeSide": "device-plugins"}, r"nodeSide"),
        ({"polcy": "binpack"}, r"polcy"),
        ({"certificates": {"source": "vault"}}, r"source"),
        ({"scheduler": {"image": {"tag": "1.33.2"}}}, r"tag"),
        ({"dra": {"unhealthyTaintEffect": "Evict"}}, r"unhealthyTaintEffect"),
        ({"usage": {"overusePolicy": "kill"}}, r"overusePolicy"),
        ({"usage": {"interval": -1}}, r"interval"),
    ],
    ids=[
        "policy",
        "replicas-type",
        "scheduling",
        "failure-policy",
        "node-side",
        "unknown-key",
        "cert-source",
        "tag-without-v",
        "taint-effect",
        "overuse-policy",
        "negative-usage-interval",
    ],
)
def test_schema_refuses_wrong_values_naming_them(
    helm: Path, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(chart.HelmError, match=message):
        chart.template(helm, tmp_path, values)


def test_the_dra_taint_effect_reaches_gas_dra_as_its_flag(helm: Path, tmp_path: Path) -> None:
    from gas.cli import build_parser

    (deployed,) = manifests.find("DaemonSet", "gas-dra")["spec"]["template"]["spec"]["containers"]
    for effect, wanted in (("NoExecute", deployed["args"]), ("NoSchedule", None)):
        dra: dict[str, Any] = {"enabled": True, "unhealthyTaintEffect": effect}
        values = {"scheduling": "none", "nodeSide": "none", "dra": dra}
        (daemon,) = [d for d in chart.template(helm, tmp_path, values) if d["kind"] == "DaemonSet"]
        (container,) = daemon["spec"]["template"]["spec"]["containers"]
        if wanted is not None:
            assert container["args"] == wanted  # the default: deploy/dra's arguments
        parsed = build_parser().parse_args(container["args"])
        assert parsed.unhealthy_taint_effect == effect


# Both node agents, together: gas node (nodeSide: device-plugin) and gas dra.
BOTH_AGENTS: dict[str, Any] = {"dra": {"enabled": True}}


def _agents(helm: Path, tmp_path: Path, usage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each agent DaemonSet's pod spec, by command, rendered with these usage values."""
    docs = chart.template(helm, tmp_path, BOTH_AGENTS | {"usage": usage})
    pods = {
        name: chart.find(docs, "DaemonSet", f"gas-{name}")["spec"]["template"]["spec"]
        for name in ("node", "dra")
    }
    assert [c["args"][0] for p in pods.values() for c in p["containers"]] == ["node", "dra"]
    return pods


def _reads_host_proc(pod: dict[str, Any]) -> bool:
    """Whether the pod mounts the host's /proc and its one container may ptrace-read it."""
    (container,) = pod["containers"]
    volumes = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/proc"]
    mounts = [m for m in container["volumeMounts"] if m["name"] == "host-proc"]
    added = container["securityContext"]["capabilities"].get("add")
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert bool(volumes) == bool(mounts) == bool(added), (volumes, mounts, added)
    return bool(volumes)


def test_usage_interval_0_turns_off_the_reading_and_what_it_needs(
    helm: Path, tmp_path: Path
) -> None:
    from gas.cli import _go_style, build_parser

    for name, pod in _agents(helm, tmp_path, {"interval": 0}).items():
        (container,) = pod["containers"]
        assert not _reads_host_proc(pod), name
        assert "--usage-interval=0" in container["args"], name
        assert not [a for a in container["args"] if a.startswith("--proc-root")], name
        parsed = build_parser().parse_args(_go_style(container["args"]))
        assert parsed.command == name and parsed.usage_interval == 0, name


def test_usage_values_reach_both_agents_as_their_flags(helm: Path, tmp_path: Path) -> None:
    from gas.cli import _go_style, build_parser

    usage = {"interval": 2.5, "overusePolicy": "evict", "overuseGrace": 45}
    for name, pod in _agents(helm, tmp_path, usage).items():
        (container,) = pod["containers"]
        assert _reads_host_proc(pod), name
        assert "--overuse-policy=evict" in container["args"], name
        parsed = build_parser().parse_args(_go_style(container["args"]))
        assert parsed.command == name, name
        assert (parsed.usage_interval, parsed.overuse_policy, parsed.overuse_grace) == (
            2.5,
            "evict",
            45,
        ), name
        # --proc-root names where the host's /proc is mounted.
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "host-proc"]
        assert parsed.proc_root == mount["mountPath"], name
    # The defaults add no flag but --proc-root (deploy/'s arguments, held equal above).
    for name, pod in _agents(helm, tmp_path, {}).items():
        (container,) = pod["containers"]
        assert _reads_host_proc(pod), name
        usage_flags = ("--usage-interval", "--overuse-policy", "--overuse-grace")
        assert not [a for a in container["args"] if a.startswith(usage_flags)], name


def test_schema_policies_are_gas_serves() -> None:
    schema = yaml.safe_load((chart.CHART / "values.schema.json").read_text())
    assert tuple(schema["properties"]["policy"]["enum"]) == PLACEMENT_POLICIES


@pytest.mark.parametrize(
    ("values", "kube_version", "message"),
    [
        ({"dra": {"claimsWebhook": True}}, "1.37.2", "needs dra.enabled"),
        ({"dra": {"enabled": True, "claimsWebhook": True}}, "1.37.2", "needs scheduling: none"),
        ({"kubeadm": {"validatingWebhook": True}}, "1.37.2", "is for scheduling: kubeadm"),
        ({"dra": {"enabled": True}}, "1.33.4", "1.34 or later"),
        ({}, "1.27.3", "gas needs Kubernetes 1.28 or later"),
        ({"scheduling": "none", "nodeSide": "none"}, "1.37.2", "install nothing: pick a way"),
        # A build without a version stamp: kube-scheduler's tag cannot follow it.
        ({}, "0.0.0-master+c8dcb00", "set scheduler.image.tag"),
    ],
)
def test_combinations_that_cannot_work_are_refused(
    helm: Path, tmp_path: Path, values: dict[str, Any], kube_version: str, message: str
) -> None:
    with pytest.raises(chart.HelmError, match=re.escape(message)):
        chart.template(helm, tmp_path, values, kube_version=kube_version)


def test_values_reach_gas_serve_and_the_scheduler_configuration(helm: Path, tmp_path: Path) -> None:
    values = {
        "policy": "binpack",
        "allowlist": True,
        "logLevel": 4,
        "scheduler": {
            "prioritize": True,
            "replicas": 3,
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "priorityClassName": "system-cluster-critical",
        },
        "webhook": {"failurePolicy": "Ignore", "excludeNamespaces": ["batch"]},
    }
    docs = chart.template(helm, tmp_path, values)
    deployment = chart.find(docs, "Deployment", "gas-scheduler")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    (gas_container,) = [c for c in pod["containers"] if c["name"] == "gas"]
    assert {"--policy=binpack", "--enableAllowlist", "--v=4"} <= set(gas_container["args"])
    assert "--enableDenylist" not in gas_container["args"]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    config = yaml.safe_load(
        chart.find(docs, "ConfigMap", "gas-scheduler-config")["data"]["config.yaml"]
    )
    (extender,) = config["extenders"]
    assert extender["prioritizeVerb"] == "prioritize" and extender["weight"] == 1
    (webhook,) = chart.find(docs, "MutatingWebhookConfiguration", "gas-webhook")["webhooks"]
    assert webhook["failurePolicy"] == "Ignore"
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert set(expression["values"]) == {"gas-system", "kube-system", "batch"}


@pytest.mark.parametrize(
    ("level", "flag"), [(None, None), (0, "--v=0"), (4, "--v=4")], ids=["default", "0", "4"]
)
def test_log_level_reaches_gas_and_the_webhook_only_when_set(
    helm: Path, tmp_path: Path, level: int | None, flag: str | None
) -> None:
    values = {} if level is None else {"logLevel": level}
    pod = chart.find(chart.template(helm, tmp_path, values), "Deployment", "gas-scheduler")
    for container in pod["spec"]["template"]["spec"]["containers"][1:]:
        levels = [a for a in container["args"] if a.startswith("--v=")]
        assert levels == ([] if flag is None else [flag]), container["name"]


def test_a_changed_scheduler_configuration_rolls_the_scheduler_pods(
    helm: Path, tmp_path: Path
) -> None:
    def checksum(values: dict[str, Any]) -> str:
        docs = chart.template(helm, tmp_path, values)
        template = chart.find(docs, "Deployment", "gas-scheduler")["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/scheduler-config"])

    assert checksum({}) == checksum({"policy": "first-fit"})
    assert checksum({}) != checksum({"scheduler": {"prioritize": True}})


def test_service_monitors_only_where_their_crd_exists(helm: Path, tmp_path: Path) -> None:
    monitors = "monitoring.coreos.com/v1/ServiceMonitor"
    plain = chart.template(helm, tmp_path)
    assert not [d for d in plain if d["kind"] == "ServiceMonitor"]
    docs = chart.template(helm, tmp_path, api_versions=[monitors])
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceMonitor"} == {
        "gas-node",
        "gas-webhook",
    }
    kubeadm = chart.template(helm, tmp_path, {"scheduling": "kubeadm"}, api_versions=[monitors])
    extender = chart.find(kubeadm, "ServiceMonitor", "gas-extender")
    (endpoint,) = extender["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["cert"]["secret"] == {
        "name": "gas-scheduler-client",
        "key": "client.crt",
    }
    # Each monitor selects its own Service, and that Service has the port it scrapes.
    for monitor in [d for d in docs + kubeadm if d["kind"] == "ServiceMonitor"]:
        selector = monitor["spec"]["selector"]["matchLabels"]
        services = [
            d
            for d in (docs if monitor in docs else kubeadm)
            if d["kind"] == "Service"
            and selector.items() <= d["metadata"].get("labels", {}).items()
        ]
        assert len(services) == 1, monitor["metadata"]["name"]
        ports = {p["name"] for p in services[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    # gas certs' webhook Secret holds no ca.crt: with existing Secrets, the gas Secret's.
    existing = {"certificates": {"source": "existing", "existing": {"caBundle": "Zm9v"}}}
    mine = chart.template(helm, tmp_path, existing, api_versions=[monitors])
    (endpoint,) = chart.find(mine, "ServiceMonitor", "gas-webhook")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gas-tls", "key": "ca.crt"}
    off = {"metrics": {"serviceMonitor": {"enabled": False}}}
    assert not [
        d
        for d in chart.template(helm, tmp_path, off, api_versions=[monitors])
        if d["kind"] == "ServiceMonitor"
    ]


def test_notes_say_how_to_see_it_work(helm: Path, tmp_path: Path) -> None:
    if helmtools.version_of(helm).startswith("v3."):
        pytest.skip("helm 3's install --dry-run=client asks a cluster for its version")
    args = ["install", chart.RELEASE, str(chart.CHART), "--dry-run=client", "-n", "gas-system"]
    notes = chart.run_helm(helm, args, chart.helm_env(tmp_path)).stdout.split("NOTES:", 1)[1]
    assert "kubectl -n gas-system rollout status deployment/gas-scheduler" in notes
    assert "gpu.intel.com/i915" in notes and "kubectl gas" in notes
    kubeadm = chart.run_helm(
        helm, [*args, "--set", "scheduling=kubeadm"], chart.helm_env(tmp_path)
    ).stdout.split("NOTES:", 1)[1]
    assert "scripts/configure-scheduler.sh" in kubeadm
    assert "get secret gas-scheduler-client" in kubeadm
    assert "configure-scheduler.sh --revert" in kubeadm.split("Removing:", 1)[1]
    # The DRA way alone: a pod the extended-resource mapping serves, no extender's annotation.
    dra = ["--set", "scheduling=none", "--set", "nodeSide=none", "--set", "dra.enabled=true"]
    alone = chart.run_helm(helm, [*args, *dra], chart.helm_env(tmp_path)).stdout
    alone = alone.split("NOTES:", 1)[1]
    assert "rollout status daemonset/gas-dra" in alone
    assert "limits: {gpu.intel.com/i915: 1}" in alone and "memory.max" not in alone
    assert "gas-container-cards" not in alone and "kubectl get resourceclaims" in alone
    claims = chart.run_helm(
        helm, [*args, *dra, "--set", "dra.claimsWebhook=true"], chart.helm_env(tmp_path)
    ).stdout.split("NOTES:", 1)[1]
    assert "gpu.intel.com/memory.max: 1Gi" in claims and "gas-container-cards" not in claims


def test_chart_version_is_gas_version_and_packages_under_it(helm: Path, tmp_path: Path) -> None:
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert meta["version"] == gas.__version__
    assert meta["appVersion"] == gas.__version__
    out = tmp_path / "out"
    chart.run_helm(
        helm, ["package", str(chart.CHART), "--destination", str(out)], chart.helm_env(tmp_path)
    )
    (package,) = out.iterdir()
    assert package.name == f"gas-{gas.__version__}.tgz"
    with tarfile.open(package) as archive:
        names = set(archive.getnames())
    assert {"gas/Chart.yaml", "gas/values.yaml", "gas/values.schema.json"} <= names
    assert "gas/templates/NOTES.txt" in names


def test_rendered_scheduler_configuration_passes_check_config(helm: Path, tmp_path: Path) -> None:
    """`gas check-config` on what the chart renders, as on deploy/any-cluster: the profile,
    the Lease, gas on loopback, the TLS files and the image's version."""
    docs = chart.template(
        helm,
        tmp_path,
        {"policy": "spread", "scheduler": {"prioritize": True}},
        kube_version="1.30.4",
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(chart.find(docs, "ConfigMap", "gas-scheduler-config")))
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(yaml.safe_dump(chart.find(docs, "Deployment", "gas-scheduler")))
    gas_command = chart.ROOT / ".venv" / "bin" / "gas"

    def check(kubernetes: str) -> subprocess.CompletedProcess[str]:
        command = [str(gas_command), "check-config", str(config), str(deployment)]
        return subprocess.run(
            [*command, "--kubernetesVersion", kubernetes],
            capture_output=True,
            text=True,
            timeout=60,
        )

    result = check("1.30")
    assert result.returncode == 0, result.stdout + result.stderr
    # The tag followed the cluster it was rendered for: on an older one it is refused.
    older = check("1.29")
    assert older.returncode == 1 and "newer than the cluster" in older.stdout, older.stdout


def _install_commands(text: str) -> list[list[str]]:
    """The `helm install gas charts/gas ...` commands of a document, one per line."""
    text = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("helm install gas charts/gas"):
            commands.append(line.replace("REGISTRY", "registry.example").split()[3:])
    return commands


@pytest.mark.parametrize("document", ["README.md", "docs/helm.md"])
def test_the_documented_install_commands_render(helm: Path, tmp_path: Path, document: str) -> None:
    """Every `helm install` the docs give names values the chart has, and renders."""
    commands = _install_commands((chart.ROOT / document).read_text())
    assert len(commands) == 3, commands
    for args in commands:
        rendered = chart.run_helm(
            helm,
            ["template", "gas", str(chart.CHART), *args[1:], "--kube-version", "1.37.2"],
            chart.helm_env(tmp_path),
        ).stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        images = {
            c["image"]
            for d in docs
            if d["kind"] in ("Deployment", "DaemonSet")
            for c in d["spec"]["template"]["spec"]["containers"]
            if c["name"] != "kube-scheduler"
        }
        assert images == {f"registry.example/gas:{gas.__version__}"}, args
