"""`gas dra`'s writer of claims' `status.devices`, on the API-server double over real HTTP:
a prepare writes this driver's entries and an unprepare removes them, another driver's
entry surviving both; a claim deleted, replaced or deallocated is "gone" and left alone;
a conflict is read again and retried; a failing API server is tried a few times, then
given up."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from gas.dra.claim_status import ATTEMPTS, CONFLICT_RETRIES, ClaimStatusWriter
from gas.dra.driver import DRIVER
from gas.dra.state import PreparedClaim, PreparedDevice
from gas.host.kubeapi import core_api
from gas.kubeapi.dra import RawResourceV1Api
from tests.support.apiserver import ApiServerDouble
from tests.support.draproc import allocated_claim, share
from tests.support.polling import wait_for

STATUS = r"^/apis/resource\.k8s\.io/v1/namespaces/default/resourceclaims/c1/status$"
CLAIM = r"^/apis/resource\.k8s\.io/v1/namespaces/default/resourceclaims/c1$"
NIC = {
    "driver": "nic.example.com",
    "pool": "n1",
    "device": "eth0",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Up",
            "message": "link up",
            "lastTransitionTime": "2030-01-01T00:00:00Z",
        }
    ],
    "data": {"ips": ["10.0.0.7/24"]},
}


class Writing:
    """A started ClaimStatusWriter and the results it reported."""

    def __init__(self, resources: RawResourceV1Api) -> None:
        self.results: list[str] = []
        self.stop = threading.Event()
        self.writer = ClaimStatusWriter(
            resources, self.stop, on_result=self.results.append, retry_delay=0.01
        )
        self.writer.start()

    def wait_results(self, count: int) -> list[str]:
        wait_for(lambda: len(self.results) >= count, timeout=20, what=f"{count} result(s)")
        return list(self.results)

    def close(self) -> None:
        self.writer.close()
        self.writer.join(timeout=20)
        assert not self.writer.is_alive()


@pytest.fixture
def resources(kubeconfig: str) -> Iterator[RawResourceV1Api]:
    core = core_api(kubeconfig)
    try:
        yield RawResourceV1Api(core.api_client)
    finally:
        core.api_client.close()


@pytest.fixture
def writing(resources: RawResourceV1Api) -> Iterator[Writing]:
    found = Writing(resources)
    try:
        yield found
    finally:
        found.stop.set()
        found.close()


def add_claim(apiserver: ApiServerDouble, devices: list[dict[str, Any]] | None = None) -> Any:
    """Claim c1, allocated one share of card0 of node n1; `devices`: its status.devices."""
    body = allocated_claim("c1", "n1", [share("gpu", "card0")])
    if devices is not None:
        body["status"]["devices"] = devices
    return apiserver.add_object("resourceclaims", body)


def prepared_of(stored: Any) -> PreparedClaim:
    (result,) = stored["status"]["allocation"]["devices"]["results"]
    device = PreparedDevice(
        request=result["request"],
        pool=result["pool"],
        device=result["device"],
        share_id=result["shareID"],
        cdi_id=f"{DRIVER}/gpu=c1-card0",
        environment=(("GAS_CARD0_MILLICORES", "100"),),
    )
    metadata = stored["metadata"]
    return PreparedClaim(metadata["uid"], metadata["namespace"], metadata["name"], (device,))


def status_devices(apiserver: ApiServerDouble) -> list[dict[str, Any]]:
    stored = apiserver.get_object("resourceclaims", "c1", "default")
    assert stored is not None
    devices: list[dict[str, Any]] = stored.get("status", {}).get("devices") or []
    return devices


def ours(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in devices if entry["driver"] == DRIVER]


def test_prepare_writes_the_entries_and_unprepare_removes_them_others_kept(
    apiserver: ApiServerDouble, writing: Writing
) -> None:
    stored = add_claim(apiserver, [NIC])
    prepared = prepared_of(stored)
    writing.writer.prepared(stored, prepared)
    assert writing.wait_results(1) == ["ok"]
    devices = status_devices(apiserver)
    assert devices[0] == NIC
    (entry,) = ours(devices)
    assert (entry["pool"], entry["device"]) == ("n1", "card0")
    assert entry["shareID"] == prepared.devices[0].share_id
    assert entry["data"] == {
        "request": "gpu",
        "cdiDeviceID": f"{DRIVER}/gpu=c1-card0",
        "environment": {"GAS_CARD0_MILLICORES": "100"},
    }
    (condition,) = entry["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Ready",
        "True",
        "Prepared",
    )
    assert condition["lastTransitionTime"]
    # The allocation is left as it was.
    after = apiserver.get_object("resourceclaims", "c1", "default")
    assert after is not None
    assert after["status"]["allocation"] == stored["status"]["allocation"]

    writing.writer.unprepared(prepared)
    assert writing.wait_results(2) == ["ok", "ok"]
    assert status_devices(apiserver) == [NIC]


def test_an_unprepare_with_nothing_of_ours_writes_nothing(
    apiserver: ApiServerDouble, writing: Writing
) -> None:
    stored = add_claim(apiserver, [NIC])
    writing.writer.unprepared(prepared_of(stored))
    assert writing.wait_results(1) == ["ok"]
    assert apiserver.count_requests("PUT", STATUS) == 0
    assert status_devices(apiserver) == [NIC]


def test_a_repeated_prepare_keeps_the_first_transition_time(
    apiserver: ApiServerDouble, writing: Writing
) -> None:
    stored = add_claim(apiserver)
    prepared = prepared_of(stored)
    writing.writer.prepared(stored, prepared)
    writing.wait_results(1)
    (first,) = ours(status_devices(apiserver))
    # Time moves on: the second write would stamp a later second.
    wait_for(
        lambda: _now_after(first["conditions"][0]["lastTransitionTime"]), timeout=5, what="1 s"
    )
    writing.writer.prepared(stored, prepared)
    assert writing.wait_results(2) == ["ok", "ok"]
    (second,) = ours(status_devices(apiserver))
    assert second["conditions"] == first["conditions"]


def _now_after(stamp: str) -> bool:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") > stamp


def test_a_deleted_claim_is_gone(apiserver: ApiServerDouble, writing: Writing) -> None:
    stored = add_claim(apiserver)
    apiserver.delete_object("resourceclaims", "c1", "default")
    writing.writer.prepared(stored, prepared_of(stored))
    writing.writer.unprepared(prepared_of(stored))
    assert writing.wait_results(2) == ["gone", "gone"]
    assert apiserver.get_object("resourceclaims", "c1", "default") is None


def test_a_claim_replaced_under_the_same_name_is_gone_and_left_alone(
    apiserver: ApiServerDouble, writing: Writing
) -> None:
    old = add_claim(apiserver)
    apiserver.delete_object("resourceclaims", "c1", "default")
    add_claim(apiserver, [NIC])
    writing.writer.prepared(old, prepared_of(old))
    assert writing.wait_results(1) == ["gone"]
    assert status_devices(apiserver) == [NIC]
    assert apiserver.count_requests("PUT", STATUS) == 0


def test_a_deallocated_claim_is_gone_for_a_prepare(
    apiserver: ApiServerDouble, writing: Writing
) -> None:
    body = allocated_claim("c1", "n1", [share("gpu", "card0")])
    stored = apiserver.add_object("resourceclaims", body)
    apiserver.delete_object("resourceclaims", "c1", "default")
    body["metadata"]["uid"] = stored["metadata"]["uid"]
    del body["status"]["allocation"]
    again = apiserver.add_object("resourceclaims", body)
    assert again["metadata"]["uid"] == stored["metadata"]["uid"]  # the same claim
    writing.writer.prepared(stored, prepared_of(stored))
    assert writing.wait_results(1) == ["gone"]
    assert apiserver.count_requests("PUT", STATUS) == 0


def test_a_conflict_is_read_again_and_retried(apiserver: ApiServerDouble, writing: Writing) -> None:
    stored = add_claim(apiserver, [NIC])
    rule = apiserver.faults.add("PUT", STATUS, ("status", 409))
    writing.writer.prepared(stored, prepared_of(stored))
    assert writing.wait_results(1) == ["ok"]
    assert rule.hits == 1
    assert apiserver.count_requests("PUT", STATUS) == 2
    assert apiserver.count_requests("GET", CLAIM) == 2
    assert len(ours(status_devices(apiserver))) == 1


def test_a_claim_changed_during_the_write_keeps_the_change(
    apiserver: ApiServerDouble, writing: Writing, resources: RawResourceV1Api
) -> None:
    stored = add_claim(apiserver)
    held = apiserver.faults.add("PUT", STATUS, ("hold", None))
    writing.writer.prepared(stored, prepared_of(stored))
    wait_for(lambda: held.hits == 1, timeout=10, what="the writer's PUT held")
    # Another driver writes its entry while ours waits: ours is now stale.
    current = apiserver.get_object("resourceclaims", "c1", "default")
    assert current is not None
    current["status"]["devices"] = [NIC]
    response = resources.replace_namespaced_resource_claim_status(
        "c1", "default", current, _request_timeout=10
    )
    response.drain_conn()
    response.release_conn()
    held.release()
    assert writing.wait_results(1) == ["ok"]
    devices = status_devices(apiserver)
    assert devices[0] == NIC
    assert len(ours(devices)) == 1


def test_a_failing_api_server_is_tried_again(apiserver: ApiServerDouble, writing: Writing) -> None:
    stored = add_claim(apiserver)
    apiserver.faults.add("PUT", STATUS, ("status", 500), times=2)
    writing.writer.prepared(stored, prepared_of(stored))
    assert writing.wait_results(3) == ["error", "error", "ok"]
    assert len(ours(status_devices(apiserver))) == 1


def test_a_claim_that_keeps_conflicting_is_given_up_after_the_attempts(
    apiserver: ApiServerDouble, writing: Writing
) -> None:
    stored = add_claim(apiserver)
    apiserver.faults.add("PUT", STATUS, ("status", 409), times=None)
    writing.writer.prepared(stored, prepared_of(stored))
    assert writing.wait_results(ATTEMPTS) == ["error"] * ATTEMPTS
    writing.close()
    # No attempt beyond the last: none ran, and none is left queued.
    assert writing.results == ["error"] * ATTEMPTS
    assert writing.writer.pending() == 0
    assert apiserver.count_requests("PUT", STATUS) == ATTEMPTS * CONFLICT_RETRIES
    assert ours(status_devices(apiserver)) == []
