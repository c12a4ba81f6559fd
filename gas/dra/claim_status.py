"""What prepare decided, written where people and tools read it: the claim's
`status.devices` (resource.k8s.io/v1, GA in 1.37), one entry per result prepared.

Each entry names the device as the allocation does (driver, pool, device, shareID), with a
`Ready` condition and `data`: the request, the tiles chosen, the environment the device
gives (the tile mask and the share variables) and its CDI device ID. Entries of other
drivers are left as they are: the claim is read, this driver's entries replaced, and the
status written back at the read's resourceVersion, again on a conflict. Unprepare removes
this driver's entries of the claim, if the claim is still there.

The writes are the kubelet's business only after the fact, so they are made from a thread
of their own: a prepare never waits on them, and one that fails is logged, counted and
tried again a few times, never failing the claim.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gas.dra.driver import DRIVER
from gas.dra.state import PreparedClaim
from gas.host.kubeapi import API_TIMEOUT
from gas.kubeapi.core import status_message
from gas.kubeapi.dra import RawResourceV1Api

log = logging.getLogger(__name__)

ATTEMPTS = 5
CONFLICT_RETRIES = 5


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(entry: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def entries(prepared: PreparedClaim, now: str) -> list[dict[str, Any]]:
    """This driver's `status.devices` entries for a prepared claim: one per device and
    share (two requests on one card without shares make one entry)."""
    found: dict[tuple[Any, Any, Any, Any], dict[str, Any]] = {}
    for device in prepared.devices:
        data: dict[str, Any] = {
            "request": device.request,
            "cdiDeviceID": device.cdi_id,
            "environment": dict(device.environment),
        }
        if device.tiles:
            data["tiles"] = list(device.tiles)
        if device.admin:
            data["adminAccess"] = True
        entry: dict[str, Any] = {
            "driver": DRIVER,
            "pool": device.pool,
            "device": device.device,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": f"prepared on node {device.pool}",
                    "lastTransitionTime": now,
                }
            ],
            "data": data,
        }
        if device.share_id is not None:
            entry["shareID"] = device.share_id
        found.setdefault(_key(entry), entry)
    return list(found.values())


def merged(
    existing: Sequence[Mapping[str, Any]], ours: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The claim's `status.devices` with this driver's entries replaced by `ours` (none:
    removed); other drivers' entries kept in place. A condition whose status is unchanged
    keeps the time it was first written."""
    before = {_key(e): e for e in existing if e.get("driver") == DRIVER}
    kept = [dict(e) for e in existing if e.get("driver") != DRIVER]
    fresh = []
    for entry in ours:
        entry = dict(entry)
        old = before.get(_key(entry))
        if old is not None:
            times = {
                (c.get("type"), c.get("status")): c.get("lastTransitionTime")
                for c in old.get("conditions") or []
            }
            entry["conditions"] = [
                {
                    **c,
                    "lastTransitionTime": times.get((c["type"], c["status"]))
                    or c["lastTransitionTime"],
                }
                for c in entry["conditions"]
            ]
        fresh.append(entry)
    return kept + fresh


@dataclass(frozen=True)
class _Job:
    namespace: str
    name: str
    uid: str
    ours: tuple[dict[str, Any], ...]
    """Empty: remove this driver's entries."""
    attempt: int = 1


class ClaimStatusWriter(threading.Thread):
    def __init__(
        self,
        resources: RawResourceV1Api,
        stop: threading.Event,
        on_result: Callable[[str], None] = lambda result: None,
        retry_delay: float = 1.0,
    ) -> None:
        super().__init__(name="claim-status", daemon=True)
        self.resources = resources
        self._stop_event = stop
        self._on_result = on_result
        self._retry_delay = retry_delay
        self._jobs: queue.Queue[_Job | None] = queue.Queue()

    def prepared(self, claim: Mapping[str, Any], prepared: PreparedClaim) -> None:
        del claim  # read afresh at write time: the status may have moved since
        ours = tuple(entries(prepared, _now()))
        self._jobs.put(_Job(prepared.namespace, prepared.name, prepared.uid, ours))

    def unprepared(self, prepared: PreparedClaim) -> None:
        self._jobs.put(_Job(prepared.namespace, prepared.name, prepared.uid, ()))

    def pending(self) -> int:
        return self._jobs.qsize()

    def close(self) -> None:
        self._jobs.put(None)

    def run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            result = self._write(job)
            self._on_result(result)
            if result == "error" and job.attempt < ATTEMPTS and not self._stop_event.is_set():
                self._stop_event.wait(self._retry_delay * job.attempt)
                self._jobs.put(_Job(job.namespace, job.name, job.uid, job.ours, job.attempt + 1))

    def _write(self, job: _Job) -> str:
        """`ok`, `gone` (the claim is deleted or replaced: nothing to write) or `error`."""
        where = f"ResourceClaim {job.namespace}/{job.name}"
        try:
            for _ in range(CONFLICT_RETRIES):
                response = self.resources.read_namespaced_resource_claim(
                    job.name, job.namespace, _request_timeout=API_TIMEOUT
                )
                claim = json.loads(response.data)
                if (claim.get("metadata") or {}).get("uid") != job.uid:
                    return "gone"
                status = dict(claim.get("status") or {})
                existing = status.get("devices") or []
                devices = merged(existing, job.ours)
                if not job.ours and devices == existing:
                    return "ok"
                if not status.get("allocation") and job.ours:
                    return "gone"  # deallocated since: no device left to speak of
                status["devices"] = devices
                body = {**claim, "status": status}
                try:
                    done = self.resources.replace_namespaced_resource_claim_status(
                        job.name, job.namespace, body, _request_timeout=API_TIMEOUT
                    )
                except ApiException as exc:
                    if exc.status == 409:
                        continue
                    raise
                done.drain_conn()
                done.release_conn()
                verb = "written" if job.ours else "removed"
                log.debug("status.devices of %s %s", where, verb)
                return "ok"
            log.warning("status.devices of %s not written: it kept changing", where)
            return "error"
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            message = status_message(exc.status, exc.reason, exc.body)
            log.warning("status.devices of %s not written: %s", where, message)
            return "error"
        except (HTTPError, OSError, ValueError) as exc:
            log.warning("status.devices of %s not written: %s", where, exc)
            return "error"
