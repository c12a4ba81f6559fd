"""`gas webhook`: the mutating admission webhook for GPU pods, over HTTPS.

It sends GPU pods that name the default scheduler to gas's scheduler profile, and refuses
at creation the GPU pods gas can never place, with the filter's reason. It holds no
cluster state and needs no kubeconfig: each AdmissionReview carries the pod. The API
server presents no client certificate to a webhook, so none is asked for; it verifies
gas's certificate against the configuration's caBundle. See docs/webhook.md.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from gas.core.admission import GAS_SCHEDULER
from gas.serving.goflags import add_go_bool
from gas.serving.limit_flags import add_limit_flags, limits_from_args

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger("gas")

DEFAULT_PORT = 9443


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve the admission webhook over HTTPS: GPU pods that name the default scheduler "
        "get --schedulerName, GPU pods gas can never place are refused with the filter's "
        "reason. No kubeconfig: each review carries its pod."
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen port (9443)")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (0.0.0.0)")
    parser.add_argument("--cert", required=True, help="serving certificate (PEM)")
    parser.add_argument("--key", required=True, help="serving private key (PEM)")
    parser.add_argument(
        "--schedulerName",
        default=GAS_SCHEDULER,
        help=f"the scheduler GPU pods are sent to ({GAS_SCHEDULER})",
    )
    add_go_bool(
        parser,
        "--validateOnly",
        "refuse GPU pods gas can never place, never change a pod's scheduler (kubeadm "
        "installs, where gas extends the default scheduler)",
    )
    add_go_bool(
        parser,
        "--draClaims",
        "turn GPU pods into DRA claims of gas dra's devices (class gpu.gas.intel.com) with "
        "the same per-card amounts, making a ResourceClaimTemplate per pod shape; for "
        "clusters whose GPU nodes all run gas dra. Needs API rights (--kubeConfig or "
        "in-cluster)",
    )
    parser.add_argument(
        "--kubeConfig",
        default=None,
        help="kubeconfig for --draClaims' templates (default: in-cluster)",
    )
    add_go_bool(parser, "--enableAllowlist", "as gas serve's: a malformed gas-allow is refused")
    add_go_bool(parser, "--enableDenylist", "as gas serve's: a malformed gas-deny is refused")
    parser.add_argument("--threads", type=int, default=4, help="request threads (4)")
    parser.add_argument("--v", type=int, default=2, help="log verbosity: 0-3 info, 4+ debug")
    add_limit_flags(parser)


def run(args: argparse.Namespace) -> int:
    from gas.core.admission import Settings
    from gas.core.allocator import Policy
    from gas.serving import server
    from gas.serving.tls import TLSConfigError
    from gas.serving.webhook_app import create_app

    name = args.schedulerName.strip()
    if not name:
        log.error("--schedulerName must not be empty")
        return 2
    if args.draClaims and args.validateOnly:
        log.error("--draClaims changes pods, --validateOnly never does: choose one")
        return 2
    settings = Settings(
        scheduler_name=name,
        validate_only=args.validateOnly,
        policy=Policy(allowlist=args.enableAllowlist, denylist=args.enableDenylist),
        dra_claims=args.draClaims,
    )
    try:
        limits = limits_from_args(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    server_settings = server.ServerSettings(
        host=args.host,
        port=args.port,
        certfile=args.cert,
        keyfile=args.key,
        cafile=None,
        threads=args.threads,
        limits=limits,
    )
    mode = "validating only" if settings.validate_only else f"sending GPU pods to {name}"
    if settings.dra_claims:
        mode = "turning GPU pods into DRA claims"
    log.info("gas webhook serving https://%s:%d (%s)", args.host, args.port, mode)

    templates = None
    if settings.dra_claims:
        from kubernetes.config import ConfigException

        from gas.cluster.kube import load_api_client
        from gas.kubeapi.dra import RawResourceV1Api
        from gas.serving.claim_templates import TemplateMaker

        try:
            # No connection is opened before the server's fork: the pool starts empty.
            templates = TemplateMaker(RawResourceV1Api(load_api_client(args.kubeConfig)))
        except (ConfigException, OSError) as exc:
            log.error("--draClaims needs API access: %s", exc)
            return 2

    def app() -> Flask:
        return create_app(settings, templates=templates)

    try:
        server.serve(app, server_settings)
    except (TLSConfigError, ValueError) as exc:
        log.error("gas webhook cannot start: %s", exc)
        return 1
