"""A kubelet double for the DRA side of `gas dra`, over real gRPC on unix sockets.

What it copies from the kubelet (1.37, its plugin watcher and DRA manager):
- finds the driver's registration socket in `<root>/plugins_registry/`, calls
  `pluginregistration.Registration/GetInfo`, checks the answer as the kubelet does (type
  `DRAPlugin`, a driver name, an endpoint, a non-empty version list of which it takes the
  first it supports: `v1.DRAPlugin` or `v1beta1.DRAPlugin`), then tells the driver with
  `NotifyRegistrationStatus` (refusals carry the reason);
- calls `NodePrepareResources` / `NodeUnprepareResources` on the endpoint, with the
  kubelet's 45 s deadline, claims named only by namespace, name and UID;
- checks what the kubelet checks of an answer: every claim asked about is in the map;
- opens the device health stream (`DRAResourceHealth.NodeWatchResources`, v1 as kubelet
  1.37 does, or v1alpha1) on the same endpoint and reads its messages.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gas.dra.api.dra.v1 import api_pb2 as dra
from gas.dra.api.dra.v1 import api_pb2_grpc as dra_grpc
from gas.dra.api.drahealth.v1 import api_pb2 as health_v1
from gas.dra.api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from gas.dra.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from gas.dra.api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from gas.dra.api.pluginregistration.v1 import api_pb2 as reg
from gas.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

KNOWN_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
CALL_TIMEOUT = 45.0


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def message(self) -> dra.Claim:
        return dra.Claim(namespace=self.namespace, name=self.name, uid=self.uid)


class RegistrationRefused(Exception):
    pass


class DraKubeletDouble:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.registry = root / "plugins_registry"
        self.registry.mkdir(parents=True, exist_ok=True)
        self.info: reg.PluginInfo | None = None
        self.service = ""
        self._channel: grpc.Channel | None = None

    def registration_sockets(self) -> list[Path]:
        return sorted(p for p in self.registry.iterdir() if p.suffix == ".sock")

    def register(self, timeout: float = 30.0, socket: str | None = None) -> reg.PluginInfo:
        """Wait for a registration socket (`socket`, a name in the registry, or the first
        one) and register the plugin behind it."""
        deadline = time.monotonic() + timeout

        def found() -> list[Path]:
            sockets = self.registration_sockets()
            return [p for p in sockets if p.name == socket] if socket else sockets

        while not found():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no registration socket {socket or ''} in {self.registry}")
            time.sleep(0.05)
        path = found()[0]
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=10, wait_for_ready=True)
            problem = self._check(info)
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=problem is None, error=problem or ""),
                timeout=10,
            )
        if problem is not None:
            raise RegistrationRefused(problem)
        self.info = info
        self.close()
        self._channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        return info

    def _check(self, info: reg.PluginInfo) -> str | None:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not info.name:
            return "no driver name"
        if not info.endpoint or not os.path.isabs(info.endpoint):
            return f"endpoint {info.endpoint!r} is not an absolute path"
        if not info.supported_versions:
            return "no supported versions"
        known = [v for v in info.supported_versions if v in KNOWN_SERVICES]
        if not known:
            return f"none of {list(info.supported_versions)} is supported"
        self.service = known[0]
        return None

    def _stub(self) -> dra_grpc.DRAPluginStub:
        if self._channel is None:
            raise RuntimeError("not registered")
        return dra_grpc.DRAPluginStub(self._channel)

    def prepare(self, claims: Sequence[ClaimRef]) -> dra.NodePrepareResourcesResponse:
        answer: dra.NodePrepareResourcesResponse = self._stub().NodePrepareResources(
            dra.NodePrepareResourcesRequest(claims=[c.message() for c in claims]),
            timeout=CALL_TIMEOUT,
        )
        _check_all_answered(answer.claims.keys(), claims)
        return answer

    def unprepare(self, claims: Sequence[ClaimRef]) -> dra.NodeUnprepareResourcesResponse:
        answer: dra.NodeUnprepareResourcesResponse = self._stub().NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(claims=[c.message() for c in claims]),
            timeout=CALL_TIMEOUT,
        )
        _check_all_answered(answer.claims.keys(), claims)
        return answer

    def health(self, version: str = "v1") -> HealthWatch:
        """Open the device health stream, as the kubelet does after registering."""
        if self._channel is None:
            raise RuntimeError("not registered")
        return HealthWatch(self._channel, version)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class HealthWatch:
    """One `NodeWatchResources` stream; its messages as {device: (health, message)}."""

    def __init__(self, channel: grpc.Channel, version: str) -> None:
        stub: Any
        if version == "v1":
            stub = health_v1_grpc.DRAResourceHealthStub(channel)
            request: Any = health_v1.NodeWatchResourcesRequest()
            items: list[tuple[str, int]] = list(health_v1.HealthStatus.items())
        else:
            stub = health_v1alpha1_grpc.DRAResourceHealthStub(channel)
            request = health_v1alpha1.NodeWatchResourcesRequest()
            items = list(health_v1alpha1.HealthStatus.items())
        self.names = {int(v): k for k, v in items}
        self.call = stub.NodeWatchResources(request)
        self.messages: queue.Queue[Any] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.messages.put(message)
        except grpc.RpcError as exc:
            self.error = exc

    def next(self, timeout: float = 30.0) -> dict[str, tuple[str, str]]:
        message = self.messages.get(timeout=timeout)
        return {d.device.device_name: (self.names[d.health], d.message) for d in message.devices}

    def until(self, wanted: Any, timeout: float = 60.0) -> dict[str, tuple[str, str]]:
        """The first message for which `wanted(devices)` holds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no health message as wanted")
            try:
                devices = self.next(timeout=left)
            except queue.Empty:
                raise TimeoutError("no health message as wanted") from None
            if wanted(devices):
                return devices

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(timeout=5)


def _check_all_answered(answered: Iterable[str], claims: Sequence[ClaimRef]) -> None:
    missing = {c.uid for c in claims} - set(answered)
    if missing:
        raise AssertionError(f"claims not answered: {sorted(missing)}")
