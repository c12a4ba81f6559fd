"""The kubelet's side of `gas dra`: the DRAPlugin and device health services on the DRA
socket, the registration service on the socket the kubelet's plugin watcher finds, and
the liveness probe that calls both as the kubelet would.

The DRA socket serves first, then the registration socket appears: the kubelet dials the
endpoint GetInfo names as soon as it has registered the plugin. A stale socket file (left
by a process that died) is replaced; one another process answers on stops the start. With
the pod's UID in the socket names (`POD_UID`), a second `gas dra` of the node (the next
pod of a rolling update) serves sockets of its own beside the first: the kubelet
registers both and calls either while both live.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from gas.dra.api.dra.v1 import api_pb2 as dra
from gas.dra.api.dra.v1 import api_pb2_grpc as dra_grpc
from gas.dra.api.pluginregistration.v1 import api_pb2 as reg
from gas.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from gas.dra.claims import ClaimError
from gas.dra.driver import DRIVER, PLUGIN_TYPE, SUPPORTED_VERSIONS
from gas.dra.health_service import HealthFeed, add_health
from gas.dra.metrics import DraMetrics
from gas.dra.preparer import ClaimKey, Preparer
from gas.dra.state import PreparedClaim
from gas.host.sockets import describe, listener

log = logging.getLogger(__name__)

DRA_WORKERS = 16
"""Threads answering the DRA socket: the kubelet's calls, a few health streams (each holds
one while it lasts), the liveness probe."""
PROBE_TIMEOUT = 10.0


def _fill(entry: dra.NodePrepareResourceResponse, prepared: PreparedClaim) -> None:
    for device in prepared.devices:
        answer = entry.devices.add(
            request_names=[device.request],
            pool_name=device.pool,
            device_name=device.device,
            cdi_device_ids=[device.cdi_id],
        )
        if device.share_id is not None:
            answer.share_id = device.share_id


UnpreparedHook = Callable[[PreparedClaim], None]


class DraService(dra_grpc.DRAPluginServicer):
    """Every claim asked about is answered; one that fails carries its error, and the
    others of the call stand."""

    def __init__(
        self,
        preparer: Preparer,
        metrics: DraMetrics,
        on_unprepared: UnpreparedHook = lambda claim: None,
    ) -> None:
        self.preparer = preparer
        self.metrics = metrics
        self.on_unprepared = on_unprepared

    def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        response = dra.NodePrepareResourcesResponse()
        if not request.claims:
            return response  # the liveness probe's call
        started = time.monotonic()
        keys = [ClaimKey(c.namespace, c.name, c.uid) for c in request.claims]
        try:
            outcome = self.preparer.prepare_all(keys)
        except Exception as exc:  # a fault of the call must still answer each claim
            log.exception("prepare failed")
            outcome = {k.uid: ClaimError(f"internal error: {exc}") for k in keys}
        took = time.monotonic() - started
        for key in keys:
            entry = response.claims[key.uid]
            where = f"claim {key.namespace}/{key.name} ({key.uid})"
            result = outcome.get(key.uid) or ClaimError("not prepared")
            if isinstance(result, ClaimError):
                log.error("prepare %s failed: %s", where, result)
                entry.error = str(result)
                self.metrics.calls.labels("prepare", "error").inc()
                continue
            _fill(entry, result)
            self.metrics.calls.labels("prepare", "ok").inc()
            self.metrics.latency.labels("prepare").observe(took)
            cards = ", ".join(f"{d.device} {d.cdi_id}" for d in result.devices) or "no device"
            log.info("prepared %s: %s", where, cards)
        return response

    def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        response = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            entry = response.claims[claim.uid]
            where = f"claim {claim.namespace}/{claim.name} ({claim.uid})"
            try:
                known = self.preparer.unprepare(claim.namespace, claim.name, claim.uid)
            except ClaimError as exc:
                log.error("unprepare %s failed: %s", where, exc)
                entry.error = str(exc)
                self.metrics.calls.labels("unprepare", "error").inc()
                continue
            except Exception as exc:
                log.exception("unprepare %s failed", where)
                entry.error = f"internal error: {exc}"
                self.metrics.calls.labels("unprepare", "error").inc()
                continue
            self.metrics.calls.labels("unprepare", "ok").inc()
            log.info("unprepared %s", where)
            if known is not None:
                self.on_unprepared(known)
        return response


class RegistrationService(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: str, on_registered: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.on_registered = on_registered

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet as %s (%s)", DRIVER, self.endpoint)
            # A kubelet that (re)starts deletes the node's slices: write them again.
            self.on_registered()
        else:
            log.error("the kubelet refused the registration: %s", request.error)
        return reg.RegistrationStatusResponse()


class SocketTaken(Exception):
    """Another process serves a socket of this driver."""


def _serve(path: str, add: Callable[[grpc.Server], None], workers: int) -> grpc.Server:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    answered, pid = listener(path)
    if answered and pid != os.getpid():
        # Two drivers on one socket would each answer for the same cards in turn.
        raise SocketTaken(
            f"another process ({describe(pid)}) serves {path}: stop it before starting this "
            "gas dra, or give each its pod's UID (POD_UID) so that each has sockets of its own"
        )
    if os.path.lexists(path):
        os.unlink(path)  # left by a process that died: nobody answers on it
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    add(server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


class KubeletPlugin:
    """Both servers, started in order and stopped together."""

    def __init__(
        self,
        dra_socket: str,
        registration_socket: str,
        service: DraService,
        health: HealthFeed,
        on_registered: Callable[[], None],
    ) -> None:
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self.service = service
        self.health = health
        self.on_registered = on_registered
        self._servers: list[tuple[grpc.Server, str]] = []

    def start(self) -> None:
        def add_dra(server: grpc.Server) -> None:
            dra_grpc.add_DRAPluginServicer_to_server(self.service, server)
            add_health(server, self.health)

        dra_server = _serve(self.dra_socket, add_dra, workers=DRA_WORKERS)
        self._servers.append((dra_server, self.dra_socket))
        registration = RegistrationService(self.dra_socket, self.on_registered)
        reg_server = _serve(
            self.registration_socket,
            lambda s: reg_grpc.add_RegistrationServicer_to_server(registration, s),
            workers=2,
        )
        self._servers.append((reg_server, self.registration_socket))
        log.info(
            "serving %s on %s, registration on %s",
            DRIVER,
            self.dra_socket,
            self.registration_socket,
        )

    def stop(self, grace: float = 2.0) -> None:
        # The registration socket goes first: the kubelet then drops the plugin rather
        # than calling a service that is closing.
        self.health.close()
        for server, path in reversed(self._servers):
            server.stop(grace).wait(grace + 1)
            if os.path.lexists(path):
                os.unlink(path)
        self._servers.clear()

    def probe(self, timeout: float = PROBE_TIMEOUT) -> str | None:
        """Call both sockets as the kubelet does: GetInfo on the registration socket, an
        empty NodePrepareResources on the DRA socket. None when both answer, else why not
        (the liveness probe's answer)."""
        try:
            with grpc.insecure_channel(f"unix://{self.registration_socket}") as channel:
                info = reg_grpc.RegistrationStub(channel).GetInfo(
                    reg.InfoRequest(), timeout=timeout
                )
            if info.endpoint != self.dra_socket:
                return f"GetInfo names {info.endpoint}, not {self.dra_socket}"
            with grpc.insecure_channel(f"unix://{self.dra_socket}") as channel:
                dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra.NodePrepareResourcesRequest(), timeout=timeout
                )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            return f"{code.name if code else 'error'}: {details}"
        return None
