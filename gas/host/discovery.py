"""This node's GPU cards, read from sysfs or udev, and udev's events as cards come and go.

Two views of the same devices:

- `pci_cards_sysfs` / `pci_cards_udev`: every DRM card whose own parent device is on the
  PCI bus, of any vendor, with the facts every such card has (name, number, vendor, NUMA
  node, PCI address). `gas label-node` lists these and filters them by its `--vendor`.
- `discover_sysfs` / `discover_udev`: Intel cards only, each with everything the node agent
  needs: the render node (the `renderD<M>` entry under the card's device, never computed
  from the card number), the driver (`i915` or `xe`, from the device's `driver` link), the
  tile count (`gt/gt<N>` under an i915 card, `device/tile<N>` of an xe card, 1 when none)
  and the usable local memory (`lmem_total_bytes` per tile * tiles - a reserved amount; a
  card without `lmem_total_bytes`, such as an integrated GPU, gets the override).

Both views leave out a physical function with SR-IOV virtual functions enabled
(`device/sriov_numvfs` > 0): its virtual functions are the devices to hand out, and a
container given the physical function would share it with every virtual machine.

`gas.host.watch` follows the cards as they come and go.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gas.core.model import card_number, is_card_name
from gas.core.quantity import QuantityError, format_quantity, parse_quantity
from gas.host.cards import Card
from gas.host.errors import NodeError

log = logging.getLogger(__name__)

INTEL = "0x8086"
VENDOR_ALIASES = {"intel": INTEL, "amd": "0x1002", "nvidia": "0x10de"}
DRIVERS = ("i915", "xe")
ENV_MEMORY_RESERVED = "GPU_MEMORY_RESERVED"
ENV_MEMORY_OVERRIDE = "GPU_MEMORY_OVERRIDE"
INSTALL_HINT = (
    "reading GPU cards through udev needs pyudev: pip install 'gas-gpu-sharing[labeler]' (or "
    "'pyudev>=0.24'), and libudev (Debian: libudev1); --sysfs-root /sys reads the cards from "
    "sysfs without it"
)

_RENDER_NODE = re.compile(r"^renderD(0|[1-9][0-9]{0,5})$")
_I915_TILE = re.compile(r"^gt(0|[1-9][0-9]{0,3})$")
_XE_TILE = re.compile(r"^tile[0-9]$")


# ---------------------------------------------------------------- small readers


def normalize_vendor(text: str) -> str:
    """`0x8086`, `8086`, `0X8086` or an alias -> `0x8086`; "" when unreadable."""
    text = text.strip().lower()
    text = VENDOR_ALIASES.get(text, text)
    try:
        value = int(text.removeprefix("0x"), 16)
    except ValueError:
        return ""
    return f"0x{value:04x}" if 0 <= value <= 0xFFFF else ""


def parse_numa_node(text: str | None) -> int | None:
    """The kernel writes -1 when the platform does not say; that, like a missing or
    unreadable attribute, is an unknown node."""
    if text is None:
        return None
    try:
        node = int(text.strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def _count(text: str | None) -> int | None:
    """A sysfs number (decimal, or hex with `0x`); None when missing or not a number."""
    if text is None:
        return None
    text = text.strip().lower()
    try:
        value = int(text[2:], 16) if text.startswith("0x") else int(text, 10)
    except ValueError:
        return None
    return value if value >= 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _link_name(path: Path) -> str:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return ""


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value if isinstance(value, str) else None


def _sorted(cards: Iterable[Card]) -> list[Card]:
    return sorted(cards, key=lambda card: card.number)


def _sriov_skipped(name: str, numvfs: str | None) -> bool:
    vfs = _count(numvfs)
    if vfs:
        log.info(
            "%s: SR-IOV physical function with %d virtual functions enabled, skipped "
            "(its virtual functions are the devices to share)",
            name,
            vfs,
        )
    return bool(vfs)


# ---------------------------------------------------------------- the sysfs backend


def sysfs_pci_attributes(pci_dir: Path) -> tuple[str, int | None]:
    """Vendor and NUMA node of a PCI device from its sysfs directory."""
    return normalize_vendor(_read(pci_dir / "vendor") or ""), parse_numa_node(
        _read(pci_dir / "numa_node")
    )


def _sysfs_entries(root: str | os.PathLike[str]) -> Iterator[tuple[Card, Path]]:
    """Each PCI DRM card under a sysfs tree, with its directory (`class/drm/card<N>`)."""
    drm = Path(root) / "class" / "drm"
    try:
        names = os.listdir(drm)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise NodeError(f"cannot read {drm}: {exc}") from exc
    for name in names:
        if not is_card_name(name):
            continue
        # `device` points at the card's parent device, as udev's parent does.
        try:
            parent = (drm / name / "device").resolve(strict=True)
        except (OSError, RuntimeError):
            log.debug("%s: no parent device, skipped", name)
            continue
        if _link_name(parent / "subsystem") != "pci":
            log.debug("%s: parent device is not on the PCI bus, skipped", name)
            continue
        if _sriov_skipped(name, _read(parent / "sriov_numvfs")):
            continue
        vendor, numa = sysfs_pci_attributes(parent)
        yield Card(name, card_number(name), vendor, numa, parent.name), drm / name


def pci_cards_sysfs(root: str | os.PathLike[str] = "/sys") -> list[Card]:
    """Every DRM card on the PCI bus under a sysfs tree, any vendor, without the details
    (render node, driver, tiles, memory) only Intel cards are read for."""
    return _sorted(card for card, _ in _sysfs_entries(root))


def discover_sysfs(
    root: str | os.PathLike[str] = "/sys",
    *,
    memory_reserved: int = 0,
    memory_override: int | None = None,
) -> list[Card]:
    """The Intel cards under a sysfs tree with every fact, read without udev: the same
    records as `discover_udev` for the live `/sys`, and usable on a copy or a fake tree
    (libudev only reads `/sys`)."""
    return _sorted(
        with_details(card, card_dir, memory_reserved, memory_override)
        for card, card_dir in _sysfs_entries(root)
        if card.vendor == INTEL
    )


# ---------------------------------------------------------------- the details of a card


def render_node(card_dir: Path) -> str | None:
    """The card's `renderD<M>`, listed beside it under its device's `drm` folder."""
    found = sorted(
        (n for n in _listdir(card_dir / "device" / "drm") if _RENDER_NODE.match(n)),
        key=lambda n: int(n.removeprefix("renderD")),
    )
    if len(found) > 1:
        log.warning("%s: several render nodes (%s), using %s", card_dir.name, found, found[0])
    return found[0] if found else None


def tile_count(card_dir: Path, driver: str) -> int:
    """`gt/gt<N>` for i915, `device/tile<N>` for xe (either, for another driver); 1 when the
    driver lists none, as a card without tiles is one tile."""
    i915 = sum(1 for n in _listdir(card_dir / "gt") if _I915_TILE.match(n))
    xe = sum(1 for n in _listdir(card_dir / "device") if _XE_TILE.match(n))
    count = {"i915": i915, "xe": xe}.get(driver, i915 + xe)
    return max(count, 1)


def card_memory(
    name: str, per_tile: int | None, tiles: int, reserved: int, override: int | None
) -> int:
    """Usable local memory in bytes over all tiles: `per_tile * tiles - reserved`; a
    card that reports none gets `override` (0 without one)."""
    if per_tile is None:
        return override or 0
    total = per_tile * tiles - reserved
    if total < 0:
        log.warning(
            "%s: reserved memory %s exceeds its local memory %s: counted as 0",
            name,
            format_quantity(reserved),
            format_quantity(per_tile * tiles),
        )
        return 0
    return total


def with_details(
    card: Card, card_dir: Path, memory_reserved: int = 0, memory_override: int | None = None
) -> Card:
    """`card` with its render node, driver, tiles and memory read from its sysfs folder."""
    driver = _link_name(card_dir / "device" / "driver")
    if driver not in DRIVERS:
        log.warning("%s: driver %r is neither i915 nor xe", card.name, driver or "(none)")
    tiles = tile_count(card_dir, driver)
    lmem = _read(card_dir / "lmem_total_bytes")
    per_tile = _count(lmem)
    if lmem is not None and per_tile is None:
        log.error("%s: lmem_total_bytes %r is not a number of bytes", card.name, lmem.strip())
    render = render_node(card_dir)
    if render is None:
        log.warning("%s: no render node under its device", card.name)
    return Card(
        card.name,
        card.number,
        card.vendor,
        card.numa_node,
        card.pci_address,
        render_node=render,
        driver=driver,
        tiles=tiles,
        memory=card_memory(card.name, per_tile, tiles, memory_reserved, memory_override),
    )


# ---------------------------------------------------------------- the udev backend


class UdevAttributes(Protocol):
    def get(self, attribute: str) -> Any: ...


class UdevDevice(Protocol):
    """What the udev backend uses of a `pyudev.Device`."""

    @property
    def sys_name(self) -> str: ...

    @property
    def subsystem(self) -> str | None: ...

    @property
    def parent(self) -> UdevDevice | None: ...

    @property
    def attributes(self) -> UdevAttributes: ...


class UdevCardDevice(UdevDevice, Protocol):
    """A udev device with its sysfs folder, where a card's details are read."""

    @property
    def sys_path(self) -> str: ...


_Device = TypeVar("_Device", bound=UdevDevice)


def udev_pci_attributes(pci: UdevDevice) -> tuple[str, int | None]:
    """Vendor and NUMA node of a PCI device seen through udev."""
    vendor = _text(pci.attributes.get("vendor"))
    numa = _text(pci.attributes.get("numa_node"))
    return normalize_vendor(vendor or ""), parse_numa_node(numa)


def _udev_entries(devices: Iterable[_Device]) -> Iterator[tuple[Card, _Device]]:
    for device in devices:
        name = device.sys_name
        if not is_card_name(name):
            continue
        parent = device.parent
        if parent is None or parent.subsystem != "pci":
            log.debug("%s: parent device is not on the PCI bus, skipped", name)
            continue
        if _sriov_skipped(name, _text(parent.attributes.get("sriov_numvfs"))):
            continue
        vendor, numa = udev_pci_attributes(parent)
        yield Card(name, card_number(name), vendor, numa, parent.sys_name), device


def cards_from_udev(devices: Iterable[UdevDevice]) -> list[Card]:
    """Cards among udev devices of the drm subsystem, any vendor, without details.

    Only the card nodes count: render nodes (`renderD128`) and connectors (`card0-DP-1`)
    belong to a card already. The card's own parent must be the PCI device: a USB display
    adapter's nearest PCI ancestor is its USB host controller, often an Intel one.
    """
    return _sorted(card for card, _ in _udev_entries(devices))


def load_pyudev() -> Any:
    try:
        import pyudev
    except ImportError as exc:
        raise NodeError(INSTALL_HINT) from exc
    return pyudev


def udev_context() -> Any:
    """A `pyudev.Context`; NodeError with the install hint when pyudev or libudev is
    missing."""
    pyudev = load_pyudev()
    try:
        return pyudev.Context()
    except ImportError as exc:  # pyudev loads libudev here
        raise NodeError(f"{INSTALL_HINT} ({exc})") from exc


def _drm_devices() -> Iterable[UdevCardDevice]:
    devices: Iterable[UdevCardDevice] = udev_context().list_devices(subsystem="drm")
    return devices


def pci_cards_udev() -> list[Card]:
    """Every PCI DRM card of this machine as udev lists them, any vendor, without details."""
    return cards_from_udev(_drm_devices())


def discover_udev(
    *,
    memory_reserved: int = 0,
    memory_override: int | None = None,
    devices: Iterable[UdevCardDevice] | None = None,
) -> list[Card]:
    """The Intel cards of this machine as udev lists them, with every fact; the details
    come from each card's sysfs folder (`sys_path`), as udev's own attributes do.
    `devices` replaces udev's list (tests)."""
    entries = _udev_entries(_drm_devices() if devices is None else devices)
    return _sorted(
        with_details(card, Path(device.sys_path), memory_reserved, memory_override)
        for card, device in entries
        if card.vendor == INTEL
    )


# ---------------------------------------------------------------- options


def _bytes_option(text: str, what: str) -> int:
    try:
        return parse_quantity(text)
    except QuantityError as exc:
        raise ValueError(f"{what}: {exc} (bytes, or a quantity such as 512Mi)") from None


def memory_options(
    reserved: str | None, override: str | None, environ: Mapping[str, str] = os.environ
) -> tuple[int, int | None]:
    """`--memory-reserved` and `--memory-override` (each falling back to its environment
    variable, as Intel's labeller read them) in bytes; ValueError naming the bad one."""
    if reserved is None:
        reserved = environ.get(ENV_MEMORY_RESERVED) or None
    if override is None:
        override = environ.get(ENV_MEMORY_OVERRIDE) or None
    reserved_bytes = 0 if reserved is None else _bytes_option(reserved, "memory reserved")
    override_bytes = None if override is None else _bytes_option(override, "memory override")
    return reserved_bytes, override_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The discovery flags of a command that reads cards with every fact (`gas node`)."""
    parser.add_argument(
        "--sysfs-root",
        metavar="DIR",
        help="read the cards from this sysfs tree (e.g. /sys) instead of asking udev",
    )
    parser.add_argument(
        "--memory-reserved",
        metavar="BYTES",
        help=f"local memory kept back on each card, e.g. 512Mi (${ENV_MEMORY_RESERVED}; 0)",
    )
    parser.add_argument(
        "--memory-override",
        metavar="BYTES",
        help="memory of a card that reports no local memory (an integrated GPU), e.g. 4Gi "
        f"(${ENV_MEMORY_OVERRIDE}; 0)",
    )


def discoverer(args: argparse.Namespace) -> Callable[[], list[Card]]:
    """The discovery the flags of `add_arguments` ask for; ValueError for a bad amount."""
    reserved, override = memory_options(args.memory_reserved, args.memory_override)
    root = args.sysfs_root
    if root is None:
        return lambda: discover_udev(memory_reserved=reserved, memory_override=override)
    return lambda: discover_sysfs(root, memory_reserved=reserved, memory_override=override)


def describe(cards: Iterable[Card]) -> str:
    """One line about the cards, for the log."""
    parts = []
    for c in cards:
        numa = "unknown" if c.numa_node is None else c.numa_node
        parts.append(
            f"{c.name} ({c.driver or 'no driver'}, {c.render_node or 'no render node'}, "
            f"{c.tiles} tile{'s' if c.tiles != 1 else ''}, {format_quantity(c.memory)} memory, "
            f"NUMA {numa}, {c.pci_address or '?'})"
        )
    return ", ".join(parts) or "no cards"
