"""`gas certs`: the files it writes form a working PKI for gas and kube-scheduler, proven
with certificate verification and a real mutual-TLS handshake against `gas serve`."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml
from cryptography import x509
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from gas import cli
from gas.serving import tls
from gas.tools.certs import DEFAULT_DNS, FILE_NAMES
from gas.tools.webhook_config import webhook_configuration
from tests.support import realk8s
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.webhookproc import WebhookProcess

KEYS = ("ca.key", "tls.key", "client.key", "webhook.key")
CERTS = ("ca.crt", "tls.crt", "client.crt", "webhook.crt")
WEBHOOK_DNS = ("gas-webhook.gas-system.svc", "gas-webhook.gas-system.svc.cluster.local")


def run_certs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(["certs", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def load(directory: Path, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate((directory / name).read_bytes())


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One default run (plus --ip 127.0.0.1 for the handshake tests), shared by the checks."""
    out = tmp_path_factory.mktemp("certs") / "out"
    assert cli.main(["certs", "--out", str(out), "--ip", "127.0.0.1"]) == 0
    return out


def test_writes_every_file_with_private_keys_0600(generated: Path) -> None:
    assert sorted(p.name for p in generated.iterdir()) == sorted(FILE_NAMES)
    for name in KEYS:
        assert stat.S_IMODE((generated / name).stat().st_mode) == 0o600, name
        tls.load_private_key(str(generated / name))
    for name in (*CERTS, "webhook-configuration.yaml"):
        assert stat.S_IMODE((generated / name).stat().st_mode) == 0o644, name
    # The output directory itself holds keys: not listable by others.
    assert stat.S_IMODE(generated.stat().st_mode) == 0o700


def test_server_certificate_chains_to_the_ca_for_its_names(generated: Path) -> None:
    ca = load(generated, "ca.crt")
    server = load(generated, "tls.crt")
    store = Store([ca])
    for name in DEFAULT_DNS:
        verifier = PolicyBuilder().store(store).build_server_verifier(DNSName(name))
        chain = verifier.verify(server, [])
        assert chain[-1] == ca
    by_ip = (
        PolicyBuilder()
        .store(store)
        .build_server_verifier(IPAddress(ipaddress.ip_address("127.0.0.1")))
    )
    by_ip.verify(server, [])
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # Loopback always: kube-scheduler calls gas at 127.0.0.1 in the scheduler profile.
    assert sans.get_values_for_type(x509.DNSName) == [*DEFAULT_DNS, "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_client_certificate_is_kube_scheduler_for_client_auth(generated: Path) -> None:
    ca = load(generated, "ca.crt")
    client = load(generated, "client.crt")
    # cryptography's client verifier follows the web PKI and wants a SAN; Go and OpenSSL,
    # which do the real checks, do not. Check the signature and the validity instead.
    client.verify_directly_issued_by(ca)
    now = datetime.datetime.now(datetime.UTC)
    assert client.not_valid_before_utc <= now < client.not_valid_after_utc
    common_name = client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert common_name == "kube-scheduler"
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # A client certificate must not be usable to impersonate gas.
    with pytest.raises(x509.ExtensionNotFound):
        client.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_ca_is_a_ca_that_outlives_the_certificates(generated: Path) -> None:
    ca = load(generated, "ca.crt")
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is True
    for name in ("tls.crt", "client.crt"):
        leaf = load(generated, name)
        assert leaf.issuer == ca.subject
        assert leaf.not_valid_after_utc <= ca.not_valid_after_utc
        days = (leaf.not_valid_after_utc - datetime.datetime.now(datetime.UTC)).days
        assert 363 <= days <= 365


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_openssl_verifies_the_chain_and_purposes(generated: Path) -> None:
    def verify(purpose: str, name: str) -> subprocess.CompletedProcess[str]:
        command = ["openssl", "verify", "-purpose", purpose, "-CAfile", str(generated / "ca.crt")]
        return subprocess.run(
            [*command, str(generated / name)], capture_output=True, text=True, check=False
        )

    for name, purpose in (("tls.crt", "sslserver"), ("client.crt", "sslclient")):
        result = verify(purpose, name)
        assert result.returncode == 0, result.stdout + result.stderr
    assert verify("sslserver", "client.crt").returncode != 0


REPO = Path(__file__).resolve().parents[2]


def _secret_keys(manifest: Path, secret: str) -> set[str]:
    """The keys of Secret `secret` the manifest's pods use: a volume's items, or, where
    the whole Secret is mounted, the files under its mount that containers' args name."""
    keys: set[str] = set()
    for doc in yaml.safe_load_all(manifest.read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            source = volume.get("secret") or {}
            if source.get("secretName") != secret:
                continue
            if "items" in source:
                keys |= {item["key"] for item in source["items"]}
                continue
            for c in pod["containers"]:
                for mount in c.get("volumeMounts", []):
                    if mount["name"] == volume["name"]:
                        prefix = mount["mountPath"].rstrip("/") + "/"
                        values = (a.split("=", 1)[-1] for a in c.get("args", []))
                        keys |= {v[len(prefix) :] for v in values if v.startswith(prefix)}
    return keys


def _way(out: str, title: str) -> str:
    """The printed steps of one way of installing."""
    part = out.split(f"\n{title} (", 1)[1]
    return part.split("\n\n", 1)[0]


def _from_files(step: str, secret: str) -> set[str]:
    (line,) = [x for x in step.splitlines() if f"create secret generic {secret} " in x]
    return {Path(w.removeprefix("--from-file=")).name for w in line.split() if "=" in w}


def test_prints_each_ways_follow_up_commands_as_its_manifests_mount_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tmp_path / "pki"
    status, out, err = run_certs(capsys, "--out", str(pki))
    assert status == 0 and err == ""
    for name in FILE_NAMES:
        assert f"wrote {pki / name}" in out
    any_cluster, kubeadm = _way(out, "Any cluster"), _way(out, "kubeadm")
    # The any-cluster pod's kube-scheduler reads client.crt and client.key from gas-tls too.
    any_cluster_keys = _secret_keys(REPO / "deploy" / "any-cluster" / "deployment.yaml", "gas-tls")
    assert any_cluster_keys == {"tls.crt", "tls.key", "ca.crt", "client.crt", "client.key"}
    assert _from_files(any_cluster, "gas-tls") == any_cluster_keys
    kubeadm_keys = _secret_keys(REPO / "deploy" / "deployment.yaml", "gas-tls")
    assert _from_files(kubeadm, "gas-tls") == kubeadm_keys == {"tls.crt", "tls.key", "ca.crt"}
    assert (
        "kubectl -n gas-system create secret generic gas-tls "
        f"--from-file={pki / 'tls.crt'} --from-file={pki / 'tls.key'} "
        f"--from-file={pki / 'ca.crt'}\n"
    ) in kubeadm
    assert "kubectl apply -k deploy/any-cluster\n" in any_cluster
    assert "kubectl -n gas-system rollout status deployment/gas-scheduler" in any_cluster
    assert "kubectl apply -k deploy/\n" in kubeadm
    # The webhook with its caBundle: the any-cluster way's, applied after its pods.
    apply_configuration = f"kubectl apply -f {pki / 'webhook-configuration.yaml'}"
    assert any_cluster.index("apply -k deploy/any-cluster") < any_cluster.index(apply_configuration)
    assert apply_configuration not in kubeadm and "gas-webhook-tls" not in kubeadm
    assert "gas certs --validatingWebhook" in kubeadm
    # The paths the shipped scheduler configuration reads, on the control-plane nodes.
    config = (REPO / "extender-configuration" / "scheduler-config.yaml").read_text()
    for name in ("ca.crt", "client.crt", "client.key"):
        assert f"/etc/kubernetes/gas/{name}" in config
        assert str(pki / name) in kubeadm.split("2.", 1)[1]
    assert "/etc/kubernetes/gas" not in any_cluster


def _commands(way: str) -> list[str]:
    """The commands of one way's printed steps, in order (each indented under its step)."""
    return [line.strip() for line in way.splitlines() if line.startswith("   ")]


def _first(commands: list[str], start: str) -> int:
    (index, *_) = [i for i, c in enumerate(commands) if c.startswith(start)]
    return index


@pytest.mark.parametrize(
    ("flags", "title", "check", "apply", "deployment"),
    [
        (
            [],
            "Any cluster",
            "gas check-config deploy/any-cluster/scheduler-config.yaml "
            "deploy/any-cluster/deployment.yaml",
            "kubectl apply -k deploy/any-cluster",
            "gas-scheduler",
        ),
        (
            [],
            "kubeadm",
            "gas check-config extender-configuration/scheduler-config.yaml",
            "kubectl apply -k deploy/",
            "gas",
        ),
        (
            ["--validatingWebhook"],
            "kubeadm",
            "gas check-config extender-configuration/scheduler-config.yaml",
            "kubectl apply -k deploy/",
            "gas",
        ),
    ],
    ids=["any-cluster", "kubeadm", "kubeadm-webhook"],
)
def test_each_ways_steps_go_from_nothing_in_an_order_that_works(
    flags: list[str],
    title: str,
    check: str,
    apply: str,
    deployment: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The namespace, then the Secrets in it, then the configuration checked before it is
    installed, then the workloads, waited for, and only then the webhook's configuration
    (failurePolicy Fail: registered before its pods answer, it would refuse GPU pods)."""
    status, out, _ = run_certs(capsys, "--out", str(tmp_path), *flags)
    assert status == 0
    commands = _commands(_way(out, title))
    namespace = _first(commands, "kubectl apply -f deploy/namespace/namespace.yaml")
    secrets = [i for i, c in enumerate(commands) if " create secret " in c]
    assert namespace < min(secrets)
    assert max(secrets) < _first(commands, check) < _first(commands, apply)
    wait = _first(commands, f"kubectl -n gas-system rollout status deployment/{deployment}")
    assert _first(commands, apply) < wait
    configuration = f"kubectl apply -f {tmp_path / 'webhook-configuration.yaml'}"
    if title == "Any cluster" or flags:
        assert wait < _first(commands, configuration) == len(commands) - 1
    else:
        assert configuration not in commands
    if title == "kubeadm":
        # kube-scheduler calls gas once it loads the configuration: gas must answer first.
        assert wait < _first(commands, "sudo ./scripts/configure-scheduler.sh")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("flags", "title"),
    [([], "Any cluster"), (["--validatingWebhook"], "kubeadm")],
    ids=["any-cluster", "kubeadm-webhook"],
)
def test_each_ways_printed_commands_run_on_a_new_cluster(
    flags: list[str],
    title: str,
    k8s: realk8s.Release,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every command of a way's steps, as printed, against a real kube-apiserver that holds
    nothing of gas yet. Not run: the rollout's wait (no kubelet here runs a pod: the
    Deployment is looked up instead), and the commands for the control-plane nodes' files
    (test_configure_scheduler.py runs configure-scheduler.sh)."""
    status, out, _ = run_certs(capsys, "--out", str(tmp_path / "pki"), *flags)
    assert status == 0
    with realk8s.ControlPlane(tmp_path / "plane", version=k8s.version) as plane:
        kubectl = [str(realk8s.binary("kubectl", k8s.version)), "--kubeconfig"]
        for command in _commands(_way(out, title)):
            words = shlex.split(command)
            if words[0] == "sudo":
                continue
            if words[:4] == ["kubectl", "-n", "gas-system", "rollout"]:
                words = ["kubectl", "-n", "gas-system", "get", words[-1]]
            if words[0] == "kubectl":
                words = [*kubectl, plane.admin_kubeconfig, *words[1:]]
            else:
                assert words[0] == "gas", command
                words = [sys.executable, "-m", "gas.cli", *words[1:]]
            done = subprocess.run(words, cwd=REPO, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{command}:\n{done.stdout}{done.stderr}"
        secrets = plane.kubectl("-n", "gas-system", "get", "secrets", "-o", "name").stdout
        assert "secret/gas-tls" in secrets.split() and "secret/gas-webhook-tls" in secrets.split()
        kind = "validating" if flags else "mutating"
        plane.kubectl("get", f"{kind}webhookconfiguration", "gas-webhook")


def test_gas_help_says_what_certs_writes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gas.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    words = " ".join(done.stdout.split())
    certs = words.split(" certs ", 1)[1].split(" check-config ", 1)[0]
    assert "the admission webhook's certificate and its configuration" in certs, certs


def test_custom_names_days_and_rsa(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_certs(
        capsys,
        "--out",
        str(tmp_path),
        "--dns",
        "gas.example.com",
        "10.96.0.50",
        "--dns",
        "gas.internal",
        "--ip",
        "::1",
        "--days",
        "30",
        "--keyType",
        "rsa",
    )
    assert status == 0
    server = load(tmp_path, "tls.crt")
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "gas.example.com",
        "gas.internal",
        "localhost",
    ]
    # An IP address given to --dns becomes an IP SAN, where a client looks for it.
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.96.0.50"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address("127.0.0.1"),
    ]
    days = (server.not_valid_after_utc - server.not_valid_before_utc).days
    assert days == 30
    assert "serverName" in out  # the shipped config's name is not in the certificate


def test_refuses_to_overwrite_without_force_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tls.key").write_text("precious")
    status, out, err = run_certs(capsys, "--out", str(tmp_path))
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "tls.key" in err and "--force" in err
    assert snapshot(tmp_path) == {"tls.key": b"precious"}


def test_existing_set_is_left_alone_until_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_certs(capsys, "--out", str(tmp_path))[0] == 0
    before = snapshot(tmp_path)
    status, _, err = run_certs(capsys, "--out", str(tmp_path), "--dns", "other.example")
    assert status == 1 and "already exist" in err
    assert snapshot(tmp_path) == before
    status, _, err = run_certs(capsys, "--out", str(tmp_path), "--force")
    assert status == 0 and err == ""
    after = snapshot(tmp_path)
    assert set(after) == set(before)
    assert all(after[name] != before[name] for name in FILE_NAMES)
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--ip", "not-an-ip"], "--ip 'not-an-ip' is not an IP address"),
        (["--dns", "bad name"], "not a valid DNS name"),
        (["--days", "0"], "--days must be between"),
        (["--days", "400", "--caDays", "100"], "--caDays (100) must be at least --days (400)"),
    ],
)
def test_bad_arguments_get_one_line_and_no_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], complaint: str
) -> None:
    status, out, err = run_certs(capsys, "--out", str(tmp_path / "pki"), *args)
    assert status == 1 and out == ""
    assert err.startswith("gas certs: ") and err.count("\n") == 1 and complaint in err
    assert not (tmp_path / "pki").exists()


def test_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    status, _, err = run_certs(capsys, "--out", str(target))
    assert status == 1 and "not a directory" in err and "Traceback" not in err


# ----------------------------------------------------------------------------------------
# A real handshake: gas serve with the generated files, clients as kube-scheduler would be
# ----------------------------------------------------------------------------------------


@pytest.fixture
def served(generated: Path, start_gas: Callable[..., GasProcess]) -> GasProcess:
    files = TLSFiles(
        ca=str(generated / "ca.crt"),
        server_cert=str(generated / "tls.crt"),
        server_key=str(generated / "tls.key"),
        client_cert=str(generated / "client.crt"),
        client_key=str(generated / "client.key"),
    )
    process = start_gas(["--demo"], tls=files)
    # The process's session presents client.crt and checks the server against ca.crt
    # (hostname 127.0.0.1, the --ip SAN).
    process.wait_ready()
    return process


@pytest.mark.timeout(60)
def test_gas_accepts_the_generated_client_certificate(served: GasProcess) -> None:
    response = served.session.get(served.url + "/healthz", timeout=5)
    assert response.status_code == 200
    reply = served.post(
        "/scheduler/filter",
        {
            "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}},
            "NodeNames": ["demo-1card"],
        },
    )
    assert reply.status_code == 200


@pytest.mark.timeout(60)
def test_gas_refuses_a_client_without_certificate(served: GasProcess, generated: Path) -> None:
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would replace verify=
    session.verify = str(generated / "ca.crt")
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        session.get(served.url + "/healthz", timeout=5)
    # The same session with the certificate gets in: the refusal was about the certificate.
    session.cert = (str(generated / "client.crt"), str(generated / "client.key"))
    assert session.get(served.url + "/healthz", timeout=5).status_code == 200
    session.close()


@pytest.mark.timeout(60)
def test_gas_refuses_a_client_certificate_from_another_ca(
    served: GasProcess, tmp_path: Path
) -> None:
    other_ca, other_key = tls.new_ca("not gas's CA")
    cert, key = tls.issue_certificate(
        other_ca, other_key, "kube-scheduler", server=False, client=True
    )
    tls.write_pem(tmp_path / "c.crt", cert)
    tls.write_pem(tmp_path / "c.key", key)
    session = requests.Session()
    session.trust_env = False
    session.verify = served.tls.ca if served.tls else False
    session.cert = (str(tmp_path / "c.crt"), str(tmp_path / "c.key"))
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        session.get(served.url + "/healthz", timeout=5)
    session.close()


def _handshake(served: GasProcess, generated: Path, server_hostname: str) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(generated / "ca.crt"))
    context.load_cert_chain(str(generated / "client.crt"), str(generated / "client.key"))
    raw = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    try:
        return context.wrap_socket(raw, server_hostname=server_hostname)
    except BaseException:
        raw.close()
        raise


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", DEFAULT_DNS)
def test_server_verifies_under_its_service_names(
    served: GasProcess, generated: Path, name: str
) -> None:
    """What kube-scheduler does with tlsConfig.caFile and serverName."""
    with _handshake(served, generated, name) as sock:
        peer = sock.getpeercert()
        assert peer is not None and ("DNS", name) in peer["subjectAltName"]
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 200")


@pytest.mark.timeout(60)
def test_server_is_rejected_under_a_name_it_does_not_carry(
    served: GasProcess, generated: Path
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(served, generated, "gas-extender.default.svc").close()


# ----------------------------------------------------------------------------------------
# The admission webhook's certificate and configuration
# ----------------------------------------------------------------------------------------


def test_webhook_certificate_chains_to_the_ca_for_the_service_names(generated: Path) -> None:
    ca = load(generated, "ca.crt")
    webhook = load(generated, "webhook.crt")
    store = Store([ca])
    for name in WEBHOOK_DNS:
        verifier = PolicyBuilder().store(store).build_server_verifier(DNSName(name))
        assert verifier.verify(webhook, [])[-1] == ca
    sans = webhook.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == list(WEBHOOK_DNS)
    assert sans.get_values_for_type(x509.IPAddress) == []
    usage = webhook.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # gas's own server certificate does not serve the webhook's names, nor the reverse.
    server = load(generated, "tls.crt")
    with pytest.raises(VerificationError):
        PolicyBuilder().store(store).build_server_verifier(DNSName(WEBHOOK_DNS[0])).verify(
            server, []
        )


def test_webhook_configuration_is_the_shared_object_with_this_ca(generated: Path) -> None:
    written = yaml.safe_load((generated / "webhook-configuration.yaml").read_text())
    ca_pem = (generated / "ca.crt").read_bytes()
    assert written == webhook_configuration(ca_pem)
    (hook,) = written["webhooks"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem
    assert written["kind"] == "MutatingWebhookConfiguration"
    assert hook["clientConfig"]["service"] == {
        "namespace": "gas-system",
        "name": "gas-webhook",
        "path": "/admission/pods",
        "port": 443,
    }


def test_prints_the_webhook_secret_and_configuration_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "pki"
    status, out, err = run_certs(capsys, "--out", str(out_dir))
    assert status == 0 and err == ""
    assert (
        "kubectl -n gas-system create secret tls gas-webhook-tls "
        f"--cert={out_dir / 'webhook.crt'} --key={out_dir / 'webhook.key'}"
    ) in out
    assert f"kubectl apply -f {out_dir / 'webhook-configuration.yaml'}" in out
    assert f"wrote {out_dir / 'webhook-configuration.yaml'}" in out


def test_webhook_namespace_and_service_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_certs(
        capsys, "--out", str(tmp_path), "--webhookNamespace", "gpu", "--webhookService", "hook"
    )
    assert status == 0
    webhook = load(tmp_path, "webhook.crt")
    sans = webhook.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["hook.gpu.svc", "hook.gpu.svc.cluster.local"]
    written = yaml.safe_load((tmp_path / "webhook-configuration.yaml").read_text())
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    assert written == webhook_configuration(ca_pem, namespace="gpu", service="hook")
    (hook,) = written["webhooks"]
    assert hook["clientConfig"]["service"]["namespace"] == "gpu"
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["gpu", "kube-system"]
    assert "kubectl -n gpu create secret tls gas-webhook-tls" in out


def test_validating_webhook_configuration_for_kubeadm_installs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_certs(capsys, "--out", str(tmp_path), "--validatingWebhook")
    assert status == 0
    assert "the ValidatingWebhookConfiguration gas-webhook" in out
    written = yaml.safe_load((tmp_path / "webhook-configuration.yaml").read_text())
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    assert written == webhook_configuration(ca_pem, validate_only=True)
    assert written["kind"] == "ValidatingWebhookConfiguration"
    assert "reinvocationPolicy" not in written["webhooks"][0]
    # Its configuration is the kubeadm way's alone: no any-cluster steps to apply it with.
    assert "\nAny cluster (" not in out
    kubeadm = _way(out, "kubeadm")
    assert "kubectl apply -k deploy/kubeadm-webhook\n" in kubeadm
    assert kubeadm.index("apply -k deploy/kubeadm-webhook") < kubeadm.index(
        f"kubectl apply -f {tmp_path / 'webhook-configuration.yaml'}"
    )
    assert f"create secret tls gas-webhook-tls --cert={tmp_path / 'webhook.crt'}" in kubeadm


def test_dra_claims_webhook_configuration_for_the_dra_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_certs(capsys, "--out", str(tmp_path), "--draClaims")
    assert status == 0
    written = yaml.safe_load((tmp_path / "webhook-configuration.yaml").read_text())
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    assert written == webhook_configuration(ca_pem, dra_claims=True)
    assert written["webhooks"][0]["sideEffects"] == "NoneOnDryRun"
    # Only the DRA way's steps: the other ways' webhooks need another configuration.
    assert "\nAny cluster (" not in out and "\nkubeadm (" not in out
    steps = out[out.index("The DRA way with its webhook") :]
    assert steps.index("apply -k deploy/dra\n") < steps.index("apply -k deploy/dra-webhook")
    assert steps.index("apply -k deploy/dra-webhook") < steps.index(
        f"kubectl apply -f {tmp_path / 'webhook-configuration.yaml'}"
    )
    assert f"create secret tls gas-webhook-tls --cert={tmp_path / 'webhook.crt'}" in steps
    status, _, err = run_certs(
        capsys, "--out", str(tmp_path / "two"), "--draClaims", "--validatingWebhook"
    )
    assert status != 0 and "choose one" in err
    assert not (tmp_path / "two").exists()


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--webhookNamespace", "Gas_System"], "--webhookNamespace 'Gas_System' is not a valid"),
        (["--webhookService", "a.b"], "--webhookService 'a.b' is not a valid"),
    ],
)
def test_bad_webhook_names_get_one_line_and_no_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], complaint: str
) -> None:
    status, out, err = run_certs(capsys, "--out", str(tmp_path / "pki"), *args)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and complaint in err
    assert not (tmp_path / "pki").exists()


@pytest.mark.parametrize("name", ["webhook.key", "webhook-configuration.yaml"])
def test_an_existing_webhook_file_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    (tmp_path / name).write_text("precious")
    status, out, err = run_certs(capsys, "--out", str(tmp_path))
    assert status == 1 and out == "" and name in err
    assert snapshot(tmp_path) == {name: b"precious"}


@pytest.mark.timeout(60)
def test_gas_webhook_serves_the_certificate_under_the_service_name(
    generated: Path, tmp_path: Path
) -> None:
    """As the API server checks it: the Service's name against the caBundle, no client
    certificate."""
    files = TLSFiles(
        ca=str(generated / "ca.crt"),
        server_cert=str(generated / "webhook.crt"),
        server_key=str(generated / "webhook.key"),
        client_cert="",
        client_key="",
    )
    process = WebhookProcess([], tmp_path / "webhook.log", files)
    try:
        context = ssl.create_default_context(cafile=files.ca)
        deadline = time.monotonic() + 30
        while True:
            try:
                raw = socket.create_connection(("127.0.0.1", process.port), timeout=5)
                break
            except OSError:
                assert process.process.poll() is None, process.log()
                assert time.monotonic() < deadline, process.log()
                time.sleep(0.05)
        with raw, context.wrap_socket(raw, server_hostname=WEBHOOK_DNS[0]) as sock:
            request = f"GET /readyz HTTP/1.1\r\nHost: {WEBHOOK_DNS[0]}\r\nConnection: close\r\n\r\n"
            sock.sendall(request.encode())
            assert sock.recv(64).startswith(b"HTTP/1.1 200")
        with (
            socket.create_connection(("127.0.0.1", process.port), timeout=5) as raw,
            pytest.raises(ssl.SSLCertVerificationError),
        ):
            context.wrap_socket(raw, server_hostname="gas-webhook.default.svc").close()
    finally:
        process.stop()


def test_server_certificate_serves_loopback_without_being_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kube-scheduler calls gas at https://127.0.0.1:9001 in the scheduler profile."""
    assert run_certs(capsys, "--out", str(tmp_path))[0] == 0
    store = Store([load(tmp_path, "ca.crt")])
    server = load(tmp_path, "tls.crt")
    for name in (DNSName("localhost"), IPAddress(ipaddress.ip_address("127.0.0.1"))):
        PolicyBuilder().store(store).build_server_verifier(name).verify(server, [])
