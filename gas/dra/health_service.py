"""The kubelet's device health service (`DRAResourceHealth`, versions v1 and v1alpha1, the
same messages): each card's health, streamed.

The kubelet opens one stream per plugin endpoint and reads the driver's whole device list
from each message; a device it stops hearing about becomes Unknown after the message's
`health_check_timeout_seconds`. So every stream gets the whole list at once, again at
each change, and again every `RESEND` seconds while nothing changes, well within the
timeout. The kubelet writes what it hears into the status of the pods holding the
devices (`status.containerStatuses[].allocatedResourcesStatus`).

A stream holds one of the DRA server's threads while it lasts: at most `MAX_STREAMS` are
served at once (a kubelet needs one, two across a restart of its own), the others are
refused with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import grpc

from gas.dra.api.drahealth.v1 import api_pb2 as v1
from gas.dra.api.drahealth.v1 import api_pb2_grpc as v1_grpc
from gas.dra.api.drahealth.v1alpha1 import api_pb2 as v1alpha1
from gas.dra.api.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from gas.dra.inventory import Device
from gas.host.health import HEALTHY, UNHEALTHY

RESEND = 10.0
TIMEOUT_SECONDS = 60
MAX_STREAMS = 4
MESSAGE_MAX = 1024


class _Messages(Protocol):
    """What one version's generated module offers: v1 and v1alpha1 alike."""

    NodeWatchResourcesResponse: Any
    DeviceHealth: Any
    DeviceIdentifier: Any
    HealthStatus: Any


class HealthFeed:
    """The latest health of every device, and a condition streams wait on."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._condition = threading.Condition()
        self._devices: dict[str, Device] = {}
        self._changed: dict[str, float] = {}
        self._version = 0
        self._streams = 0
        self._closed = False

    def update(self, devices: Mapping[str, Device]) -> None:
        now = time.time()
        with self._condition:
            for name, device in devices.items():
                before = self._devices.get(name)
                if before is None or before.health != device.health:
                    self._changed[name] = now
            self._devices = dict(devices)
            self._version += 1
            self._condition.notify_all()

    def close(self) -> None:
        """End every stream (the server is stopping)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def _message(self, messages: _Messages) -> Any:
        status = {
            HEALTHY: messages.HealthStatus.HEALTHY,
            UNHEALTHY: messages.HealthStatus.UNHEALTHY,
        }
        entries = []
        for name in sorted(self._devices):
            device = self._devices[name]
            entries.append(
                messages.DeviceHealth(
                    device=messages.DeviceIdentifier(pool_name=self.pool, device_name=name),
                    health=status.get(device.health.status, messages.HealthStatus.UNKNOWN),
                    last_updated_time=int(self._changed.get(name, time.time())),
                    health_check_timeout_seconds=TIMEOUT_SECONDS,
                    message=device.health.message[:MESSAGE_MAX],
                )
            )
        return messages.NodeWatchResourcesResponse(devices=entries)

    def stream(self, messages: _Messages, context: grpc.ServicerContext) -> Iterator[Any]:
        with self._condition:
            if self._streams >= MAX_STREAMS:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{MAX_STREAMS} health streams are open already",
                )
            self._streams += 1
        try:
            seen = -1
            while context.is_active():
                with self._condition:
                    if self._closed:
                        return
                    if seen == self._version:
                        self._condition.wait(RESEND)
                    if self._closed:
                        return
                    seen = self._version
                    message = self._message(messages)
                yield message
        finally:
            with self._condition:
                self._streams -= 1


class HealthV1(v1_grpc.DRAResourceHealthServicer):
    def __init__(self, feed: HealthFeed) -> None:
        self.feed = feed

    def NodeWatchResources(
        self, request: v1.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[v1.NodeWatchResourcesResponse]:
        yield from self.feed.stream(v1, context)


class HealthV1alpha1(v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, feed: HealthFeed) -> None:
        self.feed = feed

    def NodeWatchResources(
        self, request: v1alpha1.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[v1alpha1.NodeWatchResourcesResponse]:
        yield from self.feed.stream(v1alpha1, context)


def add_health(server: grpc.Server, feed: HealthFeed) -> None:
    v1_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(feed), server)
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(HealthV1alpha1(feed), server)
