"""kube-scheduler 1.37 allocating claims on the ResourceSlices gas dra publishes: the books
kept per card by the scheduler alone, from gas's capacities and request policies.

No kubelet: the nodes are what the test POSTs, their slices are `gas.dra.slices`' own
output for fake cards, and pods are bound, never run. kube-controller-manager frees a
claim once its pod is deleted. DRA's `resource.k8s.io/v1` is served
from 1.34, so these run on 1.37 only.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from gas.core.quantity import parse_quantity
from gas.dra.driver import DRIVER
from gas.dra.slices import PciFacts, plain, resource_slice
from gas.host.cards import Card
from tests.support import realk8s
from tests.support.objects import gpu_node
from tests.support.polling import wait_for

VERSION = "1.37"
pytestmark = [
    pytest.mark.skipif(realk8s.missing(VERSION) is not None, reason=str(realk8s.missing(VERSION))),
    pytest.mark.timeout(180),
]

GIB = 1024**3
NAMESPACE = "dra-books"
RESOURCE = "/apis/resource.k8s.io/v1"
CLASS = "gpu.gas.intel.com"
FLEX = PciFacts(device_id="0x56c0", pcie_root="pci0000:00")
MAX = PciFacts(device_id="0x0bd5", pcie_root="pci0000:80")
# Two nodes: two Flex 170 (16 GiB, one tile) on one, one Max 1550 (two tiles, 128 GiB) on
# the other.
NODES: dict[str, list[tuple[Card, PciFacts]]] = {
    "flex-node": [
        (Card("card0", 0, "0x8086", 0, "0000:03:00.0", "renderD128", "i915", 1, 16 * GIB), FLEX),
        (Card("card1", 1, "0x8086", 0, "0000:04:00.0", "renderD129", "i915", 1, 16 * GIB), FLEX),
    ],
    "max-node": [
        (Card("card0", 0, "0x8086", 1, "0000:83:00.0", "renderD128", "i915", 2, 128 * GIB), MAX),
    ],
}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[realk8s.ControlPlane]:
    with realk8s.ControlPlane(tmp_path_factory.mktemp("dra-books"), version=VERSION) as plane:
        plane.prepare_namespace(NAMESPACE)
        # Frees a claim once its pod is gone: without it a deleted pod's claim stays
        # allocated (and undeletable) for good.
        plane.start_controller_manager()
        core = client.CoreV1Api(plane.client())
        for name, cards in NODES.items():
            realk8s.add_schedulable_node(core, gpu_node(name, ""))
            uid = core.read_node(name).to_dict()["metadata"]["uid"]
            body = resource_slice(
                name, uid, plain([c for c, _ in cards], {c.name: f for c, f in cards}), 1
            )
            status, answer = plane.request("POST", f"{RESOURCE}/resourceslices", body)
            assert status == 201, answer
        built = plane.kubectl("kustomize", str(realk8s.ROOT / "deploy" / "dra")).stdout
        (device_class,) = [d for d in yaml.safe_load_all(built) if d["kind"] == "DeviceClass"]
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(device_class))
        plane.start_scheduler(
            yaml.safe_dump({"profiles": [{"schedulerName": "default-scheduler"}]})
        )
        yield plane


def _claim(name: str, capacity: dict[str, str], selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": CLASS, "capacity": {"requests": capacity}}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/none:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _submit(
    plane: realk8s.ControlPlane, prefix: str, count: int, claim: dict[str, Any]
) -> list[str]:
    names = []
    for index in range(count):
        name = f"{prefix}-{index}"
        body = dict(claim, metadata={"name": name, "namespace": NAMESPACE})
        status, answer = plane.request(
            "POST", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", body
        )
        assert status == 201, answer
        status, answer = plane.request(
            "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(name, name)
        )
        assert status == 201, answer
        names.append(name)
    return names


def _settle(plane: realk8s.ControlPlane, names: list[str]) -> tuple[list[str], list[str]]:
    """Wait until every pod is bound or refused by the scheduler, and stays so for 2 s (a
    pod refused while the scheduler had yet to see an earlier claim freed is tried again);
    (bound, refused)."""

    def decided() -> tuple[list[str], list[str]] | None:
        bound, refused = [], []
        for name in names:
            pod = plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")[1]
            if pod["spec"].get("nodeName"):
                bound.append(name)
            elif any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in pod["status"].get("conditions") or []
            ):
                refused.append(name)
        return (bound, refused) if len(bound) + len(refused) == len(names) else None

    deadline = time.monotonic() + 90
    while True:
        found: tuple[list[str], list[str]] = wait_for(decided, 90, "every pod bound or refused")
        time.sleep(2)
        if decided() == found or time.monotonic() > deadline:
            return found


def _allocations(plane: realk8s.ControlPlane, names: list[str]) -> dict[str, dict[str, Any]]:
    """Claim -> its one allocation result (for the claims that have one)."""
    found = {}
    for name in names:
        claim = plane.request("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}")[1]
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            (result,) = allocation["devices"]["results"]
            found[name] = result
    return found


def _capacity(pool: str, device: str, key: str) -> int:
    card, _ = next((c, f) for c, f in NODES[pool] if c.name == device)
    return {"memory": card.memory, "millicores": 1000, "tiles": card.tiles}[key]


def _assert_no_card_over_committed(
    allocations: dict[str, dict[str, Any]],
) -> dict[tuple[str, str], int]:
    """Sum consumedCapacity per card: never more than the card has. Returns the claims
    on each card."""
    consumed: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    claims: dict[tuple[str, str], int] = defaultdict(int)
    for result in allocations.values():
        assert result["driver"] == DRIVER and result.get("shareID"), result
        card = (result["pool"], result["device"])
        claims[card] += 1
        for key, amount in result["consumedCapacity"].items():
            consumed[card][key] += parse_quantity(amount)
    for (pool, device), used in consumed.items():
        for key, amount in used.items():
            assert amount <= _capacity(pool, device, key), (pool, device, key, amount)
    return dict(claims)


def _clean(plane: realk8s.ControlPlane, names: list[str]) -> None:
    for name in names:
        plane.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0")
        plane.request("DELETE", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}")
    path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
    wait_for(lambda: not plane.request("GET", path)[1]["items"], 60, "the claims deleted")


def test_claims_never_over_commit_a_card_and_every_claim_that_fits_is_placed(
    plane: realk8s.ControlPlane,
) -> None:
    # 6 GiB shares of the Flex cards (selected by model): two per 16 GiB card, so four of
    # seven are placed and three refused.
    names = _submit(
        plane,
        "six",
        7,
        _claim(
            "x",
            {"memory": "6Gi"},
            'device.attributes["gpu.gas.intel.com"].model == "Data Center GPU Flex 170"',
        ),
    )
    try:
        bound, refused = _settle(plane, names)
        allocations = _allocations(plane, names)
        assert sorted(allocations) == sorted(bound)
        per_card = _assert_no_card_over_committed(allocations)
        assert per_card == {("flex-node", "card0"): 2, ("flex-node", "card1"): 2}
        assert len(refused) == 3
        # Each share consumed what it asked: 6 GiB is whole 256 MiB steps.
        assert {r["consumedCapacity"]["memory"] for r in allocations.values()} == {"6Gi"}
    finally:
        _clean(plane, names)


def test_a_request_is_rounded_up_to_whole_steps_and_the_rest_takes_the_defaults(
    plane: realk8s.ControlPlane,
) -> None:
    (name,) = _submit(
        plane,
        "odd",
        1,
        _claim("x", {"memory": "1000Mi"}, 'device.attributes["gpu.gas.intel.com"].tileCount == 2'),
    )
    try:
        (bound,), _ = _settle(plane, [name])
        result = _allocations(plane, [name])[bound]
        assert (result["pool"], result["device"]) == ("max-node", "card0")
        consumed = {k: parse_quantity(v) for k, v in result["consumedCapacity"].items()}
        # 1000 MiB -> four steps of 256 MiB; millicores and tiles at their defaults.
        assert consumed == {"memory": 1024 * 1024**2, "millicores": 100, "tiles": 0}
    finally:
        _clean(plane, [name])


def test_tile_requests_are_counted_per_card(plane: realk8s.ControlPlane) -> None:
    # One tile each: the Max 1550 has two, each Flex card one: four placed, the fifth not.
    names = _submit(plane, "tile", 5, _claim("x", {"tiles": "1"}))
    try:
        bound, refused = _settle(plane, names)
        per_card = _assert_no_card_over_committed(_allocations(plane, names))
        assert per_card == {
            ("max-node", "card0"): 2,
            ("flex-node", "card0"): 1,
            ("flex-node", "card1"): 1,
        }
        assert len(bound) == 4 and len(refused) == 1
    finally:
        _clean(plane, names)


def test_the_slices_are_stored_as_gas_dra_writes_them(plane: realk8s.ControlPlane) -> None:
    """The API server keeps every field (consumable capacity on): nothing was dropped."""
    listed = plane.request("GET", f"{RESOURCE}/resourceslices")[1]["items"]
    assert {s["spec"]["nodeName"] for s in listed} == set(NODES)
    for stored in listed:
        for device in stored["spec"]["devices"]:
            assert device["allowMultipleAllocations"] is True
            assert "requestPolicy" in device["capacity"]["memory"]


def _nic_slice(node: str, root: str) -> dict[str, Any]:
    """Another driver's NIC on `node`, on PCIe root `root`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-nic.example.com"},
        "spec": {
            "driver": "nic.example.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "nic0",
                    "attributes": {"resource.kubernetes.io/pcieRoot": {"string": root}},
                }
            ],
        },
    }


def test_a_card_beside_a_nic_of_another_driver_as_the_docs_write_it(
    plane: realk8s.ControlPlane,
) -> None:
    """docs/dra.md's claim for a share on the PCIe root of a NIC: only max-node's NIC shares
    a root with a card (flex-node's sits on another root)."""
    for node, root in (("flex-node", "pci0000:40"), ("max-node", "pci0000:80")):
        status, answer = plane.request("POST", f"{RESOURCE}/resourceslices", _nic_slice(node, root))
        assert status in (201, 409), answer
    nic_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "nic.example.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}]},
    }
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(nic_class))
    claim = _claim("x", {"memory": "8Gi"})
    claim["spec"]["devices"]["requests"].append(
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
    )
    claim["spec"]["devices"]["constraints"] = [
        {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    ]
    (name,) = _submit(plane, "beside", 1, claim)
    try:
        bound, _ = _settle(plane, [name])
        assert bound == [name]
        path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}"
        results = plane.request("GET", path)[1]["status"]["allocation"]["devices"]["results"]
        placed = {r["request"]: (r["driver"], r["pool"], r["device"]) for r in results}
        assert placed == {
            "gpu": (DRIVER, "max-node", "card0"),
            "nic": ("nic.example.com", "max-node", "nic0"),
        }
    finally:
        _clean(plane, [name])
        for node in ("flex-node", "max-node"):
            plane.request("DELETE", f"{RESOURCE}/resourceslices/{node}-nic.example.com")


@pytest.mark.parametrize("folder", ["dra", "dra-webhook"])
def test_the_dra_manifests_apply_whole_with_kubectl_1_37(
    plane: realk8s.ControlPlane, folder: str
) -> None:
    """`kubectl apply -k` of each DRA kustomization, server-side as an operator would, on the
    real 1.37 API server: every object accepted and stored."""
    directory = realk8s.ROOT / "deploy" / folder
    plane.kubectl("apply", "--server-side", "--field-manager=gas-dra-test", "-k", str(directory))
    built = [d for d in yaml.safe_load_all(plane.kubectl("kustomize", str(directory)).stdout) if d]
    stored = plane.kubectl("get", "-k", str(directory), "-o", "name").stdout.split()
    assert len(stored) == len(built)
    # `kubectl get -o name` says kind.group/name: the same objects as built.
    names = {(line.split("/", 1)[0].split(".", 1)[0], line.split("/", 1)[1]) for line in stored}
    assert names == {(d["kind"].lower(), d["metadata"]["name"]) for d in built}
