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
import sys
from collections.abc import Sequence

from gas import __version__
from gas.core.durations import DEFAULT_PENDING_GRACE, NANOSECONDS_PER_SECOND, parse_go_duration
from gas.core.model import FIRST_FIT, PLACEMENT_POLICIES
from gas.serving.goflags import add_go_bool
from gas.serving.limit_flags import add_limit_flags

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


def _duration(value: str) -> float:
    """A Go duration (`15s`, `1.5s`, `500ms`, `1m30s`) in seconds."""
    nanoseconds = parse_go_duration(value)
    if nanoseconds is None:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (e.g. 15s, 500ms)")
    if nanoseconds <= 0:
        raise argparse.ArgumentTypeError(f"not a positive duration: {value!r}")
    return nanoseconds / NANOSECONDS_PER_SECOND


def _add_replica_flags(parser: argparse.ArgumentParser) -> None:
    """Several replicas: leader election of gas's own, or following kube-scheduler's."""
    add_go_bool(
        parser,
        "--leaderElect",
        "run several replicas: only the holder of the gas-extender Lease answers and is ready",
    )
    parser.add_argument(
        "--leaderElectNamespace",
        default="",
        help="namespace of the Lease (POD_NAMESPACE, else the pod's own namespace)",
    )
    parser.add_argument(
        "--leaseDuration",
        type=_duration,
        default=15.0,
        help="how long followers wait after the last renewal before taking over (15s)",
    )
    parser.add_argument(
        "--renewDeadline",
        type=_duration,
        default=10.0,
        help="the leader stops answering when it could not renew for this long (10s)",
    )
    parser.add_argument(
        "--retryPeriod",
        type=_duration,
        default=2.0,
        help="how often to renew or try to acquire the Lease; with --schedulerLease, how "
        "often to read it (2s)",
    )
    parser.add_argument(
        "--schedulerLease",
        default="",
        metavar="NAME",
        help="hold no election: answer the scheduler only while kube-scheduler's Lease NAME "
        "(in --leaderElectNamespace) is held by the kube-scheduler of this pod (POD_NAME, "
        "else the hostname) and has not run out; every synced replica is ready",
    )


def _add_health_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--healthPort",
        type=int,
        default=0,
        help="also serve GET /healthz and /readyz over plain HTTP on this port, for kubelet "
        "probes, which present no client certificate (0: off)",
    )
    parser.add_argument(
        "--healthHost",
        default="0.0.0.0",
        help="listen address of --healthPort (0.0.0.0, so probes reach it at the pod's IP "
        "whatever --host is)",
    )


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
            "Run the scheduler extender over HTTPS for the cluster of --kubeConfig (else "
            "KUBECONFIG, else the pod gas runs in), or with --demo for a built-in in-memory "
            "demo cluster."
        ),
    )
    serve.add_argument(
        "--kubeConfig", help="kubeconfig file (default: KUBECONFIG, else in-cluster config)"
    )
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
    add_go_bool(serve, "--unsafe", "serve plain HTTP (for tests and local experiments only)")
    add_go_bool(serve, "--demo", "serve the built-in demo cluster instead of a real one")
    serve.add_argument("--demoFile", help="YAML file with the demo cluster's nodes and pods")
    add_go_bool(serve, "--enableAllowlist", "honour the gas-allow pod annotation")
    add_go_bool(serve, "--enableDenylist", "honour the gas-deny pod annotation")
    serve.add_argument(
        "--balancedResource",
        default="",
        help="spread pods over cards: least used gpu.intel.com/<name> first (e.g. tiles)",
    )
    serve.add_argument(
        "--policy",
        choices=PLACEMENT_POLICIES,
        default=FIRST_FIT,
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
    add_go_bool(
        serve,
        "--bindEvents",
        "post a GPUsAllocated Event on each pod gas binds (a second API write per bind; "
        "failure Events are always posted)",
    )
    serve.add_argument("--v", type=int, default=2, help="log verbosity: 0-3 info, 4+ debug")
    _add_replica_flags(serve)
    _add_health_flags(serve)
    add_limit_flags(serve)

    for name, (module_name, help_text) in COMMANDS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


# Other commands: each module has add_arguments(parser) and run(args) -> exit status, and
# keeps heavy imports inside run() so `gas serve` starts fast. Every parser is built at each
# start, so a module here imports nothing an extra brings (gas node's grpcio, protobuf,
# pyudev): without the extra, its run() says which to install.
COMMANDS = {
    "certs": (
        "gas.tools.certs",
        "generate the CA, gas's server certificate, kube-scheduler's client certificate, and "
        "the admission webhook's certificate and its configuration (with the CA as caBundle)",
    ),
    "check-config": (
        "gas.tools.checkconfig.command",
        "check a kube-scheduler configuration that uses gas",
    ),
    "dra": (
        "gas.dra.command",
        "run the DRA driver: publish this node's cards in a ResourceSlice, shareable by "
        "capacity, and prepare each claim's card for its containers (CDI)",
    ),
    "inspect": (
        "gas.tools.inspector.command",
        "show GPU allocation per node and card, from pod annotations",
    ),
    "label-node": ("gas.tools.label_node", "discover this node's GPU cards and label the node"),
    "node": (
        "gas.node.command",
        "run the node agent: the kubelet device plugin that hands each container the cards "
        "gas chose, and the node's GPU labels and capacity",
    ),
    "top": (
        "gas.tools.top",
        "show each card of this node and the containers using it: their real memory and "
        "engine use, read from the kernel, beside their share",
    ),
    "webhook": (
        "gas.serving.webhook",
        "serve the admission webhook: GPU pods sent to gas's scheduler, GPU pods gas can "
        "never place refused at creation",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_go_style(sys.argv[1:] if argv is None else argv))
    debug = getattr(args, "v", 2) >= 4
    if args.command == "serve":
        # gunicorn's line format, and records made lean: serve writes a decision line per
        # request (gas.serving.logformat).
        from gas.serving import logformat

        logformat.ensure("debug" if debug else "info")
        return serve(args)
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    status: int = args.run(args)
    return status


def serve(args: argparse.Namespace) -> int:
    # The process wiring lives with the extender; importing it here keeps the other
    # commands from loading Flask and gunicorn.
    from gas.serving.main import run

    return run(args, __version__)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
