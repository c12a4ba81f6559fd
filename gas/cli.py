"""The `gas` command.

`gas serve` takes GAS's flag names (`--kubeConfig`, `--port`, `--cert`, `--key`, `--cacert`,
...) so a GAS deployment can switch images without touching its arguments; like Go's flag
package it accepts them with one dash or two, and as `-flag=value` or `-flag value`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from flask import Flask

from gas import __version__
from gas.core.durations import NANOSECONDS_PER_SECOND, parse_go_duration
from gas.core.ledger import DEFAULT_PENDING_GRACE

if TYPE_CHECKING:
    from gas.cluster.leader import Elector

log = logging.getLogger("gas")

DEFAULT_PORT = 9001


def _go_style(argv: Sequence[str]) -> list[str]:
    """`-flag` -> `--flag`, as Go's flag package takes both (`-h` stays help)."""
    result = []
    for arg in argv:
        single = arg.startswith("-") and not arg.startswith("--") and len(arg) > 1
        if single and arg != "-h" and not arg[1].isdigit():
            arg = "-" + arg
        result.append(arg)
    return result


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "t", "true", "yes", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r}")


def _add_bool(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    # Go booleans: `-flag` alone or `-flag=true|false`.
    parser.add_argument(
        name, nargs="?", const=True, default=False, type=_bool, metavar="BOOL", help=help_text
    )


def _duration(value: str) -> float:
    """A Go duration (`15s`, `1.5s`, `500ms`, `1m30s`) in seconds."""
    nanoseconds = parse_go_duration(value)
    if nanoseconds is None:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (e.g. 15s, 500ms)")
    if nanoseconds <= 0:
        raise argparse.ArgumentTypeError(f"not a positive duration: {value!r}")
    return nanoseconds / NANOSECONDS_PER_SECOND


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gas", description="GPU-aware scheduler extender for Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"gas {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the extender",
        description=(
            "Run the scheduler extender over HTTPS. Without a kubeconfig and outside a "
            "cluster (or with --demo) it serves a built-in in-memory demo cluster."
        ),
    )
    serve.add_argument("--kubeConfig", help="kubeconfig file (default: in-cluster config)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen port (9001)")
    serve.add_argument(
        "--host", default=None, help="listen address (0.0.0.0; 127.0.0.1 in demo mode)"
    )
    serve.add_argument("--cert", help="server certificate (PEM)")
    serve.add_argument("--key", help="server private key (PEM)")
    serve.add_argument(
        "--cacert",
        help="CA bundle: when given, clients must present a certificate it signed (mutual TLS)",
    )
    _add_bool(serve, "--unsafe", "serve plain HTTP (for tests and local experiments only)")
    _add_bool(serve, "--demo", "serve the built-in demo cluster instead of a real one")
    serve.add_argument("--demoFile", help="YAML file with the demo cluster's nodes and pods")
    _add_bool(serve, "--enableAllowlist", "honour the gas-allow pod annotation")
    _add_bool(serve, "--enableDenylist", "honour the gas-deny pod annotation")
    serve.add_argument(
        "--balancedResource",
        default="",
        help="spread pods over cards: least used gpu.intel.com/<name> first (e.g. tiles)",
    )
    serve.add_argument(
        "--policy",
        choices=("first-fit", "binpack", "spread"),
        default="first-fit",
        help="placement: first-fit (as GAS), binpack (fullest nodes and cards that fit) or "
        "spread (emptiest); a pod's gas-policy annotation overrides it (first-fit)",
    )
    serve.add_argument("--burst", type=int, default=10, help="(accepted for GAS compatibility)")
    serve.add_argument("--qps", type=int, default=5, help="(accepted for GAS compatibility)")
    serve.add_argument("--threads", type=int, default=8, help="request threads (8)")
    serve.add_argument(
        "--maxRequestBytes",
        type=int,
        default=8 * 1024 * 1024,
        help="largest request body accepted; larger ones get 413 (8 MiB)",
    )
    serve.add_argument(
        "--pendingGrace",
        type=_duration,
        default=DEFAULT_PENDING_GRACE,
        help="how long a Binding whose outcome was unknown may still land; after it, the "
        "pod is read and its cards released if it is not bound by gas (2m: keep it above "
        "the API server's --request-timeout)",
    )
    serve.add_argument("--v", type=int, default=2, help="log verbosity: 0-3 info, 4+ debug")
    _add_bool(
        serve,
        "--leaderElect",
        "run several replicas: only the holder of the gas-extender Lease answers and is ready",
    )
    serve.add_argument(
        "--leaderElectNamespace",
        default="",
        help="namespace of the Lease (POD_NAMESPACE, else the pod's own namespace)",
    )
    serve.add_argument(
        "--leaseDuration",
        type=_duration,
        default=15.0,
        help="how long followers wait after the last renewal before taking over (15s)",
    )
    serve.add_argument(
        "--renewDeadline",
        type=_duration,
        default=10.0,
        help="the leader stops answering when it could not renew for this long (10s)",
    )
    serve.add_argument(
        "--retryPeriod",
        type=_duration,
        default=2.0,
        help="how often to renew or try to acquire the Lease (2s)",
    )

    for name, (module_name, help_text) in COMMANDS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


# Other commands: each module has add_arguments(parser) and run(args) -> exit status, and
# keeps heavy imports inside run() so `gas serve` starts fast.
COMMANDS = {
    "certs": (
        "gas.tools.certs",
        "generate the CA, gas's server certificate and kube-scheduler's client certificate",
    ),
    "check-config": (
        "gas.tools.checkconfig.command",
        "check a kube-scheduler configuration that uses gas",
    ),
    "inspect": (
        "gas.tools.inspector.command",
        "show GPU allocation per node and card, from pod annotations",
    ),
    "label-node": ("gas.tools.label_node", "discover this node's GPU cards and label the node"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_go_style(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "v", 2) >= 4 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        return serve(args)
    status: int = args.run(args)
    return status


def _use_demo(args: argparse.Namespace) -> bool:
    if args.demo:
        return True
    if args.kubeConfig or os.environ.get("KUBECONFIG"):
        return False
    from gas.cluster.kube import in_cluster

    if in_cluster():
        return False
    log.info("no kubeconfig and not in a cluster: serving the built-in demo cluster")
    return True


def serve(args: argparse.Namespace) -> int:
    from gas.cluster.demo import load_demo_file
    from gas.serving import server, tls
    from gas.serving.extender import Options

    demo = _use_demo(args)
    kubeconfig = args.kubeConfig or os.environ.get("KUBECONFIG")
    if demo:
        try:
            demo_data = load_demo_file(args.demoFile)
        except (OSError, ValueError) as exc:
            log.error("cannot load the demo cluster: %s", exc)
            return 1
    else:
        from gas.cluster.kube import load_api_client

        try:
            load_api_client(kubeconfig)  # fail here, with a clear message, not in the worker
        except Exception as exc:
            log.error("cannot load Kubernetes client configuration: %s", exc)
            return 1
    host = args.host or ("127.0.0.1" if demo else "0.0.0.0")
    cert, key = args.cert, args.key
    if not args.unsafe and not (cert and key):
        if not demo:
            log.error("HTTPS needs --cert and --key (or --unsafe for plain HTTP)")
            return 2
        directory = tempfile.mkdtemp(prefix="gas-demo-tls-")
        cert, key = tls.write_self_signed(directory, ["localhost"])
        log.info("demo mode: generated a throwaway self-signed certificate %s", cert)
    if not args.unsafe and not args.cacert:
        log.warning("no --cacert: client certificates are not verified")
    from gas.cluster.leader import LEASE_NAME, ElectionConfig, default_identity, default_namespace

    election: ElectionConfig | None = None
    lease_namespace = args.leaderElectNamespace or default_namespace()
    if args.leaderElect:
        if demo:
            log.error("--leaderElect needs a Kubernetes cluster, not the demo cluster")
            return 2
        try:
            election = ElectionConfig(
                identity=default_identity(),
                lease_duration=args.leaseDuration,
                renew_deadline=args.renewDeadline,
                retry_period=args.retryPeriod,
            )
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        log.info(
            "leader election on Lease %s/%s as %s", lease_namespace, LEASE_NAME, election.identity
        )
    electors: list[Elector] = []
    from gas.core.allocator import Policy

    options = Options(
        max_request_bytes=args.maxRequestBytes,
        policy=Policy(
            allowlist=args.enableAllowlist,
            denylist=args.enableDenylist,
            balanced_resource=args.balancedResource,
            placement=args.policy,
        ),
    )

    def app_factory() -> Flask:
        # Runs in the gunicorn worker, where the ledger and its sync threads must live.
        from gas.cluster.protocol import Cluster
        from gas.core.ledger import Ledger
        from gas.serving.extender import create_app
        from gas.serving.metrics import Metrics

        ledger = Ledger(policy=options.policy, pending_grace=args.pendingGrace)
        metrics = Metrics()
        cluster: Cluster
        if demo:
            from gas.cluster.demo import DemoCluster

            cluster = DemoCluster(ledger, demo_data)
        else:
            from gas.cluster.kube import KubeCluster, load_api_client

            api_client = load_api_client(kubeconfig)
            cluster = KubeCluster(ledger, api_client, metrics.sync)
            if election is not None:
                from gas.cluster.leader import (
                    Elector,
                    KubeLeaseStore,
                    LeaderGatedCluster,
                    leader_gauge,
                )

                store = KubeLeaseStore(
                    api_client, lease_namespace, LEASE_NAME, election.renew_deadline
                )
                elector = Elector(
                    store, election, eligible=cluster.synced, on_change=leader_gauge(metrics)
                )
                electors.append(elector)
                cluster = LeaderGatedCluster(cluster, elector)
        cluster.start()
        return create_app(ledger, cluster, options, metrics)

    def on_worker_exit() -> None:
        # After the last request: step down and give the Lease up, so a follower takes
        # over at once rather than after leaseDuration.
        for elector in electors:
            elector.stop()

    scheme = "http" if args.unsafe else "https"
    log.info(
        "gas %s serving %s://%s:%d (%s)",
        __version__,
        scheme,
        host,
        args.port,
        "demo cluster" if demo else "Kubernetes cluster",
    )
    server.serve(
        app_factory,
        host=host,
        port=args.port,
        certfile=None if args.unsafe else cert,
        keyfile=None if args.unsafe else key,
        cafile=None if args.unsafe else args.cacert,
        unsafe=args.unsafe,
        threads=args.threads,
        # Longer than Go's 90 s idle timeout, so kube-scheduler, not gas, closes idle
        # connections: a POST racing a server-side close would fail without a retry.
        keepalive=120,
        on_worker_exit=on_worker_exit,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
