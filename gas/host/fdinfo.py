"""One DRM client as the kernel describes it in `/proc/<pid>/fdinfo/<fd>`: no I/O.

The format is the kernel's "DRM client usage stats" (Documentation/gpu/drm-usage-stats.rst,
with the i915 and xe pages): one `key: value` per line, the DRM keys prefixed `drm-`, a
memory amount optionally followed by `KiB`, `MiB` or `GiB`, a busy time by `ns`.

- `drm-driver` (always there), `drm-pdev` (the PCI address of the card), `drm-client-id`
  (unique per client while it lives): a client reached through several fds, or through the
  fds a forked worker inherited, prints the same id, and is one client (`key`).
- Memory per region: `drm-total-<region>` and `drm-resident-<region>` (and `shared`,
  `active`, `purgeable`, not read here); older kernels print `drm-memory-<region>` for the
  total. i915 names its regions `system0`, `stolen-system0`, `local0`...; xe `system`,
  `gtt`, `stolen`, `vram0`...
- Engine time, either i915's busy nanoseconds `drm-engine-<class>` or xe's
  `drm-cycles-<class>` over `drm-total-cycles-<class>`, each class with
  `drm-engine-capacity-<class>` engines (1 when not said).

A file that is not a DRM client's (no `drm-driver`) is None. A line that cannot be read
(a value that is not a number, an unknown unit) is left out and named in `problems`;
unknown keys are ignored, as the format lets drivers add their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

UNITS = {"": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_NANOSECONDS = {"": 1, "ns": 1}
"""i915 prints its engines' busy time with the unit (`drm-engine-render: 9288864723 ns`)."""
_COUNT = {"": 1}
_NUMBER = re.compile(r"^([0-9]+)\s*([A-Za-z]*)$")
# The lines read, found by the regex engine in one pass over the text: a scan parses every
# GPU fd's file, and a loop over its lines in Python cost most of the scan's CPU.
_LINE = re.compile(
    r"^drm-(driver|pdev|client-id|total-cycles-|cycles-|engine-capacity-|engine-|total-|memory-"
    r"|resident-)([^\s:]*):(.*)$",
    re.MULTILINE,
)
_IDENTITY = ("driver", "pdev", "client-id")
_LOCAL = re.compile(r"^(local|vram)[0-9]+$")
SYSTEM_REGIONS = ("system0", "system", "gtt")
"""Where an integrated GPU's memory is: i915's `system0`, xe's `system` and `gtt`."""


@dataclass(frozen=True)
class Engine:
    """Cumulative engine time of one class: `busy` out of `total` (xe's cycles), or busy
    nanoseconds against the wall clock (i915: `total` None)."""

    busy: int
    total: int | None = None
    capacity: int = 1


@dataclass(frozen=True)
class DrmClient:
    driver: str
    pdev: str
    client_id: str
    total: Mapping[str, int] = field(default_factory=dict)
    """Region -> bytes of the client's buffers there."""
    resident: Mapping[str, int] = field(default_factory=dict)
    engines: Mapping[str, Engine] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        """One client, however many fds and processes reach it."""
        return (self.pdev, self.client_id)

    @property
    def reports_memory(self) -> bool:
        return bool(self.total)

    def device_memory(self) -> int | None:
        """Bytes in the card's own memory (`local*`, `vram*`); on a card without any (an
        integrated GPU) in system memory instead. None when the kernel says nothing of
        memory."""
        if not self.total:
            return None
        local = [amount for region, amount in self.total.items() if _LOCAL.match(region)]
        if local:
            return sum(local)
        return sum(self.total.get(region, 0) for region in SYSTEM_REGIONS)


def _amount(value: str, units: Mapping[str, int]) -> int | None:
    value = value.strip()
    if value.isascii() and value.isdigit():
        return int(value)  # most values: no unit, no regex
    match = _NUMBER.match(value)
    if match is None or match.group(2) not in units:
        return None
    return int(match.group(1)) * units[match.group(2)]


def _unit_names(units: Mapping[str, int]) -> str:
    return ", ".join(unit or "no unit" for unit in units)


def parse_fdinfo(text: str) -> DrmClient | None:
    """The DRM client of one fdinfo file; None when the fd is not a DRM client's."""
    identity: dict[str, str] = {}
    stats: list[tuple[str, str, str]] = []
    for kind, name, value in _LINE.findall(text):
        if kind in _IDENTITY:
            if not name:
                identity[kind] = value.strip()
        elif name:
            stats.append((kind, name, value))
    driver = identity.get("driver")
    if not driver:
        return None
    problems: list[str] = []
    total: dict[str, int] = {}
    resident: dict[str, int] = {}
    busy: dict[str, int] = {}
    cycles: dict[str, int] = {}
    cycles_total: dict[str, int] = {}
    capacity: dict[str, int] = {}
    kinds: dict[str, tuple[dict[str, int], Mapping[str, int]]] = {
        "total-cycles-": (cycles_total, _COUNT),
        "cycles-": (cycles, _COUNT),
        "engine-capacity-": (capacity, _COUNT),
        "engine-": (busy, _NANOSECONDS),
        "total-": (total, UNITS),
        "memory-": (total, UNITS),
        "resident-": (resident, UNITS),
    }
    for kind, name, value in stats:
        into, units = kinds[kind]
        amount = _amount(value, units)
        if amount is None:
            value = value.strip()
            problems.append(f"drm-{kind}{name}: {value!r} is not a number in {_unit_names(units)}")
        else:
            into.setdefault(name, amount)
    engines = {name: Engine(ns, None, capacity.get(name, 1)) for name, ns in busy.items()}
    for name, count in cycles.items():
        engines[name] = Engine(count, cycles_total.get(name), capacity.get(name, 1))
    return DrmClient(
        driver=driver,
        pdev=identity.get("pdev", ""),
        client_id=identity.get("client-id", ""),
        total=total,
        resident=resident,
        engines=engines,
        problems=tuple(problems),
    )


def utilization(before: Engine, after: Engine, seconds: float) -> float | None:
    """The share of the class's engines the client kept busy between two readings (0 to
    1); None when it cannot be told (a counter went back: the client is another now)."""
    busy = after.busy - before.busy
    if busy < 0:
        return None
    if after.total is not None and before.total is not None:
        span = after.total - before.total
        if span <= 0:
            return None
        return min(1.0, busy / (span * max(after.capacity, 1)))
    if seconds <= 0:
        return None
    return min(1.0, busy / (seconds * 1e9 * max(after.capacity, 1)))
