"""The PCI facts a card's DRA device carries that the agents' discovery
(`gas.host.discovery`) does not read: the PCI device id and the PCIe root complex, from the
card's PCI device in sysfs."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from gas.dra.slices import PciFacts
from gas.host.cards import Card

log = logging.getLogger(__name__)

_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


def _device_id(pci_dir: Path) -> str:
    try:
        text = (pci_dir / "device").read_text(encoding="ascii").strip().lower()
        return f"0x{int(text.removeprefix('0x'), 16):04x}"
    except (OSError, ValueError):
        return ""


def pcie_root(resolved: Path) -> str:
    """`pci<domain>:<bus>`, the host bridge folder above the device in /sys/devices."""
    for part in resolved.parts:
        if _HOST_BRIDGE.match(part):
            return part
    return ""


def pci_facts(sysfs_root: str | os.PathLike[str], card: Card) -> PciFacts:
    if not card.pci_address:
        return PciFacts()
    link = Path(sysfs_root) / "bus" / "pci" / "devices" / card.pci_address
    try:
        resolved = link.resolve(strict=True)
    except (OSError, RuntimeError):
        log.warning("%s: no PCI device %s under %s", card.name, card.pci_address, sysfs_root)
        return PciFacts()
    return PciFacts(_device_id(resolved), pcie_root(resolved))


def facts_of(sysfs_root: str | os.PathLike[str], cards: Iterable[Card]) -> dict[str, PciFacts]:
    return {card.name: pci_facts(sysfs_root, card) for card in cards}
