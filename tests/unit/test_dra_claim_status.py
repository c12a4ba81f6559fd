"""A prepared claim's `status.devices` entries: one per device and share, each naming the
device as the allocation does, with a Ready condition and what the device gives (request,
CDI device ID, environment, tiles, admin access); merged into the claim's status with
other drivers' entries kept as they are, ours replaced or removed, and a condition's time
kept while its status does not change."""

from __future__ import annotations

import copy
from typing import Any

from gas.dra.claim_status import entries, merged
from gas.dra.driver import DRIVER
from gas.dra.state import PreparedClaim, PreparedDevice

T1 = "2030-01-01T00:00:00Z"
T2 = "2030-01-02T00:00:00Z"


def dev(device: str, share_id: str | None = None, **kw: Any) -> PreparedDevice:
    return PreparedDevice(
        request=kw.pop("request", "gpu"),
        pool="n1",
        device=device,
        share_id=share_id,
        cdi_id=kw.pop("cdi_id", f"{DRIVER}/gpu=claim-{device}"),
        **kw,
    )


def claim(*devices: PreparedDevice) -> PreparedClaim:
    return PreparedClaim("uid-1", "ns", "c", tuple(devices))


def other(device: str, **kw: Any) -> dict[str, Any]:
    """An entry another driver wrote."""
    return {"driver": "nic.example.com", "pool": "n1", "device": device, **kw}


def test_an_entry_names_the_device_as_the_allocation_does() -> None:
    environment = (("ZE_AFFINITY_MASK", "1"), ("GAS_CARD0_TILES", "1"))
    (entry,) = entries(
        claim(dev("card0", "s-1", tiles=(1,), environment=environment, cdi_id="x/gpu=a")), T1
    )
    assert entry == {
        "driver": DRIVER,
        "pool": "n1",
        "device": "card0",
        "shareID": "s-1",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared on node n1",
                "lastTransitionTime": T1,
            }
        ],
        "data": {
            "request": "gpu",
            "cdiDeviceID": "x/gpu=a",
            "environment": {"ZE_AFFINITY_MASK": "1", "GAS_CARD0_TILES": "1"},
            "tiles": [1],
        },
    }


def test_no_tiles_no_share_and_no_admin_access_leave_their_fields_out() -> None:
    (entry,) = entries(claim(dev("card0")), T1)
    assert "shareID" not in entry
    assert entry["data"] == {
        "request": "gpu",
        "cdiDeviceID": f"{DRIVER}/gpu=claim-card0",
        "environment": {},
    }


def test_admin_access_is_said_only_when_true() -> None:
    (entry,) = entries(claim(dev("card0", admin=True)), T1)
    assert entry["data"]["adminAccess"] is True
    (plain,) = entries(claim(dev("card0", admin=False)), T1)
    assert "adminAccess" not in plain["data"]


def test_one_entry_per_device_and_share() -> None:
    found = entries(
        claim(
            dev("card0", "s-1", request="a"),
            dev("card0", "s-2", request="b"),
            dev("card1", request="c"),
            # A second request on card1 without a share: the same device, one entry.
            dev("card1", request="d"),
        ),
        T1,
    )
    keys = [(e["device"], e.get("shareID"), e["data"]["request"]) for e in found]
    assert keys == [("card0", "s-1", "a"), ("card0", "s-2", "b"), ("card1", None, "c")]


def test_a_claim_without_devices_has_no_entries() -> None:
    assert entries(claim(), T1) == []


def test_other_drivers_entries_are_kept_and_ours_replaced() -> None:
    nic0, nic1 = other("eth0", data={"ip": "10.0.0.1"}), other("eth1")
    old_ours = entries(claim(dev("card0", "s-old")), T1)
    existing = [nic0, *old_ours, nic1]
    before = copy.deepcopy(existing)
    ours = entries(claim(dev("card1", "s-new")), T2)
    result = merged(existing, ours)
    assert [e for e in result if e["driver"] != DRIVER] == [nic0, nic1]
    assert [e for e in result if e["driver"] == DRIVER] == ours
    assert existing == before  # the claim read is not changed in place


def test_ours_removed_leaves_the_others_as_they_were() -> None:
    nic0, nic1 = other("eth0"), other("eth1")
    existing = [nic0, *entries(claim(dev("card0")), T1), nic1]
    assert merged(existing, ()) == [nic0, nic1]
    assert merged([], ()) == []


def test_an_unchanged_condition_keeps_the_time_it_was_first_written() -> None:
    first = entries(claim(dev("card0", "s-1")), T1)
    again = merged(first, entries(claim(dev("card0", "s-1")), T2))
    assert [c["lastTransitionTime"] for c in again[0]["conditions"]] == [T1]
    # A device not written before takes the new time.
    added = merged(first, entries(claim(dev("card0", "s-1"), dev("card1")), T2))
    times = {e["device"]: e["conditions"][0]["lastTransitionTime"] for e in added}
    assert times == {"card0": T1, "card1": T2}


def test_a_condition_whose_status_changed_takes_the_new_time() -> None:
    first = entries(claim(dev("card0")), T1)
    first[0]["conditions"][0]["status"] = "False"
    (again,) = merged(first, entries(claim(dev("card0")), T2))
    assert again["conditions"][0]["status"] == "True"
    assert again["conditions"][0]["lastTransitionTime"] == T2


def test_another_drivers_entry_for_the_same_device_name_is_not_ours() -> None:
    theirs = other("card0", shareID="s-1", conditions=[{"type": "Ready", "status": "True"}])
    result = merged([theirs], entries(claim(dev("card0", "s-1")), T2))
    assert result[0] == theirs
    assert result[1]["driver"] == DRIVER
    assert result[1]["conditions"][0]["lastTransitionTime"] == T2
