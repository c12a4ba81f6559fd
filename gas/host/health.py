"""Whether each card this node has had is fit to be used, as the kernel tells it.

A card is **Unhealthy** when:

- its driver is unbound (its PCI function is still there, but bound to no driver, or to
  one that is neither i915 nor xe, such as vfio-pci): its DRM device is gone with it;
- it vanished (its PCI function is gone from sysfs: unplugged, or removed);
- the kernel marks it wedged, where the driver says so outside a uevent:
  - xe's RAS health indicator (`gpu_health`, kernel 7.3) reads `critical`;
  - xe runs in survivability mode (the `survivability_mode` attribute exists: its firmware
    must be flashed);
  - i915's `i915_wedged` in debugfs (`<sysfs>/kernel/debug/dri/<N>/`, when debugfs is
    mounted and readable) reads non-zero;
- or the drm device sent a wedged uevent (`WEDGED=<method>`, see `gas.host.watch`) and has
  not been added again since (a rebind, the recovery the event asks for).

It is **Unknown** when nothing can be read of it (sysfs itself is unreadable), and
**Healthy** otherwise. `warning` from `gpu_health` keeps the card Healthy, with its word in
the message. Each verdict carries a short reason (a taint's value: a label value) and a
message for people.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gas.host.cards import Card
from gas.host.discovery import DRIVERS

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Health:
    status: str
    reason: str = ""
    """CamelCase, a valid label value: `Unbound`, `Vanished`, `Wedged`, `Critical`,
    `Survivability`, `Unreadable`; empty when Healthy."""
    message: str = ""

    @property
    def healthy(self) -> bool:
        return self.status == HEALTHY


FINE = Health(HEALTHY)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _pci_dir(sysfs_root: str | os.PathLike[str], card: Card) -> Path:
    return Path(sysfs_root) / "bus" / "pci" / "devices" / card.pci_address


def _absent(sysfs_root: str | os.PathLike[str], card: Card) -> Health:
    """A card discovery no longer finds: unbound, vanished, or unreadable."""
    where = card.pci_address
    if not where:
        return Health(UNHEALTHY, "Vanished", f"{card.name} is gone (its PCI address is unknown)")
    pci = _pci_dir(sysfs_root, card)
    try:
        os.stat(pci)
    except FileNotFoundError:
        return Health(UNHEALTHY, "Vanished", f"{card.name} ({where}) is gone from the PCI bus")
    except OSError as exc:
        return Health(UNKNOWN, "Unreadable", f"{card.name}: cannot read {pci}: {exc}")
    try:
        driver = os.path.basename(os.readlink(pci / "driver"))
    except FileNotFoundError:
        return Health(UNHEALTHY, "Unbound", f"{card.name} ({where}) has no driver bound")
    except OSError as exc:
        return Health(UNKNOWN, "Unreadable", f"{card.name}: cannot read its driver: {exc}")
    if driver not in DRIVERS:
        return Health(
            UNHEALTHY, "Unbound", f"{card.name} ({where}) is bound to {driver}, not i915 or xe"
        )
    return Health(
        UNHEALTHY,
        "Unbound",
        f"{card.name} ({where}) is bound to {driver} but has no DRM device: the driver did "
        "not take it (see the kernel log)",
    )


def _present(sysfs_root: str | os.PathLike[str], card: Card) -> Health:
    """A card discovery finds: what its driver says of it beyond being there."""
    pci = _pci_dir(sysfs_root, card) if card.pci_address else None
    if pci is not None:
        if (pci / "survivability_mode").exists():
            return Health(
                UNHEALTHY,
                "Survivability",
                f"{card.name} runs in survivability mode: its firmware must be flashed",
            )
        indicator = _read(pci / "gpu_health")
        if indicator == "critical":
            return Health(UNHEALTHY, "Critical", f"{card.name}: gpu_health reads critical")
        if indicator == "warning":
            return Health(HEALTHY, "", f"{card.name}: gpu_health reads warning")
    wedged = _read(Path(sysfs_root) / "kernel" / "debug" / "dri" / str(card.number) / "i915_wedged")
    if wedged not in (None, "", "0"):
        return Health(UNHEALTHY, "Wedged", f"{card.name}: i915 reports it wedged ({wedged})")
    return FINE


def card_health(
    sysfs_root: str | os.PathLike[str], card: Card, present: bool, wedged_event: str = ""
) -> Health:
    """The verdict on `card` (last seen as discovery found it), present in discovery now
    or not; `wedged_event`, the `WEDGED` value of a uevent the card sent since it was last
    added."""
    if not present:
        return _absent(sysfs_root, card)
    if wedged_event:
        return Health(
            UNHEALTHY,
            "Wedged",
            f"{card.name} sent a wedged event (WEDGED={wedged_event}): it needs "
            "recovery, and is taken back once it is added again",
        )
    return _present(sysfs_root, card)
