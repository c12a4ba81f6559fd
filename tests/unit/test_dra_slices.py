"""The node's ResourceSlice from its cards: the standard and gas's own attributes, the
capacities with their request policies, all within what the API server's validation of
resource.k8s.io/v1 accepts, and the comparison that keeps the pool's generation still."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from gas.core.quantity import parse_quantity
from gas.dra.driver import DRIVER
from gas.dra.pcifacts import facts_of, pcie_root
from gas.dra.slices import (
    MEMORY_STEP,
    CardState,
    PciFacts,
    devices_differ,
    dropped_fields,
    memory_capacity,
    plain,
    published,
    resource_slice,
    slice_spec,
)
from gas.host.cards import Card
from gas.host.discovery import discover_sysfs
from tests.support.fakesysfs import GIB, FakeCard, write_sysfs

MIB = 1024**2
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def card(number: int, **kw: Any) -> Card:
    base: dict[str, Any] = {
        "name": f"card{number}",
        "number": number,
        "vendor": "0x8086",
        "numa_node": 0,
        "pci_address": f"0000:{number + 3:02x}:00.0",
        "render_node": f"renderD{128 + number}",
        "driver": "i915",
        "tiles": 1,
        "memory": 16 * GIB,
    }
    base.update(kw)
    return Card(**base)


def q(value: str) -> int:
    return parse_quantity(value)


def policy_problems(name: str, capacity: dict[str, Any]) -> list[str]:
    """The API server's checks of a capacity's request policy (resource.k8s.io/v1)."""
    value = q(capacity["value"])
    policy = capacity.get("requestPolicy")
    if policy is None:
        return []
    problems = []
    default = q(policy["default"])
    if "validValues" in policy:
        values = [q(v) for v in policy["validValues"]]
        if values != sorted(values) or len(values) > 10 or any(v > value for v in values):
            problems.append(f"{name}: validValues")
        if default not in values:
            problems.append(f"{name}: default not a valid value")
    if "validRange" in policy:
        rng = policy["validRange"]
        low = q(rng["min"])
        if low > value:
            problems.append(f"{name}: min above the value")
        if default < low:
            problems.append(f"{name}: default below min")
        if "max" in rng and (q(rng["max"]) > value or default > q(rng["max"])):
            problems.append(f"{name}: max")
        if "step" in rng:
            step = q(rng["step"])
            if low + step > value:
                problems.append(f"{name}: one step above the value")
            if (default - low) % step:
                problems.append(f"{name}: default off the step")
    return problems


def device_problems(device: dict[str, Any]) -> list[str]:
    problems = []
    if not DNS_LABEL.match(device["name"]):
        problems.append(f"device name {device['name']}")
    names = [*device["attributes"], *device["capacity"]]
    if len(names) > 32:
        problems.append("more than 32 attributes and capacities")
    for qualified in names:
        domain, _, short = qualified.rpartition("/")
        if domain and not DNS_SUBDOMAIN.match(domain):
            problems.append(f"domain of {qualified}")
        if not C_IDENTIFIER.match(short):
            problems.append(f"name {qualified}")
    for name, attribute in device["attributes"].items():
        if len(attribute) != 1 or next(iter(attribute)) not in ("int", "bool", "string", "version"):
            problems.append(f"attribute {name}: {attribute}")
    policies = any("requestPolicy" in c for c in device["capacity"].values())
    if policies and not device.get("allowMultipleAllocations"):
        problems.append("request policies without allowMultipleAllocations")
    for name, capacity in device["capacity"].items():
        problems += policy_problems(name, capacity)
    return problems


def test_the_driver_name_is_a_dns_subdomain_of_its_own() -> None:
    assert DNS_SUBDOMAIN.match(DRIVER) and len(DRIVER) <= 63
    assert DRIVER != "gpu.intel.com"


def test_one_pool_per_node_one_slice_one_device_per_card_in_card_order() -> None:
    spec = slice_spec("node-a", plain([card(10), card(2)], {}), generation=4)
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 4, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["card2", "card10"]
    assert all(d["allowMultipleAllocations"] is True for d in spec["devices"])


def test_a_node_without_cards_keeps_an_empty_slice() -> None:
    assert slice_spec("n", plain([], {}), 1)["devices"] == []


def test_attributes_standard_and_gas_own() -> None:
    facts = {"card1": PciFacts("0x56c0", "pci0000:17")}
    (device,) = slice_spec("n", plain([card(1, driver="xe", tiles=2, numa_node=1)], facts), 1)[
        "devices"
    ]
    assert device["attributes"] == {
        "resource.kubernetes.io/pciBusID": {"string": "0000:04:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:17"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "cardIndex": {"int": 1},
        "pciDeviceId": {"string": "0x56c0"},
        "model": {"string": "Data Center GPU Flex 170"},
        "driver": {"string": "xe"},
        "tileCount": {"int": 2},
    }


def test_unknown_facts_are_left_out_not_guessed() -> None:
    (device,) = slice_spec("n", plain([card(0, numa_node=None)], {"card0": PciFacts("0x1234")}), 1)[
        "devices"
    ]
    attributes = device["attributes"]
    assert "resource.kubernetes.io/numaNode" not in attributes
    assert "resource.kubernetes.io/pcieRoot" not in attributes
    assert "model" not in attributes
    assert attributes["pciDeviceId"] == {"string": "0x1234"}


def test_capacities_and_their_policies() -> None:
    (device,) = slice_spec("n", plain([card(0, memory=16 * GIB, tiles=2)], {}), 1)["devices"]
    capacity = device["capacity"]
    assert capacity["memory"] == {
        "value": "16Gi",
        "requestPolicy": {
            "default": "1536Mi",  # a tenth of 16Gi, down to whole 256Mi steps
            "validRange": {"min": "256Mi", "step": "256Mi"},
        },
    }
    assert capacity["millicores"] == {
        "value": "1000",
        "requestPolicy": {"default": "100", "validRange": {"min": "10", "step": "10"}},
    }
    assert capacity["tiles"] == {
        "value": "2",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
    }


@pytest.mark.parametrize(
    "memory",
    [0, 1, 255 * MIB, 256 * MIB, 511 * MIB, 512 * MIB, 2 * GIB + 1, 4 * GIB, 48 * GIB, 128 * GIB],
)
@pytest.mark.parametrize("tiles", [1, 2, 4])
def test_every_device_passes_the_api_validation(memory: int, tiles: int) -> None:
    (device,) = slice_spec("n", plain([card(0, memory=memory, tiles=tiles)], {}), 1)["devices"]
    assert device_problems(device) == []


def test_memory_too_small_for_two_steps_has_no_policy() -> None:
    assert memory_capacity(2 * MEMORY_STEP - 1) == {"value": str(2 * MEMORY_STEP - 1)}
    assert memory_capacity(0) == {"value": "0"}
    small = memory_capacity(2 * MEMORY_STEP)
    assert small["requestPolicy"]["default"] == "256Mi"


def test_the_object_is_owned_by_its_node() -> None:
    obj = resource_slice("n1", "uid-1", plain([card(0)], {}), 3)
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    assert obj["kind"] == "ResourceSlice"
    assert obj["metadata"]["name"] == f"n1-{DRIVER}"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1", "controller": True}
    ]


def test_the_same_devices_written_otherwise_do_not_differ() -> None:
    desired = slice_spec("n", plain([card(0)], {}), 2)
    stored = slice_spec("n", plain([card(0)], {}), 7)
    stored["devices"][0]["capacity"]["memory"]["value"] = str(16 * GIB)
    stored["devices"][0]["capacity"]["millicores"]["requestPolicy"]["default"] = "0.1k"
    assert not devices_differ(stored, desired)
    assert devices_differ(slice_spec("n", plain([card(0), card(1)], {}), 2), desired)
    assert devices_differ(slice_spec("other", plain([card(0)], {}), 2), desired)
    assert devices_differ(slice_spec("n", plain([card(0, memory=8 * GIB)], {}), 2), desired)


def test_pci_facts_read_from_a_sysfs_tree(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1, driver="xe")])
    cards = discover_sysfs(sysfs)
    assert facts_of(sysfs, cards) == {
        "card0": PciFacts("0x56a0", "pci0000:00"),
        "card1": PciFacts("0x56a0", "pci0000:00"),
    }
    gone = Card("card9", 9, "0x8086", None, "0000:99:00.0")
    assert facts_of(sysfs, [gone]) == {"card9": PciFacts()}


def test_pcie_root_is_the_host_bridge_above_the_device() -> None:
    path = Path("/sys/devices/pci0000:3a/0000:3a:01.0/0000:3b:00.0")
    assert pcie_root(path) == "pci0000:3a"
    assert pcie_root(Path("/sys/devices/platform/foo")) == ""


def test_fields_the_api_server_dropped_are_named() -> None:
    sent = slice_spec("n", plain([card(0), card(1)], {}), 1)
    assert dropped_fields(sent, sent) == []
    stripped = copy.deepcopy(sent)
    for device in stripped["devices"][1:]:
        del device["allowMultipleAllocations"]
        for capacity in device["capacity"].values():
            capacity.pop("requestPolicy", None)
    assert dropped_fields(sent, stripped) == [
        "card1: allowMultipleAllocations",
        "card1: memory requestPolicy",
        "card1: millicores requestPolicy",
        "card1: tiles requestPolicy",
    ]


def test_xe_link_groups_join_linked_cards_and_number_them_by_their_lowest_card() -> None:
    from gas.core.model import LABEL_XE_LINKS, SpecError, xe_link_groups

    cards = ["card3", "card1", "card0", "card2", "card4"]
    # Device ids are indices into the numerically sorted cards.
    assert xe_link_groups({LABEL_XE_LINKS: "0.0-1.0_2.0-3.0"}, cards) == {
        "card0": 0,
        "card1": 0,
        "card2": 2,
        "card3": 2,
    }
    # Through another card: one group. A link within one card joins nothing.
    assert xe_link_groups({LABEL_XE_LINKS: "2.0-1.0_1.1-0.1_4.0-4.1"}, cards) == {
        "card0": 0,
        "card1": 0,
        "card2": 0,
    }
    assert xe_link_groups({LABEL_XE_LINKS: "0.0-1.0"}, ["card5", "card12"]) == {
        "card5": 5,
        "card12": 5,
    }
    assert xe_link_groups({}, cards) == {}
    with pytest.raises(SpecError, match="malformed"):
        xe_link_groups({LABEL_XE_LINKS: "0-1"}, cards)
    with pytest.raises(SpecError, match="lacks"):
        xe_link_groups({LABEL_XE_LINKS: "0.0-7.0"}, cards)


def test_xe_link_group_is_an_attribute_of_linked_cards_only() -> None:
    from gas.core.model import LABEL_XE_LINKS

    states = [CardState(card(n)) for n in range(3)]
    linked, notes = published(states, {}, {LABEL_XE_LINKS: "0.0-1.0"})
    assert notes == []
    spec = slice_spec("n", linked, 1)
    groups = {d["name"]: d["attributes"].get("xeLinkGroup") for d in spec["devices"]}
    assert groups == {"card0": {"int": 0}, "card1": {"int": 0}, "card2": None}
    # A change of groups is a change of devices: a new generation.
    assert devices_differ(slice_spec("n", plain([card(0), card(1), card(2)], {}), 1), spec)
