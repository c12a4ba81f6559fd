"""`gas node`'s command line: its flags (those every agent has come from
`gas.host.flags`). Nothing here imports grpcio or protobuf: the agent itself
(gas/node/agent.py) is loaded only when `gas node` runs.
"""

from __future__ import annotations

import argparse
import logging

from gas.host import flags
from gas.node.devices import DEFAULT_SHARES_PER_CARD, MAX_SHARES_PER_CARD
from gas.node.sockets import DEFAULT_PLUGIN_DIR, DEFAULT_POD_RESOURCES_SOCKET

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9102


def _shares(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_SHARES_PER_CARD:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_SHARES_PER_CARD}, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_identity(parser)
    parser.add_argument(
        "--shares-per-card",
        "--shared-dev-num",
        dest="shares_per_card",
        type=_shares,
        default=DEFAULT_SHARES_PER_CARD,
        help="how many containers may share one card: device IDs advertised per card "
        f"({DEFAULT_SHARES_PER_CARD})",
    )
    flags.add_cards(parser)
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
    flags.add_usage(parser)
    flags.add_running(parser, DEFAULT_METRICS_PORT)


def _load() -> flags.AgentRun:
    from gas.node import agent

    return agent.run


run = flags.run_agent("node", _load)
