"""charts/gas installed, upgraded and uninstalled by the real helm (3 and 4) on a real
kube-apiserver (1.28 and 1.37): what helm really does with the chart's `lookup`s, its
generated certificates and its cluster-scoped objects.

One control plane per Kubernetes version serves every test of the module; each test
installs release `gas` (the chart's cluster-scoped objects have fixed names, so one release
at a time) and leaves nothing behind: a test uninstalls what it installed, and its fixture
removes whatever a failed test left. There is no kubelet and no kube-controller-manager:
Deployments make no pods, which helm without --wait does not wait for.

The 1.28 binaries carry no version stamp (../shared/k8s/README.md: built from the v1.28.7
source, they say v0.0.0-master+c8dcb00...), which helm refuses against the chart's
kubeVersion. helm reaches that API server through `VersionStamp`, a loopback pass-through
that answers /version with the release the binaries were built from (v1.28.7, the build's
commit kept as build metadata: a suffix the chart must drop) and relays everything else
unchanged to the real API server.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import http.client
import http.server
import itertools
import json
import re
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes.client.exceptions import ApiException

from tests.support import chart, helmtools, realk8s

pytestmark = [pytest.mark.timeout(90)]

RELEASE = chart.RELEASE
NAMESPACE = chart.NAMESPACE
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
# The release the unstamped 1.28 binaries were built from (../shared/k8s/README.md).
UNSTAMPED_SOURCE = {"1.28": ("1", "28", "v1.28.7")}
UNSTAMPED_PREFIX = "v0.0.0-"
DRA_REFUSAL = "dra.enabled needs Kubernetes 1.34 or later"


# ------------------------------------------------------------------ the API server


def _request(
    api: Any,
    method: str,
    path: str,
    query: Mapping[str, str] | None = None,
    body: Mapping[str, Any] | None = None,
) -> Any:
    """One call through the official client's `ApiClient` (as gas.kubeapi.core makes
    them): the decoded JSON answer; a status outside 2xx raises `ApiException`."""
    request = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=list((query or {}).items()),
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=dict(body) if body is not None else None,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request, _request_timeout=30)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(status=response.status, reason=f"{method} {path}: {data[:500]!r}")
    return json.loads(data or b"null")


@dataclass(frozen=True)
class Resource:
    path: str  # /api/v1 or /apis/GROUP/VERSION
    name: str  # secrets
    namespaced: bool

    def object_path(self, namespace: str, name: str) -> str:
        where = f"/namespaces/{namespace}" if self.namespaced else ""
        return f"{self.path}{where}/{self.name}/{name}"


@dataclass
class Cluster:
    """A real API server as the tests read it (the admin, through the official client),
    and the kubeconfig helm reaches it with."""

    plane: realk8s.ControlPlane
    api: Any
    helm_kubeconfig: Path
    # /version as helm reads it.
    version: dict[str, str]
    # Every resource of every served group version, by (apiVersion, kind).
    kinds: dict[tuple[str, str], Resource] = field(default_factory=dict)
    # The listable resources, one version per group: where a label selector finds anything.
    listable: list[Resource] = field(default_factory=list)

    def discover(self) -> None:
        versions = [("v1", "/api/v1", True)]
        for group in _request(self.api, "GET", "/apis")["groups"]:
            preferred = group["preferredVersion"]["groupVersion"]
            for version in group["versions"]:
                group_version = version["groupVersion"]
                versions.append(
                    (group_version, f"/apis/{group_version}", group_version == preferred)
                )
        for group_version, path, preferred in versions:
            for found in _request(self.api, "GET", path)["resources"]:
                if "/" in found["name"]:  # a subresource
                    continue
                resource = Resource(path, found["name"], found["namespaced"])
                self.kinds[group_version, found["kind"]] = resource
                if preferred and "list" in found["verbs"]:
                    self.listable.append(resource)

    def get(self, path: str) -> Any:
        """The object at `path`, or None when there is none."""
        try:
            return _request(self.api, "GET", path)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        found = self.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if found is None:
            return None
        return {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}

    def secret_names(self, namespace: str) -> set[str]:
        listed = _request(self.api, "GET", f"/api/v1/namespaces/{namespace}/secrets")
        return {item["metadata"]["name"] for item in listed["items"]}

    def namespace_exists(self, namespace: str) -> bool:
        return self.get(f"/api/v1/namespaces/{namespace}") is not None

    def labelled(self, selector: str = INSTANCE) -> set[str]:
        """Every object of every listable kind, in every namespace and none, whose labels
        match `selector`, as "Kind namespace/name"."""
        return set(self.labelled_paths(selector))

    def labelled_paths(self, selector: str = INSTANCE) -> dict[str, str]:
        """`labelled`'s objects, each with its path."""

        def listed(resource: Resource) -> tuple[Resource, Any]:
            path = f"{resource.path}/{resource.name}"
            return resource, _request(self.api, "GET", path, {"labelSelector": selector})

        found: dict[str, str] = {}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for resource, answer in pool.map(listed, self.listable):
                kind = answer["kind"].removesuffix("List")
                for item in answer["items"]:
                    metadata = item["metadata"]
                    namespace = metadata.get("namespace", "")
                    key = f"{kind} {namespace}/{metadata['name']}"
                    found[key] = resource.object_path(namespace, metadata["name"])
        return found

    def present(self, docs: list[dict[str, Any]]) -> list[str]:
        """Which of the objects `docs` names exist on the API server."""
        return [_key(doc) for doc in docs if self.get(self.path_of(doc)) is not None]

    def path_of(self, doc: Mapping[str, Any]) -> str:
        resource = self.kinds[doc["apiVersion"], doc["kind"]]
        metadata = doc["metadata"]
        return resource.object_path(metadata.get("namespace", ""), metadata["name"])

    def webhook_configuration(self, kind: str = "Mutating") -> Any:
        return self.get(
            f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}webhookconfigurations/gas-webhook"
        )


def _key(doc: Mapping[str, Any]) -> str:
    metadata = doc["metadata"]
    return f"{doc['kind']} {metadata.get('namespace', '')}/{metadata['name']}"


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


class _Relay(http.server.BaseHTTPRequestHandler):
    """Relays a request to the real API server as its admin; stamps /version."""

    protocol_version = "HTTP/1.1"
    server: VersionStamp
    # Headers of one hop, not to be passed on (and Accept-Encoding: /version is rewritten).
    HOP = frozenset(
        {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host"}
        | {"proxy-connection", "accept-encoding", "content-length"}
    )

    # Small answers go out at once (Nagle's algorithm would hold each for the client's
    # delayed ACK).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        # One connection to the API server for each connection of the client.
        self.upstream = self.server.connect()

    def finish(self) -> None:
        self.upstream.close()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def ask(self, body: bytes | None, headers: dict[str, str]) -> http.client.HTTPResponse:
        try:
            self.upstream.request(self.command, self.path, body=body, headers=headers)
            return self.upstream.getresponse()
        except ConnectionError:  # RemoteDisconnected among them
            # The API server closed the idle connection: once more on a new one.
            self.upstream.close()
            self.upstream = self.server.connect()
            self.upstream.request(self.command, self.path, body=body, headers=headers)
            return self.upstream.getresponse()

    def relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self.HOP}
        answer = self.ask(body, headers)
        self.send_response_only(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in self.HOP:
                self.send_header(name, value)
        if self.command == "HEAD" or answer.status in (204, 304):  # no body
            answer.read()
            self.end_headers()
            return
        if answer.getheader("Content-Length") is None:  # a watch: pass it on as it comes
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := answer.read1(1 << 16):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
            return
        data = answer.read()
        if urllib.parse.urlsplit(self.path).path == "/version" and answer.status == 200:
            data = self.server.stamp(data)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = relay


class VersionStamp(http.server.ThreadingHTTPServer):
    """A loopback pass-through to an unstamped API server (plain HTTP in, the admin's TLS
    out) whose /version says the release the binaries were built from."""

    daemon_threads = True

    def __init__(self, plane: realk8s.ControlPlane, major: str, minor: str, release: str):
        super().__init__(("127.0.0.1", 0), _Relay)
        self.plane = plane
        self.context = plane.admin_ssl_context()
        self.major, self.minor, self.release = major, minor, release

    def connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.plane.port, context=self.context, timeout=60
        )

    def stamp(self, data: bytes) -> bytes:
        version = json.loads(data)
        unstamped: str = version["gitVersion"]
        assert unstamped.startswith(UNSTAMPED_PREFIX), unstamped
        commit = unstamped.partition("+")[2][:12]
        version.update(major=self.major, minor=self.minor, gitVersion=f"{self.release}+{commit}")
        return json.dumps(version).encode()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for a loopback endpoint that needs no credentials of its client."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stamped", "cluster": {"server": server}}],
                "users": [{"name": "admin", "user": {}}],
                "contexts": [
                    {"name": "stamped", "context": {"cluster": "stamped", "user": "admin"}}
                ],
                "current-context": "stamped",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, k8s: realk8s.Release) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp(f"chart-{k8s.id}")
    with (
        realk8s.ControlPlane(workdir / "plane", version=k8s.version) as plane,
        contextlib.ExitStack() as stack,
    ):
        api = plane.client()
        stack.callback(api.close)
        real = _request(api, "GET", "/version")
        kubeconfig = Path(plane.admin_kubeconfig)
        if real["gitVersion"].startswith(UNSTAMPED_PREFIX):
            stamp = VersionStamp(plane, *UNSTAMPED_SOURCE[k8s.version])
            stack.callback(stamp.server_close)
            threading.Thread(target=stamp.serve_forever, daemon=True).start()
            stack.callback(stamp.shutdown)
            kubeconfig = _write_kubeconfig(workdir / "stamped.kubeconfig", stamp.url)
        found = Cluster(plane, api, kubeconfig, {})
        found.discover()
        # /version as helm reads it, through its own kubeconfig.
        helm_api = plane.client(str(kubeconfig))
        stack.callback(helm_api.close)
        found.version = _request(helm_api, "GET", "/version")
        yield found


# ------------------------------------------------------------------------- helm


_NAMESPACES = itertools.count()


@functools.cache
def _major(binary: Path) -> int:
    return int(helmtools.version_of(binary).lstrip("v").split(".")[0])


class Helm:
    """The real helm on the cluster. What a test installed and did not uninstall is
    uninstalled at its end, and whatever else of the release is left removed: the next test
    (the other helm's among them) starts on a cluster without it."""

    def __init__(self, binary: Path, cluster: Cluster, home: Path) -> None:
        self.binary = binary
        self.cluster = cluster
        self.home = home
        self.env = chart.helm_env(home, cluster.helm_kubeconfig)
        # Where the release may be installed.
        self.installed: set[str] = set()
        self.major = _major(binary)

    def fresh_namespace(self, what: str) -> str:
        return f"gas-{what}-h{self.major}-{next(_NAMESPACES)}"

    def __call__(self, *args: str) -> str:
        return chart.run_helm(self.binary, args, self.env, timeout=120).stdout

    def install_args(
        self, namespace: str, values: Mapping[str, Any] | None = None, *extra: str
    ) -> list[str]:
        args = ["install", RELEASE, str(chart.CHART), "-n", namespace, "--create-namespace"]
        return args + chart.values_args(values or {}, self.home / "values") + list(extra)

    def install(self, namespace: str, values: Mapping[str, Any] | None = None, *extra: str) -> str:
        self.installed.add(namespace)
        return self(*self.install_args(namespace, values, *extra))

    def refused_install(
        self, namespace: str, values: Mapping[str, Any] | None = None, *extra: str
    ) -> str:
        """helm's error for an install that must fail."""
        fresh = namespace not in self.installed
        with pytest.raises(chart.HelmError) as refused:
            self.install(namespace, values, *extra)
        if fresh:
            self.installed.discard(namespace)
        return str(refused.value)

    def dry_run(
        self, namespace: str, values: Mapping[str, Any] | None = None, *extra: str
    ) -> list[dict[str, Any]]:
        """`helm install --dry-run=server`'s manifest."""
        args = self.install_args(namespace, values, "--dry-run=server", "-o", "json", *extra)
        release = json.loads(self(*args))
        return _docs(release["manifest"])

    def upgrade(self, namespace: str, *extra: str) -> str:
        return self("upgrade", RELEASE, str(chart.CHART), "-n", namespace, *extra)

    def manifest(self, namespace: str) -> list[dict[str, Any]]:
        return _docs(self("get", "manifest", RELEASE, "-n", namespace))

    def releases(self, namespace: str) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = json.loads(self("list", "-n", namespace, "-o", "json"))
        return listed

    def uninstall(self, namespace: str) -> str:
        out = self("uninstall", RELEASE, "-n", namespace)
        self.installed.discard(namespace)
        return out

    def clean_up(self) -> None:
        for namespace in sorted(self.installed):
            self("uninstall", RELEASE, "-n", namespace, "--ignore-not-found")
        for path in self.cluster.labelled_paths().values():
            with contextlib.suppress(ApiException):
                _request(self.cluster.api, "DELETE", path)


# `cluster` before `helm`: pytest then orders the tests by Kubernetes version first, and
# each version's control plane starts once for both helms.
@pytest.fixture
def helm_cli(cluster: Cluster, helm: Path, tmp_path: Path) -> Iterator[Helm]:
    runner = Helm(helm, cluster, tmp_path / "helm-home")
    try:
        yield runner
    finally:
        runner.clean_up()


# ------------------------------------------------------------------ what is checked


def _certificate(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """The certificate's DNS names and IP addresses."""
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName), [
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    ]


def _same_key(cert: x509.Certificate, key_pem: bytes) -> bool:
    key = serialization.load_pem_private_key(key_pem, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return key.public_key().public_bytes(der, spki) == cert.public_key().public_bytes(der, spki)


def _container(deployment: Mapping[str, Any], name: str) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == name]
    assert len(found) == 1, f"{deployment['metadata']['name']}: {len(found)} containers {name}"
    return dict(found[0])


def _expected_scheduler_tag(version: Mapping[str, str]) -> str:
    """The API server's version, vendor suffix dropped; it must be the major and minor
    the server reports in their own fields."""
    matched = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version["gitVersion"])
    assert matched is not None, version
    assert matched.group(1, 2) == (version["major"], version["minor"].rstrip("+")), version
    return "v" + ".".join(matched.groups())


@dataclass(frozen=True)
class Snapshot:
    secrets: dict[str, dict[str, bytes]]
    generations: dict[str, int]
    ca_bundle: str


def _snapshot_parts(
    cluster: Cluster, namespace: str
) -> tuple[dict[str, dict[str, bytes]], dict[str, int]]:
    """The chart's Secrets' data (not helm's release records) and each workload's
    generation."""
    secrets: dict[str, dict[str, bytes]] = {}
    for name in cluster.secret_names(namespace):
        if not name.startswith(f"sh.helm.release.v1.{RELEASE}."):
            data = cluster.secret(namespace, name)
            assert data is not None
            secrets[name] = data
    generations: dict[str, int] = {}
    for kind in ("deployments", "daemonsets"):
        listed = _request(cluster.api, "GET", f"/apis/apps/v1/namespaces/{namespace}/{kind}")
        for item in listed["items"]:
            generations[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["generation"]
    return secrets, generations


def _snapshot(cluster: Cluster, namespace: str) -> Snapshot:
    """The chart's Secrets (not helm's release records), each workload's generation, and
    the webhook configuration's caBundle."""
    secrets, generations = _snapshot_parts(cluster, namespace)
    webhook = cluster.webhook_configuration()
    assert webhook is not None
    return Snapshot(secrets, generations, webhook["webhooks"][0]["clientConfig"]["caBundle"])


def _secrets_and_generations(cluster: Cluster, namespace: str) -> tuple[Any, Any]:
    """The chart's Secrets' data and each workload's generation, for any way (with or
    without a webhook configuration), and every webhook configuration's caBundles."""
    bundles = []
    for kind in ("Mutating", "Validating"):
        found = cluster.webhook_configuration(kind)
        if found is not None:
            bundles += [w["clientConfig"].get("caBundle") for w in found["webhooks"]]
    snapshot = _snapshot_parts(cluster, namespace)
    return snapshot, bundles


def _nothing_created(cluster: Cluster, namespace: str) -> None:
    """No object of the release anywhere, and no release record (helm keeps them as Secrets
    of the release's namespace)."""
    assert cluster.labelled() == set()
    if cluster.namespace_exists(namespace):
        assert cluster.secret_names(namespace) == set()


# ------------------------------------------------------------------------ tests


def test_install_dry_runs_then_installs_with_generated_certificates(
    helm_cli: Helm, cluster: Cluster
) -> None:
    existed = cluster.namespace_exists(NAMESPACE)
    previewed = helm_cli.dry_run(NAMESPACE)
    # The server-side dry run rendered with the cluster (its lookups, its version) and
    # created nothing: no object, no release record, no namespace.
    assert cluster.labelled() == set()
    assert cluster.present(previewed) == []
    assert cluster.namespace_exists(NAMESPACE) == existed
    if existed:
        assert cluster.secret_names(NAMESPACE) == set()

    helm_cli.install(NAMESPACE)
    installed = helm_cli.manifest(NAMESPACE)
    assert sorted(map(_key, installed)) == sorted(map(_key, previewed))
    assert cluster.present(installed) == [_key(d) for d in installed]
    assert cluster.labelled() == {_key(d) for d in installed}
    assert [r["status"] for r in helm_cli.releases(NAMESPACE)] == ["deployed"]

    gas_tls = cluster.secret(NAMESPACE, "gas-tls")
    webhook_tls = cluster.secret(NAMESPACE, "gas-webhook-tls")
    assert gas_tls is not None and webhook_tls is not None
    webhook = cluster.webhook_configuration()
    assert webhook is not None
    client_config = webhook["webhooks"][0]["clientConfig"]
    ca_pem = gas_tls["ca.crt"]
    assert base64.b64decode(client_config["caBundle"]) == ca_pem
    assert webhook_tls["ca.crt"] == ca_pem
    ca = _certificate(ca_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server = _certificate(gas_tls["tls.crt"])
    webhook_cert = _certificate(webhook_tls["tls.crt"])
    for cert in (server, webhook_cert, _certificate(gas_tls["client.crt"])):
        cert.verify_directly_issued_by(ca)
    assert _same_key(server, gas_tls["tls.key"])
    assert _same_key(webhook_cert, webhook_tls["tls.key"])
    assert _same_key(_certificate(gas_tls["client.crt"]), gas_tls["client.key"])
    dns, ips = _names(server)
    assert "127.0.0.1" in ips
    assert f"gas-extender.{NAMESPACE}.svc" in dns
    # The name the API server calls the webhook by: its Service's.
    service = client_config["service"]
    assert (service["name"], service["namespace"]) == ("gas-webhook", NAMESPACE)
    assert f"gas-webhook.{NAMESPACE}.svc" in _names(webhook_cert)[0]

    deployment = cluster.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gas-scheduler")
    image = _container(deployment, "kube-scheduler")["image"]
    tag = _expected_scheduler_tag(cluster.version)
    assert image == f"registry.k8s.io/kube-scheduler:{tag}"


def test_upgrade_keeps_certificates_and_changes_only_what_values_change(
    helm_cli: Helm, cluster: Cluster
) -> None:
    helm_cli.install(NAMESPACE)
    installed = _snapshot(cluster, NAMESPACE)
    assert set(installed.secrets) == {"gas-tls", "gas-webhook-tls"}
    assert {"deployments/gas-scheduler", "daemonsets/gas-node"} <= set(installed.generations)

    # Unchanged values: the certificates are read back (lookup), nothing else moves.
    helm_cli.upgrade(NAMESPACE)
    assert [str(r["revision"]) for r in helm_cli.releases(NAMESPACE)] == ["2"]
    assert _snapshot(cluster, NAMESPACE) == installed

    helm_cli.upgrade(NAMESPACE, "--set", "policy=binpack")
    changed = _snapshot(cluster, NAMESPACE)
    assert changed.secrets == installed.secrets
    assert changed.ca_bundle == installed.ca_bundle
    scheduler = "deployments/gas-scheduler"
    assert changed.generations[scheduler] > installed.generations[scheduler]
    unchanged = {k: v for k, v in installed.generations.items() if k != scheduler}
    assert {k: changed.generations[k] for k in unchanged} == unchanged
    deployment = cluster.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gas-scheduler")
    assert "--policy=binpack" in _container(deployment, "gas")["args"]


def test_uninstall_leaves_nothing_of_the_release(helm_cli: Helm, cluster: Cluster) -> None:
    helm_cli.install(NAMESPACE)
    installed = helm_cli.manifest(NAMESPACE)
    keys = {_key(d) for d in installed}
    # What the checks below look for is there before: found by label and by name.
    assert cluster.labelled() == keys
    assert {
        "ClusterRole /gas",
        "ClusterRoleBinding /gas-scheduler",
        "MutatingWebhookConfiguration /gas-webhook",
        "RoleBinding kube-system/gas-scheduler-authentication-reader",
    } <= keys
    assert cluster.secret_names(NAMESPACE) >= {"gas-tls", "gas-webhook-tls"}

    helm_cli.uninstall(NAMESPACE)
    assert cluster.webhook_configuration("Mutating") is None
    assert cluster.webhook_configuration("Validating") is None
    assert cluster.labelled() == set()
    assert cluster.present(installed) == []
    rolebindings = "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings"
    assert cluster.get(f"{rolebindings}/gas-scheduler-authentication-reader") is None
    assert cluster.secret_names(NAMESPACE) == set()
    assert helm_cli.releases(NAMESPACE) == []


def _needs_dra(values: Mapping[str, Any]) -> bool:
    return bool(values.get("dra", {}).get("enabled"))


def _before_1_34(version: Mapping[str, str]) -> bool:
    return (int(version["major"]), int(version["minor"].rstrip("+"))) < (1, 34)


# The any-cluster way is the chart's default, which the tests above install, upgrade and
# uninstall.
@pytest.mark.parametrize("way", [way for way in chart.WAYS if way != "any-cluster"])
def test_each_way_installs_and_uninstalls_cleanly(
    helm_cli: Helm, cluster: Cluster, way: str
) -> None:
    """Every way of chart.WAYS: a server-side dry run creates nothing, the install creates
    what it previewed, the uninstall removes it all. The DRA ways, on a cluster older than
    1.34, are refused with the chart's message before anything is created."""
    values, _ = chart.WAYS[way]
    namespace = helm_cli.fresh_namespace(way)
    if _needs_dra(values) and _before_1_34(cluster.version):
        for extra in (["--dry-run=server"], []):
            refused = helm_cli.refused_install(namespace, values, *extra)
            assert DRA_REFUSAL in refused
            assert f"this cluster is {cluster.version['gitVersion']}" in refused
        _nothing_created(cluster, namespace)
        return

    previewed = helm_cli.dry_run(namespace, values)
    assert cluster.labelled() == set()
    assert cluster.present(previewed) == []

    helm_cli.install(namespace, values)
    installed = helm_cli.manifest(namespace)
    keys = {_key(d) for d in installed}
    assert sorted(map(_key, installed)) == sorted(map(_key, previewed))
    assert cluster.labelled() == keys
    cluster_scoped = [
        d for d in installed if not cluster.kinds[d["apiVersion"], d["kind"]].namespaced
    ]
    assert cluster_scoped, "every way has cluster-scoped objects (its roles at least)"
    if _needs_dra(values):
        assert "DeviceClass /gpu.gas.intel.com" in keys

    # The same values again: every certificate read back (the kubeadm way's copies on the
    # control-plane nodes, the claims webhook's caBundle stay valid), no workload rolled.
    before = _secrets_and_generations(cluster, namespace)
    helm_cli.upgrade(namespace, *chart.values_args(values, helm_cli.home / "values"))
    assert _secrets_and_generations(cluster, namespace) == before

    helm_cli.uninstall(namespace)
    assert cluster.labelled() == set()
    assert cluster.present(installed) == []
    assert cluster.secret_names(namespace) == set()


def test_cert_manager_certificates_need_cert_managers_kinds(
    helm_cli: Helm, cluster: Cluster
) -> None:
    namespace = helm_cli.fresh_namespace("cert-manager")
    refused = helm_cli.refused_install(namespace, {"certificates": {"source": "cert-manager"}})
    for kind in ("Issuer", "Certificate"):
        assert f'no matches for kind "{kind}" in version "cert-manager.io/v1"' in refused
    _nothing_created(cluster, namespace)


def test_existing_certificates_are_required_then_used(
    helm_cli: Helm, cluster: Cluster, tmp_path: Path
) -> None:
    namespace = helm_cli.fresh_namespace("existing")
    values = {"certificates": {"source": "existing"}}
    refused = helm_cli.refused_install(namespace, values)
    assert f"create Secret {namespace}/gas-tls with ca.crt first" in refused
    _nothing_created(cluster, namespace)

    out = tmp_path / "certs"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gas.cli",
            "certs",
            "--out",
            str(out),
            "--dns",
            f"gas-extender.{namespace}.svc",
            "--webhookNamespace",
            namespace,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )

    def b64(name: str) -> str:
        return base64.b64encode((out / name).read_bytes()).decode()

    if not cluster.namespace_exists(namespace):
        _request(cluster.api, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    made = {
        "gas-tls": {
            name: b64(name) for name in ("ca.crt", "tls.crt", "tls.key", "client.crt", "client.key")
        },
        "gas-webhook-tls": {"tls.crt": b64("webhook.crt"), "tls.key": b64("webhook.key")},
    }
    for name, data in made.items():
        _request(
            cluster.api,
            "POST",
            f"/api/v1/namespaces/{namespace}/secrets",
            body={"metadata": {"name": name}, "data": data},
        )

    helm_cli.install(namespace, values)
    installed = helm_cli.manifest(namespace)
    # The chart made no Secret: its pods mount those made here.
    assert [d for d in installed if d["kind"] == "Secret"] == []
    webhook = cluster.webhook_configuration()
    assert webhook is not None
    ca_bundle = webhook["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(ca_bundle) == (out / "ca.crt").read_bytes()
    deployment = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/gas-scheduler")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {v["secret"]["secretName"] for v in volumes if "secret" in v} == set(made)

    helm_cli.uninstall(namespace)
    assert cluster.labelled() == set()
    # The Secrets are the operator's, not the release's: they stay.
    assert cluster.secret_names(namespace) == set(made)
