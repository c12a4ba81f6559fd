"""`gas label-node`: find this node's GPU cards and write the node labels gas and GAS read.

Three separate steps, so each can be tested alone:

1. discovery: DRM `card<N>` devices whose parent device is on the PCI bus, as `Card`
   records, either through udev (pyudev, the default) or by reading a sysfs tree directly
   (`--sysfs-root`);
2. labels: a pure function of the cards (`card_labels`), and the change against the node's
   current labels (`label_changes`), which also removes labels that are no longer true;
3. the write: one JSON merge patch of the node's labels, or none when nothing changed.

Labels written: `gpu.intel.com/gpu-numbers` (`0.1.2`), `gpu.intel.com/cards`
(`card0.card1.card2`, deprecated but still read by GAS) and, with `--numa`,
`gpu.intel.com/numa-gpu-map` (`0-0.1_1-2.3`). A value longer than a label allows continues in
`<key>2`, `<key>3`, ... each starting with `Z`, as GAS reads them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from gas.core.model import (
    LABEL_CARDS,
    LABEL_GPU_NUMBERS,
    LABEL_NUMA_MAP,
    SPLIT_LABEL_MARK,
    card_number,
    is_card_name,
)
from gas.node.cards import Card

log = logging.getLogger(__name__)

INTEL = "0x8086"
VENDOR_ALIASES = {"intel": INTEL, "amd": "0x1002", "nvidia": "0x10de"}
MERGE_PATCH = "application/merge-patch+json"
LABEL_VALUE_MAX = 63
API_TIMEOUT = (5.0, 30.0)
"""Connect and read timeouts of each API call."""
RETRY_BASE = 1.0
RETRY_MAX = 60.0
INSTALL_HINT = (
    "gas label-node needs pyudev: pip install 'gas[labeler]' (or 'pyudev>=0.24'), and "
    "libudev (Debian: libudev1); --sysfs-root /sys reads the cards from sysfs without it"
)

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class LabelerError(Exception):
    """A failure with a message fit for the user; the command exits with status 1."""


# ---------------------------------------------------------------- discovery


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


def _sorted(cards: Iterable[Card]) -> list[Card]:
    return sorted(cards, key=lambda card: card.number)


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


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value if isinstance(value, str) else None


def udev_pci_attributes(pci: UdevDevice) -> tuple[str, int | None]:
    """Vendor and NUMA node of a PCI device seen through udev."""
    vendor = _text(pci.attributes.get("vendor"))
    numa = _text(pci.attributes.get("numa_node"))
    return normalize_vendor(vendor or ""), parse_numa_node(numa)


def cards_from_udev(devices: Iterable[UdevDevice]) -> list[Card]:
    """Cards among udev devices of the drm subsystem.

    Only the card nodes count: render nodes (`renderD128`) and connectors (`card0-DP-1`)
    belong to a card already. The card's own parent must be the PCI device: a USB display
    adapter's nearest PCI ancestor is its USB host controller, often an Intel one.
    """
    cards = []
    for device in devices:
        name = device.sys_name
        if not is_card_name(name):
            continue
        parent = device.parent
        if parent is None or parent.subsystem != "pci":
            log.debug("%s: parent device is not on the PCI bus, skipped", name)
            continue
        vendor, numa = udev_pci_attributes(parent)
        cards.append(Card(name, card_number(name), vendor, numa, parent.sys_name))
    return _sorted(cards)


def _pyudev() -> Any:
    try:
        import pyudev
    except ImportError as exc:
        raise LabelerError(INSTALL_HINT) from exc
    return pyudev


def _udev_context() -> Any:
    pyudev = _pyudev()
    try:
        return pyudev.Context()
    except ImportError as exc:  # pyudev loads libudev here
        raise LabelerError(f"{INSTALL_HINT} ({exc})") from exc


def discover_udev() -> list[Card]:
    """The cards of this machine, as udev lists them."""
    return cards_from_udev(_udev_context().list_devices(subsystem="drm"))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _subsystem(device_dir: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(device_dir / "subsystem"))
    except OSError:
        return None


def sysfs_pci_attributes(pci_dir: Path) -> tuple[str, int | None]:
    """Vendor and NUMA node of a PCI device from its sysfs directory."""
    return normalize_vendor(_read(pci_dir / "vendor") or ""), parse_numa_node(
        _read(pci_dir / "numa_node")
    )


def discover_sysfs(root: str | os.PathLike[str] = "/sys") -> list[Card]:
    """The cards under a sysfs tree, read without udev: the same records as `discover_udev`
    for the live `/sys`, and usable on a copy or a fake tree (libudev only reads `/sys`)."""
    drm = Path(root) / "class" / "drm"
    try:
        names = os.listdir(drm)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LabelerError(f"cannot read {drm}: {exc}") from exc
    cards = []
    for name in names:
        if not is_card_name(name):
            continue
        # `device` points at the card's parent device, as udev's parent does.
        try:
            parent = (drm / name / "device").resolve(strict=True)
        except (OSError, RuntimeError):
            log.debug("%s: no parent device, skipped", name)
            continue
        if _subsystem(parent) != "pci":
            log.debug("%s: parent device is not on the PCI bus, skipped", name)
            continue
        vendor, numa = sysfs_pci_attributes(parent)
        cards.append(Card(name, card_number(name), vendor, numa, parent.name))
    return _sorted(cards)


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
    return _sorted(c for c in cards if vendors is None or c.vendor in vendors)


# ---------------------------------------------------------------- labels


def is_label_value(value: str) -> bool:
    """The API server's rule for label values."""
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(value) is not None


def split_label(key: str, value: str) -> dict[str, str]:
    """`key: value`, continued in `key2`, `key3`, ... (each `Z` + the next part) when the
    value is too long for one label.

    Each part is as long as it can be while ending where a list item ends (`0.1.2`, then
    `Z.5.8.9`), so every part is a valid label value and still reads well; a part ending
    with a separator would be rejected by the API server.
    """
    if is_label_value(value):
        return {key: value} if value else {}
    parts: list[str] = []
    position = 0
    while position < len(value):
        prefix = SPLIT_LABEL_MARK if parts else ""
        limit = min(LABEL_VALUE_MAX - len(prefix), len(value) - position)
        part = _longest_part(prefix, value, position, limit)
        if part is None:
            raise ValueError(f"cannot split the value of {key} into valid label values")
        parts.append(prefix + part)
        position += len(part)
    return {key if i == 0 else f"{key}{i + 1}": part for i, part in enumerate(parts)}


def _longest_part(prefix: str, value: str, start: int, limit: int) -> str | None:
    candidates = [value[start : start + n] for n in range(limit, 0, -1)]
    whole_items = [
        c for c in candidates if start + len(c) == len(value) or not value[start + len(c)].isalnum()
    ]
    for candidate in whole_items + candidates:
        if is_label_value(prefix + candidate):
            return candidate
    return None


def numa_gpu_map(cards: Iterable[Card]) -> str:
    """`<numa node>-<gpu numbers>` groups joined by `_`: `0-0.1_1-2.3`.

    Cards whose NUMA node is unknown are left out: a single-NUMA allocation must not be
    given a card whose locality nobody knows.
    """
    groups: dict[int, list[int]] = {}
    for card in cards:
        if card.numa_node is not None:
            groups.setdefault(card.numa_node, []).append(card.number)
    return "_".join(
        f"{node}-{'.'.join(str(n) for n in sorted(numbers))}"
        for node, numbers in sorted(groups.items())
    )


def managed_bases(numa: bool) -> tuple[str, ...]:
    """The labels this run owns. Without `--numa` an existing NUMA map is left alone:
    another tool may write it."""
    bases = (LABEL_GPU_NUMBERS, LABEL_CARDS)
    return (*bases, LABEL_NUMA_MAP) if numa else bases


def card_labels(cards: Sequence[Card], numa: bool = False) -> dict[str, str]:
    """The labels that describe `cards` (none for no cards)."""
    ordered = _sorted(cards)
    if not ordered:
        return {}
    labels = split_label(LABEL_GPU_NUMBERS, ".".join(str(c.number) for c in ordered))
    labels.update(split_label(LABEL_CARDS, ".".join(c.name for c in ordered)))
    if numa:
        labels.update(split_label(LABEL_NUMA_MAP, numa_gpu_map(ordered)))
    return labels


def is_managed(key: str, bases: Iterable[str]) -> bool:
    """`base`, or one of its continuations `base2`, `base3`, ..."""
    for base in bases:
        if key == base:
            return True
        suffix = key.removeprefix(base)
        if suffix != key and suffix.isdigit() and suffix[0] != "0" and int(suffix) >= 2:
            return True
    return False


def label_changes(
    current: Mapping[str, str], desired: Mapping[str, str], bases: Iterable[str]
) -> dict[str, str | None]:
    """The merge patch of `metadata.labels` from `current` to `desired`: changed values, and
    None (delete) for owned labels no longer wanted, such as a continuation left over from
    a longer value. Labels not owned are never touched."""
    bases = tuple(bases)
    changes: dict[str, str | None] = {
        key: value for key, value in desired.items() if current.get(key) != value
    }
    for key in current:
        if key not in desired and is_managed(key, bases):
            changes[key] = None
    return dict(sorted(changes.items()))


# ---------------------------------------------------------------- the API side


def core_api(kubeconfig: str | None) -> Any:
    """CoreV1Api from the kubeconfig when given, else in-cluster, else $KUBECONFIG or
    ~/.kube/config."""
    from kubernetes import client, config

    # The client's config loaders carry no annotations.
    from_file: Callable[..., Any] = config.new_client_from_config
    in_cluster: Callable[..., None] = config.load_incluster_config
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise LabelerError(f"kubeconfig {kubeconfig}: no such file")
    try:
        if kubeconfig:
            return client.CoreV1Api(from_file(config_file=kubeconfig))
        configuration = client.Configuration()
        try:
            in_cluster(client_configuration=configuration)
            return client.CoreV1Api(client.ApiClient(configuration))
        except config.ConfigException:
            return client.CoreV1Api(from_file())
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "not in a cluster, and no --kubeConfig"
        raise LabelerError(f"cannot load Kubernetes client configuration ({where}): {exc}") from exc


def node_labels(api: Any, node: str) -> dict[str, str]:
    response = api.read_node(node, _preload_content=False, _request_timeout=API_TIMEOUT)
    labels = json.loads(response.data).get("metadata", {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def apply_labels(
    api: Any, node: str, desired: Mapping[str, str], bases: Iterable[str]
) -> dict[str, str | None]:
    """Bring the node's owned labels to `desired` in one merge patch; no call when they are
    already right. Returns the changes made."""
    changes = label_changes(node_labels(api, node), desired, bases)
    if changes:
        api.patch_node(
            node,
            {"metadata": {"labels": changes}},
            _content_type=MERGE_PATCH,
            _request_timeout=API_TIMEOUT,
        )
    return changes


def _describe_api_error(exc: Exception, node: str) -> str:
    status = getattr(exc, "status", None)
    if status == 404:
        return f"node {node} not found"
    if status in (401, 403):
        return f"not allowed to read or patch node {node} (HTTP {status}): check the RBAC rules"
    if status is not None:
        return f"API error on node {node}: HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return f"cannot reach the API server: {exc}"


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
        except (LabelerError, ValueError, OSError) as exc:
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
            log.error("%s", _describe_api_error(exc, self.node))
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


# ---------------------------------------------------------------- watching


def watch_loop(
    relabel: Callable[[], bool],
    next_event: Callable[[float | None], str | None],
    *,
    debounce: float,
    resync: float,
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Relabel now, then after card events and every `resync` seconds; retry failures with
    backoff.

    `next_event(timeout)` waits at most `timeout` seconds (None: forever) and returns a
    description of a relevant event, or None. Events come in bursts (a driver binding
    several cards, a module reload), so a relabel waits until `debounce` seconds pass
    without one, but never more than five debounce periods after the first.
    """
    failures = 0
    scheduled: float | None = clock()
    settle: float | None = None
    first_event: float | None = None
    while not stop():
        now = clock()
        due = min((d for d in (scheduled, settle) if d is not None), default=None)
        if due is not None and now >= due:
            settle = first_event = None
            if relabel():
                failures = 0
                scheduled = now + resync if resync > 0 else None
            else:
                failures += 1
                delay = min(RETRY_MAX, RETRY_BASE * 2 ** min(failures - 1, 16))
                log.info("retrying in %.0f s", delay)
                scheduled = now + delay
            continue
        event = next_event(None if due is None else due - now)
        if event is None:
            continue
        now = clock()
        log.info("udev: %s", event)
        if first_event is None:
            first_event = now
        settle = min(now + debounce, first_event + 5 * debounce)


def udev_card_events(monitor: Any) -> Callable[[float | None], str | None]:
    """Adapt a started `pyudev.Monitor` to `watch_loop`: only cards coming and going count
    (not render nodes, connectors, or the `change` events of display hotplug)."""

    def next_event(timeout: float | None) -> str | None:
        device = monitor.poll(timeout=timeout)
        if device is None or device.subsystem != "drm" or not is_card_name(device.sys_name):
            return None
        if device.action not in ("add", "remove"):
            return None
        return f"{device.action} {device.sys_name}"

    return next_event


def card_monitor() -> Any:
    """A started monitor of the drm subsystem.

    It listens to the kernel's uevents, not udev's re-broadcast: udev sends those only to
    the host's network namespace, which a pod without hostNetwork does not see. The
    labeller reads sysfs only, so it does not need udev's processing of the event.
    """
    pyudev = _pyudev()
    monitor = pyudev.Monitor.from_netlink(_udev_context(), source="kernel")
    monitor.filter_by("drm")
    monitor.start()
    return monitor


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
        "--numa", action="store_true", help=f"also write {LABEL_NUMA_MAP} (0-0.1_1-2.3)"
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
                raise LabelerError(f"cannot listen to kernel device events: {exc}") from exc
        elif sysfs_root is None:
            _udev_context()  # fail with the install hint, not a traceback
        if not args.dry_run:
            labeller.api = core_api(args.kubeConfig)
    except LabelerError as exc:
        log.error("%s", exc)
        return 1
    if monitor is None:
        return 0 if labeller.once() else 1
    log.info("watching for GPU cards being added or removed")
    watch_loop(labeller.once, udev_card_events(monitor), debounce=args.debounce, resync=args.resync)
    return 0
