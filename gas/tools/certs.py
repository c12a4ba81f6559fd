"""`gas certs`: a small private PKI for gas, kube-scheduler and the admission webhook.

kube-scheduler can authenticate to an extender only with a client certificate, and it
checks gas's server certificate only against a CA it is given. One private CA covers
both directions: gas trusts it for client certificates (`--cacert`), kube-scheduler
trusts it for the server certificate (`tlsConfig.caFile`). The same CA signs the
webhook's serving certificate, and is the caBundle by which the API server checks it in
the webhook configuration written next to it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shlex
import sys
from dataclasses import dataclass

# tlsConfig.serverName in extender-configuration/scheduler-config.yaml: gas's Service.
SCHEDULER_SERVER_NAME = "gas-extender.gas-system.svc"
DEFAULT_DNS = (SCHEDULER_SERVER_NAME, f"{SCHEDULER_SERVER_NAME}.cluster.local")
# Always in gas's server certificate: in the scheduler profile kube-scheduler calls gas
# over loopback in its own pod.
LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1",)
# Where extender-configuration/scheduler-config.yaml expects kube-scheduler's files.
NODE_CERT_DIR = "/etc/kubernetes/gas"
CLIENT_COMMON_NAME = "kube-scheduler"
CA_COMMON_NAME = "gas CA"
WEBHOOK_SECRET = "gas-webhook-tls"
GAS_SECRET = "gas-tls"
# The namespace of both ways' workloads and Secrets, and the manifest that makes it.
GAS_NAMESPACE = "gas-system"
NAMESPACE_FILE = "deploy/namespace/namespace.yaml"
ANY_CLUSTER_DIR = "deploy/any-cluster"
# What the printed steps have `gas check-config` check before anything is installed: the
# scheduler configuration each way installs (and the Deployment that runs the any-cluster one).
ANY_CLUSTER_SCHEDULER_CONFIG = f"{ANY_CLUSTER_DIR}/scheduler-config.yaml"
ANY_CLUSTER_DEPLOYMENT = f"{ANY_CLUSTER_DIR}/deployment.yaml"
KUBEADM_SCHEDULER_CONFIG = "extender-configuration/scheduler-config.yaml"
KUBEADM_WEBHOOK_DIR = "deploy/kubeadm-webhook"
DRA_DIR = "deploy/dra"
DRA_WEBHOOK_DIR = "deploy/dra-webhook"
# The keys of Secret gas-tls each way's manifests mount: in the any-cluster way the
# kube-scheduler container of gas's pod also reads its client certificate from it.
KUBEADM_GAS_TLS = ("tls.crt", "tls.key", "ca.crt")
ANY_CLUSTER_GAS_TLS = (*KUBEADM_GAS_TLS, "client.crt", "client.key")
WEBHOOK_CONFIGURATION_FILE = "webhook-configuration.yaml"
FILE_NAMES = (
    "ca.crt",
    "ca.key",
    "tls.crt",
    "tls.key",
    "client.crt",
    "client.key",
    "webhook.crt",
    "webhook.key",
    WEBHOOK_CONFIGURATION_FILE,
)
MAX_DAYS = 36500

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*\.?$")
# A namespace or Service name: an RFC 1123 label.
_K8S_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class CertsError(Exception):
    """A problem the user can fix; the message is printed as is."""


@dataclass(frozen=True)
class Plan:
    out: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    days: int
    ca_days: int
    key_type: str
    force: bool
    webhook_namespace: str
    webhook_service: str
    validating_webhook: bool
    dra_claims: bool = False
    """The configuration is for `gas webhook --draClaims` (deploy/dra-webhook)."""

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)

    @property
    def webhook_dns(self) -> tuple[str, str]:
        """The webhook Service's names, as the API server reaches it."""
        name = f"{self.webhook_service}.{self.webhook_namespace}.svc"
        return name, f"{name}.cluster.local"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Generate a CA (ca.crt, ca.key), gas's server certificate (tls.crt, tls.key), "
        "kube-scheduler's client certificate (client.crt, client.key), the admission "
        "webhook's serving certificate (webhook.crt, webhook.key) and the webhook's "
        f"configuration with its caBundle ({WEBHOOK_CONFIGURATION_FILE}) in one directory."
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    parser.add_argument(
        "--dns",
        nargs="+",
        action="extend",
        metavar="NAME",
        help=(
            "DNS names of gas's server certificate (default: "
            + ", ".join(DEFAULT_DNS)
            + "; "
            + ", ".join((*LOOPBACK_DNS, *LOOPBACK_IPS))
            + " are always added); IP addresses given here are added as IP addresses"
        ),
    )
    parser.add_argument(
        "--ip",
        nargs="+",
        action="extend",
        default=[],
        metavar="IP",
        help="IP addresses of gas's server certificate (e.g. the Service's ClusterIP)",
    )
    parser.add_argument(
        "--days", type=int, default=365, help="validity of the server and client certificates"
    )
    parser.add_argument("--caDays", type=int, default=3650, help="validity of the CA (3650)")
    parser.add_argument(
        "--keyType", choices=("ec", "rsa"), default="ec", help="ec (P-256, default) or rsa (2048)"
    )
    parser.add_argument(
        "--webhookNamespace",
        default="gas-system",
        help="namespace of the webhook's Service (gas-system)",
    )
    parser.add_argument(
        "--webhookService", default="gas-webhook", help="the webhook's Service (gas-webhook)"
    )
    parser.add_argument(
        "--validatingWebhook",
        action="store_true",
        help="write a ValidatingWebhookConfiguration, for gas webhook --validateOnly "
        "(kubeadm installs), instead of the MutatingWebhookConfiguration",
    )
    parser.add_argument(
        "--draClaims",
        action="store_true",
        help="write the MutatingWebhookConfiguration for gas webhook --draClaims "
        "(deploy/dra-webhook: side effects, none on dry run)",
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite files that already exist in --out"
    )


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        _check_targets(plan)
        written = _generate(plan)
    except CertsError as exc:
        print(f"gas certs: {exc}", file=sys.stderr)
        return 1
    _report(plan, written)
    return 0


def _plan(args: argparse.Namespace) -> Plan:
    dns: list[str] = []
    ips: list[str] = []
    for name in args.dns if args.dns is not None else DEFAULT_DNS:
        candidate = name.strip()
        try:
            ips.append(str(ipaddress.ip_address(candidate.strip("[]"))))
            continue
        except ValueError:
            pass
        if len(candidate) > 253 or not _DNS_NAME.match(candidate):
            raise CertsError(f"--dns {name!r} is not a valid DNS name")
        dns.append(candidate.rstrip(".").lower())
    for address in args.ip:
        try:
            ips.append(str(ipaddress.ip_address(address.strip().strip("[]"))))
        except ValueError:
            raise CertsError(f"--ip {address!r} is not an IP address") from None
    dns.extend(LOOPBACK_DNS)
    ips.extend(LOOPBACK_IPS)
    if not 1 <= args.days <= MAX_DAYS:
        raise CertsError(f"--days must be between 1 and {MAX_DAYS}, not {args.days}")
    if not 1 <= args.caDays <= MAX_DAYS:
        raise CertsError(f"--caDays must be between 1 and {MAX_DAYS}, not {args.caDays}")
    if args.caDays < args.days:
        # Verification fails once the CA expires, whatever the leaf says.
        raise CertsError(f"--caDays ({args.caDays}) must be at least --days ({args.days})")
    for flag, value in (
        ("--webhookNamespace", args.webhookNamespace),
        ("--webhookService", args.webhookService),
    ):
        if not _K8S_LABEL.match(value):
            raise CertsError(f"{flag} {value!r} is not a valid Kubernetes name (RFC 1123 label)")
    if args.draClaims and args.validatingWebhook:
        raise CertsError("--draClaims and --validatingWebhook are two webhooks: choose one")
    return Plan(
        out=args.out,
        dns_names=tuple(dict.fromkeys(dns)),
        ip_addresses=tuple(dict.fromkeys(ips)),
        days=args.days,
        ca_days=args.caDays,
        key_type=args.keyType,
        force=args.force,
        webhook_namespace=args.webhookNamespace,
        webhook_service=args.webhookService,
        validating_webhook=args.validatingWebhook,
        dra_claims=args.draClaims,
    )


def _check_targets(plan: Plan) -> None:
    """Fail before writing anything, so a refusal never leaves a half-replaced set."""
    if os.path.exists(plan.out) and not os.path.isdir(plan.out):
        raise CertsError(f"--out {plan.out} exists and is not a directory")
    if plan.force:
        return
    existing = [plan.path(name) for name in FILE_NAMES if os.path.lexists(plan.path(name))]
    if existing:
        raise CertsError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
            "nothing was written (use --force to replace them)"
        )


def _generate(plan: Plan) -> list[tuple[str, str]]:
    from cryptography.hazmat.primitives import serialization

    from gas.serving import tls

    key_type: tls.KeyType = "rsa" if plan.key_type == "rsa" else "ec"
    ca_cert, ca_key = tls.new_ca(CA_COMMON_NAME, plan.ca_days, key_type=key_type)
    server_cert, server_key = tls.issue_certificate(
        ca_cert,
        ca_key,
        plan.dns_names[0] if plan.dns_names else plan.ip_addresses[0],
        plan.dns_names,
        plan.ip_addresses,
        server=True,
        client=False,
        days=plan.days,
        key_type=key_type,
    )
    client_cert, client_key = tls.issue_certificate(
        ca_cert,
        ca_key,
        CLIENT_COMMON_NAME,
        server=False,
        client=True,
        days=plan.days,
        key_type=key_type,
    )
    webhook_cert, webhook_key = tls.issue_certificate(
        ca_cert,
        ca_key,
        plan.webhook_dns[0],
        plan.webhook_dns,
        server=True,
        client=False,
        days=plan.days,
        key_type=key_type,
    )
    names = ", ".join([*plan.dns_names, *plan.ip_addresses])
    until = server_cert.not_valid_after_utc.date().isoformat()
    outputs = [
        ("ca.key", ca_key, "CA key: keep it offline, nothing in the cluster needs it"),
        ("ca.crt", ca_cert, f"CA certificate, valid until {ca_cert.not_valid_after_utc.date()}"),
        ("tls.key", server_key, "gas's server key"),
        ("tls.crt", server_cert, f"gas's server certificate for {names}, valid until {until}"),
        ("client.key", client_key, "kube-scheduler's client key"),
        (
            "client.crt",
            client_cert,
            f"kube-scheduler's client certificate (CN {CLIENT_COMMON_NAME}), valid until {until}",
        ),
        ("webhook.key", webhook_key, "the admission webhook's serving key"),
        (
            "webhook.crt",
            webhook_cert,
            f"the admission webhook's serving certificate for {', '.join(plan.webhook_dns)}, "
            f"valid until {until}",
        ),
    ]
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    configuration = _webhook_configuration_yaml(plan, ca_pem)
    try:
        os.makedirs(plan.out, mode=0o700, exist_ok=True)
        for name, obj, _ in outputs:
            tls.write_pem(plan.path(name), obj)
        _write_public(plan.path(WEBHOOK_CONFIGURATION_FILE), configuration)
    except OSError as exc:
        raise CertsError(f"cannot write to {plan.out}: {exc.strerror or exc}") from None
    written = [(plan.path(name), what) for name, _, what in outputs]
    kind = "Validating" if plan.validating_webhook else "Mutating"
    written.append(
        (
            plan.path(WEBHOOK_CONFIGURATION_FILE),
            f"the {kind}WebhookConfiguration gas-webhook, its caBundle this CA",
        )
    )
    return written


def _write_public(path: str, text: str) -> None:
    """A file anyone may read (0644, as the certificates), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o644)
        f.write(text)


def _webhook_configuration_yaml(plan: Plan, ca_pem: bytes) -> str:
    import yaml

    from gas.tools.webhook_config import webhook_configuration

    body = webhook_configuration(
        ca_pem,
        namespace=plan.webhook_namespace,
        service=plan.webhook_service,
        validate_only=plan.validating_webhook,
        dra_claims=plan.dra_claims,
    )
    text: str = yaml.safe_dump(body, sort_keys=False)
    return text


def _report(plan: Plan, written: list[tuple[str, str]]) -> None:
    for path, what in written:
        print(f"wrote {path}  ({what})")
    print()
    print("Next steps: one way per cluster, never both (docs/kustomize.md).")
    if plan.dra_claims:
        print()
        _report_dra_claims(plan)
        return
    if not plan.validating_webhook:
        print()
        _report_any_cluster(plan)
    print()
    _report_kubeadm(plan)


def _gas_tls_command(plan: Plan, names: tuple[str, ...]) -> str:
    files = " ".join(f"--from-file={shlex.quote(plan.path(name))}" for name in names)
    return f"   kubectl -n {GAS_NAMESPACE} create secret generic {GAS_SECRET} {files}"


def _webhook_secret_command(plan: Plan) -> str:
    q = {name: shlex.quote(plan.path(name)) for name in ("webhook.crt", "webhook.key")}
    return (
        f"   kubectl -n {shlex.quote(plan.webhook_namespace)} create secret tls {WEBHOOK_SECRET} "
        f"--cert={q['webhook.crt']} --key={q['webhook.key']}"
    )


def _namespace_commands(plan: Plan, webhook: bool) -> list[str]:
    """The namespaces the Secrets go into: they must exist before the Secrets do, and the
    manifests that would make gas-system come after them."""
    commands = [f"   kubectl apply -f {NAMESPACE_FILE}"]
    if webhook and plan.webhook_namespace != GAS_NAMESPACE:
        commands.append(f"   kubectl create namespace {shlex.quote(plan.webhook_namespace)}")
    return commands


def _report_any_cluster(plan: Plan) -> None:
    print(f"Any cluster ({ANY_CLUSTER_DIR}: no control-plane node is edited):")
    print("1. The namespace of the Secrets:")
    print("\n".join(_namespace_commands(plan, webhook=True)))
    print(
        f"2. The Secret {GAS_SECRET}: gas's certificate, and kube-scheduler's client "
        "certificate for its container in the same pod:"
    )
    print(_gas_tls_command(plan, ANY_CLUSTER_GAS_TLS))
    print(f"3. The admission webhook's Secret {WEBHOOK_SECRET}:")
    print(_webhook_secret_command(plan))
    print("4. Check the scheduler's configuration against the Deployment that runs it:")
    print(f"   gas check-config {ANY_CLUSTER_SCHEDULER_CONFIG} {ANY_CLUSTER_DEPLOYMENT}")
    print("5. The scheduler, gas and the webhook (Deployment gas-scheduler), until Ready:")
    print(f"   kubectl apply -k {ANY_CLUSTER_DIR}")
    print(f"   kubectl -n {GAS_NAMESPACE} rollout status deployment/gas-scheduler")
    print(
        "6. Then register the webhook with its caBundle (until it answers, GPU pods are "
        "refused: failurePolicy Fail):"
    )
    print(f"   kubectl apply -f {shlex.quote(plan.path(WEBHOOK_CONFIGURATION_FILE))}")


def _report_dra_claims(plan: Plan) -> None:
    print(
        f"The DRA way with its webhook ({DRA_DIR} and {DRA_WEBHOOK_DIR}: every GPU node "
        "runs gas dra):"
    )
    print(f"1. gas dra on the GPU nodes: kubectl apply -k {DRA_DIR}")
    print(f"2. The admission webhook's Secret {WEBHOOK_SECRET}:")
    print(_webhook_secret_command(plan))
    print(f"3. The webhook: kubectl apply -k {DRA_WEBHOOK_DIR}")
    print("   kubectl -n gas-system rollout status deployment/gas-webhook")
    print("4. Once it is Ready, register it with its caBundle:")
    print(f"   kubectl apply -f {shlex.quote(plan.path(WEBHOOK_CONFIGURATION_FILE))}")


def _report_kubeadm(plan: Plan) -> None:
    q = {name: shlex.quote(plan.path(name)) for name in FILE_NAMES}
    webhook = plan.validating_webhook
    print("kubeadm (deploy/: gas as the default scheduler's extender):")
    print("1. The namespace of the Secrets:")
    print("\n".join(_namespace_commands(plan, webhook)))
    if webhook:
        print(
            f"2. The Secret {GAS_SECRET} that gas's Deployment mounts, and the Secret "
            f"{WEBHOOK_SECRET} of the validating webhook ({KUBEADM_WEBHOOK_DIR}):"
        )
        print(_gas_tls_command(plan, KUBEADM_GAS_TLS))
        print(_webhook_secret_command(plan))
    else:
        print(f"2. The Secret {GAS_SECRET} that gas's Deployment mounts:")
        print(_gas_tls_command(plan, KUBEADM_GAS_TLS))
    print(
        "3. Check the configuration each control-plane node's kube-scheduler is to load "
        f"({KUBEADM_SCHEDULER_CONFIG}):"
    )
    print(f"   gas check-config {KUBEADM_SCHEDULER_CONFIG}")
    if webhook:
        print("4. gas and the webhook, until they are Ready:")
        print("   kubectl apply -k deploy/")
        print(f"   kubectl apply -k {KUBEADM_WEBHOOK_DIR}")
        print(f"   kubectl -n {GAS_NAMESPACE} rollout status deployment/gas")
        print(f"   kubectl -n {GAS_NAMESPACE} rollout status deployment/gas-webhook")
    else:
        print("4. gas, until it is Ready:")
        print("   kubectl apply -k deploy/")
        print(f"   kubectl -n {GAS_NAMESPACE} rollout status deployment/gas")
    print(
        f"5. Copy ca.crt, client.crt and client.key to {NODE_CERT_DIR}/ on every "
        f"control-plane node (the paths in {KUBEADM_SCHEDULER_CONFIG}), then run "
        "sudo ./scripts/configure-scheduler.sh there, which makes its kube-scheduler call gas:"
    )
    print(f"   sudo install -d -m 0700 {NODE_CERT_DIR}")
    print(f"   sudo install -m 0644 {q['ca.crt']} {q['client.crt']} {NODE_CERT_DIR}/")
    print(f"   sudo install -m 0600 {q['client.key']} {NODE_CERT_DIR}/")
    print("   sudo ./scripts/configure-scheduler.sh")
    if webhook:
        print("6. Then register the validating webhook with its caBundle:")
        print(f"   kubectl apply -f {q[WEBHOOK_CONFIGURATION_FILE]}")
    else:
        print(
            f"Optional, the validating webhook ({KUBEADM_WEBHOOK_DIR}): its configuration "
            f"comes from gas certs --validatingWebhook ({WEBHOOK_CONFIGURATION_FILE} here "
            "is the any-cluster way's)."
        )
    if SCHEDULER_SERVER_NAME not in plan.dns_names:
        print(
            f"Note: the server certificate does not name {SCHEDULER_SERVER_NAME}; set "
            "tlsConfig.serverName in the scheduler configuration to one of its names."
        )
