"""`gas label-node`: find this node's GPU cards and write the node labels gas and GAS read.

A thin command over the node side's modules, each tested alone:

1. discovery (`gas.host.discovery`): DRM `card<N>` devices whose parent device is on the
   PCI bus, as `Card` records, either through udev (pyudev, the default) or by reading a
   sysfs tree directly (`--sysfs-root`), filtered by `--vendor`;
2. labels (`gas.host.labels`): a pure function of the cards, and the change against the
   node's current labels, which also removes labels that are no longer true;
3. the write: one JSON merge patch of the node's labels, or none when nothing changed.

Labels written: `gpu.intel.com/gpu-numbers` (`0.1.2`), `gpu.intel.com/cards`
(`card0.card1.card2`, deprecated but still read by GAS) and, with `--numa`,
`gpu.intel.com/numa-gpu-map` (`0-0.1_1-2.3`). `gas node` writes the same labels (and the
tile count) itself: run one or the other on a node, not both.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from gas.host.cards import Card
from gas.host.discovery import (
    INTEL,
    normalize_vendor,
    pci_cards_sysfs,
    pci_cards_udev,
    udev_context,
)
from gas.host.errors import NodeError
from gas.host.kubeapi import core_api, describe_api_error
from gas.host.labels import LABEL_NUMA_GPU_MAP, apply_labels, card_labels, managed_bases
from gas.host.watch import card_monitor, udev_card_events, watch_loop

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- which cards


def discover_sysfs(root: str | os.PathLike[str] = "/sys") -> list[Card]:
    """Every PCI DRM card under a sysfs tree, any vendor: `--vendor` filters them."""
    return pci_cards_sysfs(root)


def discover_udev() -> list[Card]:
    """Every PCI DRM card udev lists, any vendor: `--vendor` filters them."""
    return pci_cards_udev()


def parse_vendors(values: Sequence[str] | None) -> frozenset[str] | None:
    """`--vendor` values (repeatable, comma lists) -> vendor ids; None means any vendor."""
    items = [item.strip() for value in values or () for item in value.split(",")]
    items = [item for item in items if item]
    if not items:
        return frozenset({INTEL})
    if any(item.lower() == "any" for item in items):
        return None
    vendors = set()
    for item in items:
        vendor = normalize_vendor(item)
        if not vendor:
            raise ValueError(f"not a PCI vendor id: {item!r} (e.g. 0x8086, intel, any)")
        vendors.add(vendor)
    return frozenset(vendors)


def select_cards(cards: Iterable[Card], vendors: frozenset[str] | None) -> list[Card]:
    return sorted(
        (c for c in cards if vendors is None or c.vendor in vendors), key=lambda c: c.number
    )


# ---------------------------------------------------------------- one labelling pass


@dataclass
class Labeller:
    """One pass: discover, compute, then print (dry run: no `api`) or patch.

    When watching, passes that find what the previous one found log at debug level only,
    so the periodic resync does not fill the log.
    """

    discover: Callable[[], list[Card]]
    vendors: frozenset[str] | None
    numa: bool
    node: str | None
    api: Any = None
    out: TextIO | None = None
    _last: list[Card] | None = field(default=None, init=False, repr=False)
    _level: int = field(default=logging.INFO, init=False, repr=False)

    def desired(self) -> tuple[list[Card], dict[str, str]]:
        cards = select_cards(self.discover(), self.vendors)
        level = self._level = logging.DEBUG if cards == self._last else logging.INFO
        self._last = cards
        if cards:
            log.log(
                level,
                "found %s",
                ", ".join(
                    f"{c.name} ({c.vendor or 'unknown vendor'} at {c.pci_address or '?'}, "
                    f"NUMA {'unknown' if c.numa_node is None else c.numa_node})"
                    for c in cards
                ),
            )
            unknown = [c.name for c in cards if c.numa_node is None]
            if self.numa and unknown:
                log.log(
                    level,
                    "NUMA node unknown for %s: left out of the NUMA map",
                    ", ".join(unknown),
                )
        else:
            wanted = "any vendor" if self.vendors is None else ", ".join(sorted(self.vendors))
            log.log(level, "no GPU cards found (vendor %s)", wanted)
        return cards, card_labels(cards, self.numa)

    def once(self) -> bool:
        """Label the node; False (after logging why) when it failed."""
        try:
            cards, labels = self.desired()
        except (NodeError, ValueError, OSError) as exc:
            log.error("%s", exc)
            return False
        if self.api is None:
            if not cards:
                log.info("dry run: gas's labels would be removed from the node")
            print(json.dumps(labels, indent=2, sort_keys=True), file=self.out or sys.stdout)
            return True
        assert self.node is not None
        try:
            changes = apply_labels(self.api, self.node, labels, managed_bases(self.numa))
        except Exception as exc:  # any client, transport or decoding failure of the call
            log.error("%s", describe_api_error(exc, self.node))
            return False
        if not changes:
            log.log(self._level, "node %s: labels already up to date", self.node)
            return True
        removed = sorted(k for k, v in changes.items() if v is None)
        written = {k: v for k, v in changes.items() if v is not None}
        if written:
            log.info(
                "node %s: set %s", self.node, ", ".join(f"{k}={v}" for k, v in written.items())
            )
        if removed:
            why = "no cards found" if not cards else "no longer true"
            log.info("node %s: removed %s (%s)", self.node, ", ".join(removed), why)
        return True


# ---------------------------------------------------------------- command line


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node", help="the node to label (default: $NODE_NAME, from the downward API)"
    )
    parser.add_argument("--kubeConfig", help="kubeconfig file (default: in-cluster config)")
    parser.add_argument(
        "--vendor",
        action="append",
        metavar="ID",
        help="PCI vendor of the cards to list: 0x8086 (default), intel, amd, nvidia, any; "
        "repeat or give a comma list",
    )
    parser.add_argument(
        "--numa", action="store_true", help=f"also write {LABEL_NUMA_GPU_MAP} (0-0.1_1-2.3)"
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="keep running: relabel when cards are added or removed (udev) and every --resync",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the labels as JSON instead of writing them (no API call)",
    )
    parser.add_argument(
        "--sysfs-root",
        metavar="DIR",
        help="read the cards from this sysfs tree (e.g. /sys) instead of asking udev",
    )
    parser.add_argument(
        "--debounce",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="with --watch: quiet time after a card event before relabelling (1)",
    )
    parser.add_argument(
        "--resync",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="with --watch: relabel this often even without events; 0: never (600)",
    )
    parser.add_argument("--v", type=int, default=2, help="log verbosity: 0-3 info, 4+ debug")


def run(args: argparse.Namespace) -> int:
    try:
        vendors = parse_vendors(args.vendor)
    except ValueError as exc:
        log.error("--vendor: %s", exc)
        return 2
    node = args.node or os.environ.get("NODE_NAME") or None
    if not args.dry_run and not node:
        log.error("no node name: give --node or set NODE_NAME")
        return 2
    sysfs_root = args.sysfs_root
    discover: Callable[[], list[Card]] = (
        discover_udev if sysfs_root is None else lambda: discover_sysfs(sysfs_root)
    )
    labeller = Labeller(discover=discover, vendors=vendors, numa=args.numa, node=node)
    monitor = None
    try:
        if args.watch:
            try:
                # Listening before the first pass, no event can fall in between.
                monitor = card_monitor()
            except OSError as exc:
                raise NodeError(f"cannot listen to kernel device events: {exc}") from exc
        elif sysfs_root is None:
            udev_context()  # fail with the install hint, not a traceback
        if not args.dry_run:
            labeller.api = core_api(args.kubeConfig)
    except NodeError as exc:
        log.error("%s", exc)
        return 1
    if monitor is None:
        return 0 if labeller.once() else 1
    log.info("watching for GPU cards being added or removed")
    watch_loop(labeller.once, udev_card_events(monitor), debounce=args.debounce, resync=args.resync)
    return 0
