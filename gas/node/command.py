"""`gas node`'s command line: its flags, and the check that the `node` extra is installed.

`gas` builds every command's parser at each start, so nothing here may import grpcio or
protobuf: the agent itself (gas/node/agent.py) is loaded only when `gas node` runs, and
without the extra the command says what to install instead of failing on an import.
"""

from __future__ import annotations

import argparse
import logging
import os

from gas.node import discovery
from gas.node.devices import DEFAULT_SHARES_PER_CARD, MAX_SHARES_PER_CARD
from gas.node.sockets import DEFAULT_PLUGIN_DIR, DEFAULT_POD_RESOURCES_SOCKET

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9102
NODE_EXTRA = "pip install 'gas-gpu-sharing[node]'"
EXTRA_MODULES = frozenset({"grpc", "google", "pyudev"})
"""The top-level modules the `node` extra brings (protobuf's is `google`)."""


def _shares(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_SHARES_PER_CARD:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_SHARES_PER_CARD}, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's name (default: $NODE_NAME, from the downward API)",
    )
    parser.add_argument(
        "--kubeconfig",
        "--kubeConfig",
        dest="kubeconfig",
        help="kubeconfig file (default: in-cluster configuration)",
    )
    parser.add_argument(
        "--shares-per-card",
        "--shared-dev-num",
        dest="shares_per_card",
        type=_shares,
        default=DEFAULT_SHARES_PER_CARD,
        help="how many containers may share one card: device IDs advertised per card "
        f"({DEFAULT_SHARES_PER_CARD})",
    )
    discovery.add_arguments(parser)
    parser.add_argument(
        "--devfs-root",
        default="/dev",
        help="host /dev, where the cards' device nodes are (/dev)",
    )
    parser.add_argument(
        "--device-plugin-dir",
        default=DEFAULT_PLUGIN_DIR,
        help=f"the kubelet's device-plugin directory ({DEFAULT_PLUGIN_DIR})",
    )
    parser.add_argument(
        "--pod-resources-socket",
        default=DEFAULT_POD_RESOURCES_SOCKET,
        help=f"the kubelet's pod-resources socket ({DEFAULT_POD_RESOURCES_SOCKET})",
    )
    parser.add_argument(
        "--numa",
        action="store_true",
        help="also write the gpu.intel.com/numa-gpu-map node label",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help=f"Prometheus metrics port, 0 for none ({DEFAULT_METRICS_PORT})",
    )
    parser.add_argument("--metrics-host", default="0.0.0.0", help="metrics listen address")
    parser.add_argument(
        "--rescan",
        type=float,
        default=None,
        metavar="SECONDS",
        help="rediscover the cards this often besides on udev events "
        "(600; 5 with --sysfs-root, which has no events)",
    )
    parser.add_argument("--v", type=int, default=2, help="log verbosity: 0-3 info, 4+ debug")


def run(args: argparse.Namespace) -> int:
    try:
        from gas.node import agent
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in EXTRA_MODULES:
            raise
        log.error("gas node needs the node extra: %s (no module named %r)", NODE_EXTRA, exc.name)
        return 2
    return agent.run(args)
