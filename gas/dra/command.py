"""`gas dra`'s command line: its flags, and the check that the `node` extra is installed.

Nothing here imports grpcio or protobuf: `gas` builds every command's parser at each
start, and the driver itself (gas/dra/agent.py) is loaded only when `gas dra` runs.
"""

from __future__ import annotations

import argparse
import logging
import os

from gas.dra.driver import DEFAULT_CDI_DIR, DEFAULT_KUBELET_ROOT, DEFAULT_STATE_DIR
from gas.node import discovery

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9103
"""Beside `gas node`'s 9102: a node runs one or the other, but a port of its own keeps a
scrape configuration from mixing them up."""
NODE_EXTRA = "pip install 'gas-gpu-sharing[node]'"
EXTRA_MODULES = frozenset({"grpc", "google", "pyudev"})


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
    discovery.add_arguments(parser)
    parser.add_argument(
        "--devfs-root",
        default="/dev",
        help="host /dev, where the cards' device nodes are (/dev)",
    )
    parser.add_argument(
        "--kubelet-root-dir",
        default=DEFAULT_KUBELET_ROOT,
        help="the kubelet's root directory: the registration socket goes in its "
        f"plugins_registry/, the DRA socket in plugins/<driver>/ ({DEFAULT_KUBELET_ROOT})",
    )
    parser.add_argument(
        "--cdi-dir",
        default=DEFAULT_CDI_DIR,
        help=f"where the claims' CDI specs are written; the runtime must read it "
        f"({DEFAULT_CDI_DIR})",
    )
    parser.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help=f"where the prepared claims are recorded across restarts ({DEFAULT_STATE_DIR})",
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
        from gas.dra import agent
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in EXTRA_MODULES:
            raise
        log.error("gas dra needs the node extra: %s (no module named %r)", NODE_EXTRA, exc.name)
        return 2
    return agent.run(args)
