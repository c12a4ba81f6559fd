"""What both node agents (`gas node`, `gas dra`) share on their command line: the flags
every agent has, and the check that the `node` extra is installed.

Nothing here imports grpcio or protobuf: `gas` builds every command's parser at each
start, and an agent itself is loaded only when its command runs, so that without the
extra the command says what to install instead of failing on an import.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

from gas.host import discovery

log = logging.getLogger(__name__)

NODE_EXTRA = "pip install 'gas-gpu-sharing[node]'"
EXTRA_MODULES = frozenset({"grpc", "google", "pyudev"})
"""The top-level modules the `node` extra brings (protobuf's is `google`)."""


def add_identity(parser: argparse.ArgumentParser) -> None:
    """Which node the agent serves, and how it reaches the API server."""
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


def add_cards(parser: argparse.ArgumentParser) -> None:
    """Where the cards are read from, and where their device nodes are."""
    discovery.add_arguments(parser)
    parser.add_argument(
        "--devfs-root",
        default="/dev",
        help="host /dev, where the cards' device nodes are (/dev)",
    )


def add_running(parser: argparse.ArgumentParser, metrics_port: int) -> None:
    """The metrics port, the rediscovery period and the log level."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=metrics_port,
        help=f"Prometheus metrics port, 0 for none ({metrics_port})",
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


AgentRun = Callable[[argparse.Namespace], int]


def run_agent(command: str, load: Callable[[], AgentRun]) -> AgentRun:
    """`run(args)` for an agent's command: `load()` imports the agent (grpcio and all) and
    returns its run function; without the extra, one line says what to install."""

    def run(args: argparse.Namespace) -> int:
        try:
            agent_run = load()
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in EXTRA_MODULES:
                raise
            log.error(
                "gas %s needs the node extra: %s (no module named %r)",
                command,
                NODE_EXTRA,
                exc.name,
            )
            return 2
        return agent_run(args)

    return run


def add_usage(parser: argparse.ArgumentParser) -> None:
    """What the agents read of the containers' real GPU use, and do about over-use
    (docs/usage.md)."""
    parser.add_argument(
        "--usage-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="read each container's GPU use this often; 0 turns it off (10)",
    )
    parser.add_argument(
        "--proc-root",
        default="/proc",
        metavar="DIR",
        help="the host's /proc, where the processes' DRM clients and cgroups are read (/proc)",
    )
    parser.add_argument(
        "--overuse-grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a container may hold more device memory than its share before it is "
        "reported (30)",
    )
    parser.add_argument(
        "--overuse-policy",
        choices=("report", "evict"),
        default="report",
        help="report over-use (an Event, a counter, a log line), or also evict the pod most "
        "over its share while its card is contended (report)",
    )
