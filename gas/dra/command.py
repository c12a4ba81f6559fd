"""`gas dra`'s command line: its flags (those every agent has come from `gas.host.flags`).
Nothing here imports grpcio or protobuf: the driver itself (gas/dra/agent.py) is loaded only
when `gas dra` runs.
"""

from __future__ import annotations

import argparse
import os

from gas.dra.driver import DEFAULT_CDI_DIR, DEFAULT_KUBELET_ROOT, DEFAULT_STATE_DIR
from gas.host import flags

TAINT_EFFECTS = ("NoExecute", "NoSchedule")
DEFAULT_HEALTH_INTERVAL = 5.0
DEFAULT_SLICE_RESYNC = 600.0

DEFAULT_METRICS_PORT = 9103
"""Beside `gas node`'s 9102: a node runs one or the other, but a port of its own keeps a
scrape configuration from mixing them up."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_identity(parser)
    flags.add_cards(parser)
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
        help="where the prepared claims and the cards seen are recorded across restarts, "
        f"shared with the other gas dra of a rolling update ({DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--pod-uid",
        default=os.environ.get("POD_UID", ""),
        help="this pod's UID, named in the kubelet sockets so that two gas dra of a rolling "
        "update serve side by side (default: $POD_UID, from the downward API; none: the "
        "sockets of a single instance)",
    )
    parser.add_argument(
        "--unhealthy-taint-effect",
        choices=TAINT_EFFECTS,
        default=TAINT_EFFECTS[0],
        help="the effect of the taint an unhealthy card carries in the slice: NoExecute "
        "also evicts the pods on it, NoSchedule only keeps new claims off (NoExecute)",
    )
    parser.add_argument(
        "--health-interval",
        type=_positive,
        default=DEFAULT_HEALTH_INTERVAL,
        metavar="SECONDS",
        help=f"judge the cards' health this often ({DEFAULT_HEALTH_INTERVAL:g})",
    )
    parser.add_argument(
        "--slice-resync",
        type=_positive,
        default=DEFAULT_SLICE_RESYNC,
        metavar="SECONDS",
        help="check the slice against the API server itself this often, besides on the "
        f"watches' events ({DEFAULT_SLICE_RESYNC:g})",
    )
    flags.add_usage(parser)
    flags.add_running(parser, DEFAULT_METRICS_PORT)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _load() -> flags.AgentRun:
    from gas.dra import agent

    return agent.run


run = flags.run_agent("dra", _load)
