"""Fake sysfs trees with GPU cards laid out and linked as the kernel does, for discovery
and the node agent's tests.

    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1, driver="xe", tiles=2)])
    discover_sysfs(sysfs)

Each card is a PCI device `devices/pci0000:00/<address>` (vendor, device, numa_node,
sriov_numvfs, a `driver` link into `bus/pci/drivers/<driver>`, xe's `tile<N>` folders) with
`drm/card<N>` (i915's `lmem_total_bytes` and `gt/gt<N>`, a connector) and `drm/renderD<M>`
beside it, both linked from `class/drm`. `remove_card` and `add_card` unplug and plug a card
back, as the kernel removes and adds those entries; `unbind_card` and `bind_card` unbind its
driver (the PCI function stays) and bind it again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class FakeCard:
    number: int
    driver: str = "i915"
    """`i915`, `xe`, or "" for a card whose device has no driver link."""
    tiles: int = 1
    """Tile entries the driver lists (`gt/gt<N>` for i915, `tile<N>` for xe); 0: none."""
    lmem_per_tile: int | None = 16 * GIB
    """`lmem_total_bytes`; None: no such file, as on an integrated GPU."""
    numa: int | None = 0
    """`numa_node` (-1: the platform does not say); None: no such file."""
    render_minor: int | None = None
    """The M of `renderD<M>`; None: 128 + the card number."""
    render: bool = True
    """False: the card has no render node."""
    sriov_numvfs: int | None = None
    """`sriov_numvfs`; None: not an SR-IOV physical function."""
    vendor: str = "0x8086"
    bus: int | None = None
    """The PCI bus of the card's address `0000:<bus>:00.0`; None: the card number + 3."""

    @property
    def pci_address(self) -> str:
        return f"0000:{(self.number + 3 if self.bus is None else self.bus):02x}:00.0"

    @property
    def render_node(self) -> str | None:
        if not self.render:
            return None
        return f"renderD{128 + self.number if self.render_minor is None else self.render_minor}"


def kernel_link(link: Path, target: Path) -> None:
    """A relative symlink as the kernel makes them: up to the common ancestor of the link's
    and the target's directories, then down (`device -> ../../../0000:03:00.0`)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    base = Path(os.path.commonpath([link.parent, target.parent]))
    up = len(link.parent.relative_to(base).parts)
    link.symlink_to("../" * up + str(target.relative_to(base)))


def write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _pci_dir(sysfs: Path, card: FakeCard) -> Path:
    return sysfs / "devices" / "pci0000:00" / card.pci_address


def _drm_entry(sysfs: Path, pci: Path, name: str) -> Path:
    device = pci / "drm" / name
    write_file(device / "uevent", f"DEVNAME=dri/{name}\n")
    kernel_link(device / "subsystem", sysfs / "class" / "drm")
    kernel_link(device / "device", pci)
    kernel_link(sysfs / "class" / "drm" / name, device)
    return device


def add_card(sysfs: Path, card: FakeCard) -> None:
    """Plug `card` into the tree."""
    pci = _pci_dir(sysfs, card)
    if pci.exists():
        raise ValueError(f"{card.pci_address} is already in {sysfs}")
    write_file(pci / "uevent", f"PCI_SLOT_NAME={card.pci_address}\n")
    write_file(pci / "vendor", f"{card.vendor}\n")
    write_file(pci / "device", "0x56a0\n")
    if card.numa is not None:
        write_file(pci / "numa_node", f"{card.numa}\n")
    if card.sriov_numvfs is not None:
        write_file(pci / "sriov_totalvfs", "16\n")
        write_file(pci / "sriov_numvfs", f"{card.sriov_numvfs}\n")
    kernel_link(pci / "subsystem", sysfs / "bus" / "pci")
    kernel_link(sysfs / "bus" / "pci" / "devices" / card.pci_address, pci)
    if card.driver:
        drivers = sysfs / "bus" / "pci" / "drivers" / card.driver
        drivers.mkdir(parents=True, exist_ok=True)
        kernel_link(pci / "driver", drivers)
    drm = _drm_entry(sysfs, pci, f"card{card.number}")
    connector = drm / f"card{card.number}-DP-1"
    write_file(connector / "uevent", "")
    kernel_link(connector / "subsystem", sysfs / "class" / "drm")
    kernel_link(sysfs / "class" / "drm" / connector.name, connector)
    if card.render_node is not None:
        _drm_entry(sysfs, pci, card.render_node)
    if card.lmem_per_tile is not None:
        write_file(drm / "lmem_total_bytes", f"{card.lmem_per_tile}\n")
    for tile in range(card.tiles):
        if card.driver == "xe":
            write_file(pci / f"tile{tile}" / "physical_vram_size_bytes", "0\n")
        else:
            write_file(drm / "gt" / f"gt{tile}" / "id", f"{tile}\n")


def unbind_card(sysfs: Path, card: FakeCard) -> None:
    """Unbind the card's driver, as `echo <address> > .../drivers/<driver>/unbind` does: the
    DRM devices the driver made go (their `class/drm` links and folders), the PCI function
    stays, with no `driver` link."""
    pci = _pci_dir(sysfs, card)
    for name in (f"card{card.number}", f"card{card.number}-DP-1", card.render_node):
        if name is not None:
            (sysfs / "class" / "drm" / name).unlink(missing_ok=True)
    shutil.rmtree(pci / "drm", ignore_errors=True)
    (pci / "driver").unlink(missing_ok=True)


def bind_card(sysfs: Path, card: FakeCard) -> None:
    """Bind the driver again: the `driver` link and the DRM devices come back."""
    shutil.rmtree(_pci_dir(sysfs, card))
    (sysfs / "bus" / "pci" / "devices" / card.pci_address).unlink()
    add_card(sysfs, card)


def remove_card(sysfs: Path, card: FakeCard) -> None:
    """Unplug `card`: its `class/drm` links and its PCI device go."""
    for name in (f"card{card.number}", f"card{card.number}-DP-1", card.render_node):
        if name is not None:
            (sysfs / "class" / "drm" / name).unlink()
    (sysfs / "bus" / "pci" / "devices" / card.pci_address).unlink()
    shutil.rmtree(_pci_dir(sysfs, card))


def write_sysfs(sysfs: Path, cards: Iterable[FakeCard]) -> Path:
    """A sysfs tree at `sysfs` with these cards; returns `sysfs`."""
    (sysfs / "class" / "drm").mkdir(parents=True, exist_ok=True)
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    write_file(sysfs / "devices" / "pci0000:00" / "uevent", "")
    for card in cards:
        add_card(sysfs, card)
    return sysfs
