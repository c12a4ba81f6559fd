"""`gas label-node`: card discovery over fake sysfs trees and real udev, the labels and
their split form as gas reads them back, the node patch against the API-server double, and
the command itself."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gas.cli import _go_style, build_parser
from gas.core.model import LABEL_CARDS, LABEL_GPU_NUMBERS, node_cards, read_split_label
from gas.host import discovery, kubeapi, watch
from gas.host.cards import Card
from gas.host.discovery import cards_from_udev
from gas.host.labels import (
    LABEL_NUMA_GPU_MAP,
    card_labels,
    label_changes,
    managed_bases,
    split_label,
)
from gas.tools import label_node as labeler
from gas.tools.label_node import discover_sysfs, parse_vendors, select_cards
from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import kernel_link, write_file

ROOT = Path(__file__).resolve().parents[2]

# The API server's rule for label values (k8s.io/apimachinery validation.IsValidLabelValue).
K8S_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and K8S_LABEL_VALUE.match(value) is not None


# ---------------------------------------------------------------- fake sysfs trees
# Not fakesysfs.write_sysfs: the labeler meets cards behind PCIe switches, on a second
# root port, on USB and platform buses, which that tree does not lay out.


@dataclass(frozen=True)
class FakeGpu:
    number: int
    vendor: str = "0x8086"
    numa: str | None = "0"  # the numa_node file's content; None: no such file
    parent: str = "pci"  # "pci", "usb" (a display adapter on an Intel xHCI), "platform"


def _pci_device(sysfs: Path, path: str, vendor: str, numa: str | None) -> Path:
    device = sysfs / "devices" / path
    if device.exists():  # a bridge shared by several cards
        return device
    write_file(device / "uevent", f"PCI_SLOT_NAME={device.name}\n")
    write_file(device / "vendor", f"{vendor}\n")
    write_file(device / "device", "0x56a0\n")
    if numa is not None:
        write_file(device / "numa_node", f"{numa}\n")
    kernel_link(device / "subsystem", sysfs / "bus" / "pci")
    kernel_link(sysfs / "bus" / "pci" / "devices" / device.name, device)
    return device


def _drm_device(sysfs: Path, parent: Path, name: str, inside: Path | None = None) -> Path:
    device = (inside or parent / "drm") / name
    write_file(device / "uevent", f"DEVNAME=dri/{name}\n")
    kernel_link(device / "subsystem", sysfs / "class" / "drm")
    if inside is None:
        kernel_link(device / "device", parent)
    kernel_link(sysfs / "class" / "drm" / name, device)
    return device


def build_sysfs(root: Path, gpus: list[FakeGpu]) -> Path:
    """A sysfs tree with these cards, each with its render node and a DP connector, laid
    out and linked as the kernel does (`class/drm/card0 -> ../../devices/.../drm/card0`)."""
    sysfs = root / "sys"
    (sysfs / "class" / "drm").mkdir(parents=True)
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    write_file(sysfs / "devices" / "pci0000:00" / "uevent", "")
    write_file(sysfs / "devices" / "pci0000:80" / "uevent", "")
    for index, gpu in enumerate(gpus):
        root_port = "pci0000:80" if gpu.numa == "1" else "pci0000:00"
        bus = 0x80 if gpu.numa == "1" else 0
        if gpu.parent == "pci" and index % 2:
            # A discrete card behind a PCIe switch, its links one level deeper.
            bridge = f"{root_port}/0000:{bus:02x}:01.0"
            _pci_device(sysfs, bridge, "0x8086", gpu.numa)
            parent = _pci_device(
                sysfs, f"{bridge}/0000:{bus + index + 1:02x}:00.0", gpu.vendor, gpu.numa
            )
        elif gpu.parent == "pci":
            parent = _pci_device(
                sysfs, f"{root_port}/0000:{bus:02x}:{index + 2:02x}.0", gpu.vendor, gpu.numa
            )
        elif gpu.parent == "usb":
            xhci = _pci_device(sysfs, f"{root_port}/0000:{bus:02x}:14.0", "0x8086", gpu.numa)
            parent = xhci / "usb1" / "1-1" / "1-1:1.0"
            write_file(parent / "uevent", "")
            kernel_link(parent / "subsystem", sysfs / "bus" / "usb")
        else:
            parent = sysfs / "devices" / "platform" / f"simple-framebuffer.{index}"
            write_file(parent / "uevent", "")
            kernel_link(parent / "subsystem", sysfs / "bus" / "platform")
        card = _drm_device(sysfs, parent, f"card{gpu.number}")
        _drm_device(sysfs, parent, f"renderD{128 + gpu.number}")
        _drm_device(sysfs, parent, f"card{gpu.number}-DP-1", inside=card)
    return sysfs


def intel(*numbers: int, numa: str | None = "0") -> list[FakeGpu]:
    return [FakeGpu(n, numa=numa) for n in numbers]


def names(cards: list[Card]) -> list[str]:
    return [c.name for c in cards]


# ---------------------------------------------------------------- discovery


def test_fake_tree_is_laid_out_like_the_kernels(tmp_path: Path) -> None:
    sysfs = build_sysfs(tmp_path, intel(0))
    assert (
        os.readlink(sysfs / "class/drm/card0") == "../../devices/pci0000:00/0000:00:02.0/drm/card0"
    )
    card = sysfs / "devices/pci0000:00/0000:00:02.0/drm/card0"
    assert os.readlink(card / "device") == "../../../0000:00:02.0"
    assert os.readlink(sysfs / "devices/pci0000:00/0000:00:02.0/subsystem") == "../../../bus/pci"
    deep = sysfs / "devices/pci0000:00/0000:00:01.0/0000:02:00.0/subsystem"
    build_sysfs(tmp_path / "2", intel(0, 1))
    assert os.readlink(tmp_path / "2" / deep.relative_to(tmp_path)) == "../../../../bus/pci"
    assert sorted(os.listdir(sysfs / "class/drm")) == ["card0", "card0-DP-1", "renderD128"]


@pytest.mark.parametrize("count", [0, 1, 2, 8])
def test_sysfs_discovery_finds_the_intel_cards(tmp_path: Path, count: int) -> None:
    sysfs = build_sysfs(tmp_path, intel(*range(count)))
    cards = discover_sysfs(sysfs)
    assert names(cards) == [f"card{n}" for n in range(count)]
    assert all(c.vendor == "0x8086" and c.numa_node == 0 for c in cards)
    expected = (
        {}
        if count == 0
        else {
            LABEL_GPU_NUMBERS: ".".join(str(n) for n in range(count)),
            LABEL_CARDS: ".".join(f"card{n}" for n in range(count)),
        }
    )
    assert card_labels(cards) == expected


def test_one_card_record(tmp_path: Path) -> None:
    assert discover_sysfs(build_sysfs(tmp_path, intel(0))) == [
        Card("card0", 0, "0x8086", 0, "0000:00:02.0")
    ]


def test_no_drm_class_at_all_is_no_cards(tmp_path: Path) -> None:
    assert discover_sysfs(tmp_path) == []


def test_render_nodes_connectors_and_non_pci_cards_are_ignored(tmp_path: Path) -> None:
    sysfs = build_sysfs(
        tmp_path,
        [FakeGpu(0), FakeGpu(1, parent="usb"), FakeGpu(2, parent="platform"), FakeGpu(3)],
    )
    # The USB adapter's nearest PCI ancestor is an Intel xHCI controller: still not a GPU.
    assert names(select_cards(discover_sysfs(sysfs), None)) == ["card0", "card3"]


def test_a_card_without_its_device_link_is_skipped(tmp_path: Path) -> None:
    sysfs = build_sysfs(tmp_path, intel(0, 1))
    (sysfs / "devices/pci0000:00/0000:00:01.0/0000:02:00.0/drm/card1/device").unlink()
    assert names(discover_sysfs(sysfs)) == ["card0"]


def test_vendor_filter(tmp_path: Path) -> None:
    sysfs = build_sysfs(
        tmp_path,
        [FakeGpu(0, "0x10de"), FakeGpu(1), FakeGpu(2, "0x1002"), FakeGpu(3, "0X8086")],
    )
    cards = discover_sysfs(sysfs)
    assert names(select_cards(cards, parse_vendors(None))) == ["card1", "card3"]
    assert names(select_cards(cards, parse_vendors(["any"]))) == [f"card{n}" for n in range(4)]
    assert names(select_cards(cards, parse_vendors(["0x10de,amd"]))) == ["card0", "card2"]
    assert names(select_cards(cards, parse_vendors(["10de", "0x8086"]))) == [
        "card0",
        "card1",
        "card3",
    ]
    with pytest.raises(ValueError, match="vendor"):
        parse_vendors(["geforce"])


def test_numbering_is_numeric_and_may_have_gaps(tmp_path: Path) -> None:
    cards = discover_sysfs(build_sysfs(tmp_path, intel(10, 2, 0)))
    labels = card_labels(cards)
    assert labels == {LABEL_GPU_NUMBERS: "0.2.10", LABEL_CARDS: "card0.card2.card10"}
    assert node_cards(labels) == ("card0", "card2", "card10")


def test_numa_map_over_two_sockets(tmp_path: Path) -> None:
    gpus = [FakeGpu(0), FakeGpu(1), FakeGpu(2, numa="1"), FakeGpu(3, numa="1")]
    cards = discover_sysfs(build_sysfs(tmp_path, gpus))
    assert [c.numa_node for c in cards] == [0, 0, 1, 1]
    assert card_labels(cards, numa=True)[LABEL_NUMA_GPU_MAP] == "0-0.1_1-2.3"
    assert LABEL_NUMA_GPU_MAP not in card_labels(cards)


def test_unknown_numa_nodes_are_left_out_of_the_map(tmp_path: Path) -> None:
    gpus = [FakeGpu(0, numa="1"), FakeGpu(1, numa="-1"), FakeGpu(2, numa=None), FakeGpu(3)]
    cards = discover_sysfs(build_sysfs(tmp_path, gpus))
    assert [c.numa_node for c in cards] == [1, None, None, 0]
    labels = card_labels(cards, numa=True)
    assert labels[LABEL_NUMA_GPU_MAP] == "0-3_1-0"
    assert labels[LABEL_GPU_NUMBERS] == "0.1.2.3"
    all_unknown = discover_sysfs(build_sysfs(tmp_path / "b", intel(0, 1, numa="-1")))
    assert LABEL_NUMA_GPU_MAP not in card_labels(all_unknown, numa=True)


# ---------------------------------------------------------------- split labels


def test_forty_cards_need_split_labels_that_read_back(tmp_path: Path) -> None:
    gpus = [FakeGpu(n, numa=str(n % 2)) for n in range(40)]
    cards = discover_sysfs(build_sysfs(tmp_path, gpus))
    labels = card_labels(cards, numa=True)
    assert set(labels) == {
        LABEL_GPU_NUMBERS,
        LABEL_GPU_NUMBERS + "2",
        *(LABEL_CARDS + suffix for suffix in ("", "2", "3", "4", "5")),
        LABEL_NUMA_GPU_MAP,
        LABEL_NUMA_GPU_MAP + "2",
    }
    assert all(valid_label_value(v) for v in labels.values())
    assert labels[LABEL_GPU_NUMBERS + "2"].startswith("Z.")
    assert not labels[LABEL_GPU_NUMBERS].endswith(".")
    expected = tuple(f"card{n}" for n in range(40))
    assert node_cards(labels) == expected
    assert read_split_label(labels, LABEL_CARDS) == ".".join(expected)
    evens, odds = ".".join(map(str, range(0, 40, 2))), ".".join(map(str, range(1, 40, 2)))
    assert read_split_label(labels, LABEL_NUMA_GPU_MAP) == f"0-{evens}_1-{odds}"
    # gas and GAS read `cards` only without `gpu-numbers`, and then not its continuations:
    # such a reader would see the first cards only. The labeller always writes both.
    legacy = node_cards({k: v for k, v in labels.items() if not k.startswith(LABEL_GPU_NUMBERS)})
    assert legacy == expected[: len(legacy)] and len(legacy) < 40


def test_split_parts_end_where_list_items_end() -> None:
    value = ".".join(str(n) for n in range(40))  # 109 characters
    assert split_label("k", value) == {
        "k": ".".join(str(n) for n in range(24)),  # 61 characters: ".24" would not fit
        "k2": "Z." + ".".join(str(n) for n in range(24, 40)),
    }
    assert split_label("k", "0.1") == {"k": "0.1"}
    assert split_label("k", "") == {}


@settings(max_examples=150, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=999_999), min_size=1, max_size=256))
def test_split_labels_are_valid_and_read_back(numbers: set[int]) -> None:
    ordered = sorted(numbers)
    cards = [Card(f"card{n}", n, "0x8086", n % 4, "") for n in ordered]
    labels = card_labels(cards, numa=True)
    for key, value in labels.items():
        assert valid_label_value(value), (key, value)
        assert value, key
    for base in (LABEL_GPU_NUMBERS, LABEL_CARDS, LABEL_NUMA_GPU_MAP):
        parts = sorted((k for k in labels if k.startswith(base)), key=len)
        assert parts == [base] + [f"{base}{i}" for i in range(2, len(parts) + 1)]
        assert all(labels[k].startswith("Z") for k in parts[1:])
    assert node_cards(labels) == tuple(f"card{n}" for n in ordered)
    assert read_split_label(labels, LABEL_CARDS) == ".".join(f"card{n}" for n in ordered)
    groups = read_split_label(labels, LABEL_NUMA_GPU_MAP).split("_")
    assert sorted(int(n) for g in groups for n in g.split("-")[1].split(".")) == ordered


def test_a_value_that_cannot_be_split_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot split"):
        split_label("k", "a" + "." * 100)


# ---------------------------------------------------------------- the change set


def test_changes_remove_stale_labels_and_leave_the_rest_alone() -> None:
    current = {
        LABEL_GPU_NUMBERS: "0.1",
        LABEL_GPU_NUMBERS + "2": "Z.2.3",
        LABEL_GPU_NUMBERS + "3": "Z.4",
        LABEL_CARDS: "card0.card1",
        LABEL_NUMA_GPU_MAP: "0-0.1",
        "gpu.intel.com/gpu-numbers-extra": "x",
        "gpu.intel.com/cards02": "not ours",
        "kubernetes.io/hostname": "n1",
    }
    desired = {LABEL_GPU_NUMBERS: "0.1", LABEL_CARDS: "card0.card1.card2"}
    assert label_changes(current, desired, managed_bases(numa=False)) == {
        LABEL_CARDS: "card0.card1.card2",
        LABEL_GPU_NUMBERS + "2": None,
        LABEL_GPU_NUMBERS + "3": None,
    }
    assert label_changes(current, desired, managed_bases(numa=True))[LABEL_NUMA_GPU_MAP] is None
    assert label_changes(current, {}, managed_bases(numa=True)) == {
        LABEL_CARDS: None,
        LABEL_GPU_NUMBERS: None,
        LABEL_GPU_NUMBERS + "2": None,
        LABEL_GPU_NUMBERS + "3": None,
        LABEL_NUMA_GPU_MAP: None,
    }
    assert label_changes(desired, desired, managed_bases(numa=True)) == {}


# ---------------------------------------------------------------- the udev backend


class FakeAttributes:
    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values

    def get(self, attribute: str) -> bytes | None:
        return self.values.get(attribute)


@dataclass
class FakeDevice:
    """What pyudev shows of a device: attribute values come as bytes."""

    sys_name: str
    subsystem: str | None = "drm"
    parent: Any = None
    attrs: dict[str, bytes] | None = None
    action: str | None = None

    @property
    def attributes(self) -> FakeAttributes:
        return FakeAttributes(self.attrs or {})


def _fake_pci(address: str, vendor: bytes, numa: bytes | None) -> FakeDevice:
    attrs = {"vendor": vendor} | ({"numa_node": numa} if numa is not None else {})
    return FakeDevice(address, "pci", None, attrs)


def test_udev_records_from_device_objects() -> None:
    gpu0 = _fake_pci("0000:00:02.0", b"0x8086\n", b"0\n")
    gpu1 = _fake_pci("0000:03:00.0", b"0x8086", b"-1")
    nvidia = _fake_pci("0000:81:00.0", b"0x10de\n", None)
    usb = FakeDevice("1-1:1.0", "usb", FakeDevice("usb1", "usb", _fake_pci("x", b"0x8086", b"0")))
    devices = [
        FakeDevice("card10", parent=gpu1),
        FakeDevice("renderD128", parent=gpu0),
        FakeDevice("card0-DP-1", parent=FakeDevice("card0", parent=gpu0)),
        FakeDevice("card0", parent=gpu0),
        FakeDevice("card3", parent=usb),
        FakeDevice("card4", parent=None),
        FakeDevice("card2", parent=nvidia),
    ]
    assert cards_from_udev(devices) == [
        Card("card0", 0, "0x8086", 0, "0000:00:02.0"),
        Card("card2", 2, "0x10de", None, "0000:81:00.0"),
        Card("card10", 10, "0x8086", None, "0000:03:00.0"),
    ]


def test_udev_discovery_on_this_machine_agrees_with_sysfs() -> None:
    pytest.importorskip("pyudev")
    cards = labeler.discover_udev()
    assert cards == discover_sysfs("/sys")
    if not Path("/sys/class/drm").exists():
        assert cards == []


def test_udev_backend_reads_real_pyudev_devices_like_the_sysfs_backend() -> None:
    """libudev refuses any tree that is not a mounted sysfs, so real device objects only
    come from this machine, where there is no GPU: real devices whose parent is a PCI
    device (virtio, NICs ...) stand in for cards under a card's name; parent lookup and
    attribute reading are pyudev's own."""
    pyudev = pytest.importorskip("pyudev")
    context = pyudev.Context()
    pci_devices = list(context.list_devices(subsystem="pci"))
    if not pci_devices:
        pytest.skip("no PCI devices visible")
    for pci in pci_devices:
        assert discovery.udev_pci_attributes(pci) == discovery.sysfs_pci_attributes(
            Path(pci.sys_path)
        )

    class AsCard:
        def __init__(self, device: Any, number: int) -> None:
            self.device, self.sys_name = device, f"card{number}"

        def __getattr__(self, name: str) -> Any:
            return getattr(self.device, name)

    children = [
        d for d in context.list_devices() if d.parent is not None and d.parent.subsystem == "pci"
    ]
    if not children:
        pytest.skip("no device with a PCI parent")
    everything = list(context.list_devices())
    cards = cards_from_udev([*everything, *(AsCard(d, i) for i, d in enumerate(children))])
    assert names(cards) == [f"card{i}" for i in range(len(children))]
    for card, child in zip(cards, children, strict=True):
        vendor, numa = discovery.sysfs_pci_attributes(Path(child.parent.sys_path))
        assert (card.vendor, card.numa_node, card.pci_address) == (
            vendor,
            numa,
            child.parent.sys_name,
        )
        assert vendor.startswith("0x")


def test_missing_pyudev_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pyudev", None)
    args = _args(node="n1", dry_run=True)
    with caplog.at_level(logging.ERROR):
        assert labeler.run(args) == 1
    assert "pip install 'gas-gpu-sharing[labeler]'" in caplog.text


# ---------------------------------------------------------------- watching


class Script:
    """A fake clock and event source for `watch_loop`: events at given times."""

    def __init__(self, events: list[tuple[float, str]], end: float) -> None:
        self.now = 0.0
        self.events = events
        self.end = end
        self.relabels: list[float] = []
        self.fail_until = -1.0

    def clock(self) -> float:
        return self.now

    def next_event(self, timeout: float | None) -> str | None:
        wake = self.end if timeout is None else min(self.end, self.now + timeout)
        if self.events and self.events[0][0] <= wake:
            self.now, event = self.events.pop(0)
            return event
        self.now = max(self.now, wake)
        return None

    def relabel(self) -> bool:
        self.relabels.append(self.now)
        return self.now > self.fail_until

    def stop(self) -> bool:
        return self.now >= self.end


def _watch(script: Script, debounce: float = 1.0, resync: float = 0.0) -> list[float]:
    watch.watch_loop(
        script.relabel,
        script.next_event,
        debounce=debounce,
        resync=resync,
        clock=script.clock,
        stop=script.stop,
    )
    return script.relabels


def test_watch_relabels_at_start_and_once_per_burst() -> None:
    burst = [(10.0, "add card0"), (10.2, "add card1"), (10.5, "add card2")]
    assert _watch(Script([*burst, (30.0, "remove card1")], end=100)) == [0.0, 11.5, 31.0]


def test_watch_does_not_wait_forever_in_an_event_storm() -> None:
    storm = [(10.0 + 0.5 * i, "add card0") for i in range(40)]
    relabels = _watch(Script(storm, end=40))
    assert relabels[:2] == [0.0, 15.0]


def test_watch_resyncs_periodically() -> None:
    assert _watch(Script([], end=35), resync=10) == [0.0, 10.0, 20.0, 30.0]


def test_watch_retries_failures_with_backoff() -> None:
    script = Script([], end=100)
    script.fail_until = 10.0
    assert _watch(script, resync=50) == [0.0, 1.0, 3.0, 7.0, 15.0, 65.0]


def test_udev_events_only_count_cards_coming_and_going() -> None:
    class Monitor:
        def __init__(self, devices: list[FakeDevice | None]) -> None:
            self.devices = devices

        def poll(self, timeout: float | None = None) -> FakeDevice | None:
            return self.devices.pop(0)

    devices: list[FakeDevice | None] = [
        FakeDevice("card1", action="add"),
        FakeDevice("card0", action="change"),  # display hotplug
        FakeDevice("renderD129", action="add"),
        FakeDevice("card1-HDMI-A-1", action="add"),
        FakeDevice("card9", subsystem="graphics", action="add"),
        None,
        FakeDevice("card1", action="remove"),
    ]
    next_event = watch.udev_card_events(Monitor(devices))
    seen = [next_event(0.1) for _ in range(7)]
    assert seen == ["add card1", None, None, None, None, None, "remove card1"]


def test_a_real_kernel_event_monitor_starts() -> None:
    pytest.importorskip("pyudev")
    try:
        monitor = watch.card_monitor()
    except OSError as exc:
        pytest.skip(f"no uevent netlink socket here: {exc}")
    assert watch.udev_card_events(monitor)(0) is None


# ---------------------------------------------------------------- the node patch


@pytest.fixture
def api(kubeconfig: str) -> Any:
    return kubeapi.core_api(kubeconfig)


def _node_labels(apiserver: ApiServerDouble, name: str = "n1") -> dict[str, str]:
    node = apiserver.get_node(name)
    assert node is not None
    labels: dict[str, str] = node["metadata"].get("labels", {})
    return labels


def _labeller(sysfs: Path, api: Any, numa: bool = False, vendors: Any = None) -> labeler.Labeller:
    return labeler.Labeller(
        discover=lambda: discover_sysfs(sysfs),
        vendors=parse_vendors(vendors),
        numa=numa,
        node="n1",
        api=api,
    )


def _patches(apiserver: ApiServerDouble) -> int:
    return apiserver.count_requests("PATCH", r"^/api/v1/nodes/n1$")


def test_labels_written_stale_removed_others_untouched_and_idempotent(
    apiserver: ApiServerDouble, api: Any, tmp_path: Path
) -> None:
    others = {"kubernetes.io/hostname": "n1", "gpu.intel.com/device-id.0300-56a0.count": "2"}
    stale = {
        LABEL_GPU_NUMBERS: "0.1.2.3.4",
        LABEL_GPU_NUMBERS + "2": "Z.5",
        LABEL_CARDS + "9": "Zcard99",
        LABEL_NUMA_GPU_MAP: "0-0",
    }
    apiserver.add_node({"metadata": {"name": "n1", "labels": others | stale}})
    many = build_sysfs(tmp_path / "many", [FakeGpu(n, numa=str(n % 2)) for n in range(40)])
    assert _labeller(many, api, numa=True).once()
    labels = _node_labels(apiserver)
    assert node_cards(labels) == tuple(f"card{n}" for n in range(40))
    assert all(valid_label_value(v) for v in labels.values())
    assert LABEL_CARDS + "9" not in labels
    assert labels[LABEL_NUMA_GPU_MAP].startswith("0-0.2.4")

    few = build_sysfs(tmp_path / "few", intel(0, 2))
    assert _labeller(few, api).once()
    assert _node_labels(apiserver) == others | {
        LABEL_GPU_NUMBERS: "0.2",
        LABEL_CARDS: "card0.card2",
        # Without --numa the NUMA map is not the labeller's.
        LABEL_NUMA_GPU_MAP: labels[LABEL_NUMA_GPU_MAP],
        LABEL_NUMA_GPU_MAP + "2": labels[LABEL_NUMA_GPU_MAP + "2"],
    }

    version, patches = apiserver.resource_version, _patches(apiserver)
    assert _labeller(few, api).once()
    assert (apiserver.resource_version, _patches(apiserver)) == (version, patches)

    assert _labeller(few, api, numa=True).once()
    assert _node_labels(apiserver)[LABEL_NUMA_GPU_MAP] == "0-0.2"
    assert LABEL_NUMA_GPU_MAP + "2" not in _node_labels(apiserver)


def test_no_cards_removes_the_labels(
    apiserver: ApiServerDouble, api: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    labels = {"kubernetes.io/hostname": "n1", LABEL_GPU_NUMBERS: "0", LABEL_CARDS: "card0"}
    apiserver.add_node({"metadata": {"name": "n1", "labels": labels}})
    nvidia_only = build_sysfs(tmp_path, [FakeGpu(0, "0x10de")])
    with caplog.at_level(logging.INFO):
        assert _labeller(nvidia_only, api).once()
    assert _node_labels(apiserver) == {"kubernetes.io/hostname": "n1"}
    assert "no GPU cards found" in caplog.text
    assert "removed gpu.intel.com/cards, gpu.intel.com/gpu-numbers" in caplog.text
    assert _labeller(nvidia_only, api, vendors=["any"]).once()
    assert _node_labels(apiserver)[LABEL_CARDS] == "card0"


def test_a_missing_node_is_a_clear_failure(
    apiserver: ApiServerDouble, api: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        assert not _labeller(build_sysfs(tmp_path, intel(0)), api).once()
    assert "node n1 not found" in caplog.text


# ---------------------------------------------------------------- the command


def _args(**overrides: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    labeler.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_dry_run_prints_the_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sysfs = build_sysfs(tmp_path, [FakeGpu(0), FakeGpu(1, numa="1"), FakeGpu(2, "0x1002")])
    assert labeler.run(_args(sysfs_root=str(sysfs), dry_run=True, numa=True)) == 0
    assert json.loads(capsys.readouterr().out) == {
        LABEL_CARDS: "card0.card1",
        LABEL_GPU_NUMBERS: "0.1",
        LABEL_NUMA_GPU_MAP: "0-0_1-1",
    }


def test_usage_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert labeler.run(_args(sysfs_root=str(tmp_path))) == 2
    assert labeler.run(_args(sysfs_root=str(tmp_path), vendor=["0xzz"], dry_run=True)) == 2


def _gas(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gas.cli", "label-node", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})},
    )


def test_cli_labels_the_node(apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path) -> None:
    apiserver.add_node({"metadata": {"name": "n1", "labels": {"a": "b"}}})
    sysfs = build_sysfs(tmp_path, intel(0, 2, 10))
    done = _gas("--sysfs-root", str(sysfs), "--node", "n1", "--kubeConfig", kubeconfig)
    assert done.returncode == 0, done.stderr
    assert _node_labels(apiserver) == {
        "a": "b",
        LABEL_GPU_NUMBERS: "0.2.10",
        LABEL_CARDS: "card0.card2.card10",
    }
    assert "node n1: set" in done.stderr

    dry = _gas("-sysfs-root", str(sysfs), "-dry-run", env={"NODE_NAME": "n1"})
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)[LABEL_GPU_NUMBERS] == "0.2.10"


@pytest.fixture
def watcher(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """`label-node --watch` on a sysfs root that is a symlink the test can swap."""
    pytest.importorskip("pyudev")
    apiserver.add_node({"metadata": {"name": "n1"}})
    root = tmp_path / "current"
    root.symlink_to(build_sysfs(tmp_path / "before", intel(0)))
    args = ["--sysfs-root", str(root), "--watch", "--resync", "0.2", "--kubeConfig", kubeconfig]
    process = subprocess.Popen(
        [sys.executable, "-m", "gas.cli", "label-node", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "NODE_NAME": "n1"},
    )
    yield root, process
    process.terminate()
    process.communicate(timeout=10)


def test_cli_watch_follows_the_cards(
    apiserver: ApiServerDouble, watcher: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    root, process = watcher

    def wait_labels(numbers: str | None) -> None:
        deadline = time.monotonic() + 10
        while _node_labels(apiserver).get(LABEL_GPU_NUMBERS) != numbers:
            if process.poll() is not None:
                pytest.fail(f"label-node --watch exited: {process.communicate()[1]}")
            assert time.monotonic() < deadline, _node_labels(apiserver)
            time.sleep(0.05)

    wait_labels("0")
    # No uevent reaches the test: the periodic resync picks up the new tree.
    swap = tmp_path / "swap"
    swap.symlink_to(build_sysfs(tmp_path / "after", intel(0, 1)))
    swap.replace(root)
    wait_labels("0.1")
    swap.symlink_to(tmp_path / "empty")
    swap.replace(root)
    wait_labels(None)


# ---------------------------------------------------------------- the DaemonSet


def test_daemonset_is_least_privilege_and_runs_the_command() -> None:
    docs = {
        d["kind"]: d
        for d in yaml.safe_load_all((ROOT / "deploy" / "labeler-daemonset.yaml").read_text())
        if d
    }
    assert set(docs) == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
    }
    assert docs["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    ]
    account = docs["ServiceAccount"]["metadata"]
    assert (account["name"], account["namespace"]) == ("gas-labeler", "gas-system")
    assert docs["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "gas-labeler", "namespace": "gas-system"}
    ]
    assert docs["ClusterRoleBinding"]["roleRef"]["name"] == "gas-labeler"
    daemonset = docs["DaemonSet"]
    assert daemonset["metadata"]["namespace"] == "gas-system"
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gas-labeler"
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"/sys", "/run/udev"}
    assert all(m["readOnly"] for m in mounts.values())
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert {volumes[m["name"]] for m in mounts.values()} == {"/sys", "/run/udev"}
    (env,) = container["env"]
    assert env == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert container["args"][0] == "label-node"
    args = build_parser().parse_args(_go_style(container["args"]))
    assert args.watch and args.run is labeler.run
