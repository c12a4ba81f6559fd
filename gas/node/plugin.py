"""The kubelet device plugin (`v1beta1.DevicePlugin`) for one resource (i915 or xe).

Advertises N shares per card (`card0-0` ...), with the card's NUMA node and its health;
prefers, for each container, the shares of exactly the cards gas chose for it; and hands
a container the device nodes of those cards plus the tile mask.

Never silently wrong. When a container cannot get the cards gas chose (the kubelet picked
others, the cards are gone or full, gas's annotations are unreadable), or its pod cannot be
identified, the request is refused with a gRPC error (the kubelet then fails the pod's
admission; its controller makes a new one, which gas places afresh) and the refusal is
reported: a pod Event, a metric, a log line. A card gas counted for another pod is never
handed out. A GPU pod gas did not place (no gas annotations) gets the kubelet's choice, and
that too is reported, since gas's books do not count it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import NoReturn

import grpc

from gas.host.cards import Card
from gas.kubeapi.events import EventSender
from gas.node.allocation import AllocationError, ContainerGrant, grant
from gas.node.api.deviceplugin.v1beta1 import api_pb2 as pb
from gas.node.api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gas.node.devices import HEALTHY, UNHEALTHY, Device, device_list
from gas.node.handout import HandoutWriter, cards_of_ids, handed_out
from gas.node.identify import GAS, UNMANAGED, Candidate, Decision
from gas.node.matcher import PodMatcher, State
from gas.node.metrics import NodeMetrics
from gas.node.podapi import event_body
from gas.node.podresources import PodResourcesError

log = logging.getLogger(__name__)

REASON_MISMATCH = "GasAllocationMismatch"
REASON_UNIDENTIFIED = "GasPodUnidentified"
REASON_UNMANAGED = "GasPodUnmanaged"
REASON_ALLOCATED = "GasDevicesAllocated"


class Reporter:
    """Where the plugin says what it did: Events, metrics, the `gas-node-cards` record."""

    def __init__(
        self,
        node: str,
        metrics: NodeMetrics,
        events: EventSender | None = None,
        writer: HandoutWriter | None = None,
    ) -> None:
        self.node = node
        self.metrics = metrics
        self.events = events
        self.writer = writer

    def pod_event(self, candidate: Candidate, kind: str, reason: str, message: str) -> None:
        if self.events is None:
            return
        pod = candidate.pod
        involved = {"kind": "Pod", "name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
        self.events.send(event_body(involved, kind, reason, message, self.node))

    def node_event(self, reason: str, message: str) -> None:
        if self.events is None:
            return
        involved = {"kind": "Node", "name": self.node, "namespace": "default", "uid": self.node}
        self.events.send(event_body(involved, "Warning", reason, message, self.node))


class DevicePlugin(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: str,
        cards: Sequence[Card],
        shares_per_card: int,
        matcher: PodMatcher,
        reporter: Reporter,
        devfs_root: str = "/dev",
    ) -> None:
        self.resource = resource
        self.shares_per_card = shares_per_card
        self._matcher = matcher
        self._reporter = reporter
        self._devfs_root = devfs_root
        self._cond = threading.Condition()
        self._version = 0
        self._stopped = False
        self._streams = 0
        self._cards: dict[str, Card] = {}
        self._devices: list[Device] = []
        self.set_cards(cards, ())

    # ------------------------------------------------------------ devices

    def set_cards(self, cards: Sequence[Card], unhealthy: Sequence[str]) -> None:
        """The cards now (a vanished card stays, Unhealthy); a new list goes to the
        kubelet when anything changed."""
        devices = device_list(cards, self.shares_per_card, unhealthy)
        with self._cond:
            self._cards = {card.name: card for card in cards}
            if devices == self._devices:
                return
            self._devices = devices
            self._version += 1
            self._cond.notify_all()
        healthy = sum(d.healthy for d in devices)
        self._reporter.metrics.devices.labels(self.resource, HEALTHY).set(healthy)
        self._reporter.metrics.devices.labels(self.resource, UNHEALTHY).set(len(devices) - healthy)
        log.info("%s: %d devices, %d healthy", self.resource, len(devices), healthy)

    def devices(self) -> list[Device]:
        with self._cond:
            return list(self._devices)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def streams(self) -> int:
        """How many `ListAndWatch` streams the kubelet holds open now."""
        with self._cond:
            return self._streams

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    # ------------------------------------------------------------ the service

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return self.options()

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        sent = -1
        with self._cond:
            self._streams += 1
        try:
            while context.is_active():
                with self._cond:
                    if self._stopped:
                        return
                    if self._version == sent:
                        self._cond.wait(timeout=1.0)
                        continue
                    sent, devices = self._version, list(self._devices)
                yield pb.ListAndWatchResponse(devices=[_device(d) for d in devices])
        finally:
            with self._cond:
                self._streams -= 1

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        started = time.perf_counter()
        responses = []
        try:
            for item in request.container_requests:
                available = list(item.available_deviceIDs)
                must = list(item.must_include_deviceIDs)
                decision, state = self._matcher.preferred(
                    self.resource, item.allocation_size, available, must
                )
                ids = self._preferred(decision, state, item.allocation_size, context)
                responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        except PodResourcesError as exc:
            self._unavailable(context, "GetPreferredAllocation", exc)
        finally:
            self._reporter.metrics.latency.labels(self.resource, "preferred").observe(
                time.perf_counter() - started
            )
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        started = time.perf_counter()
        responses = []
        try:
            for item in request.container_requests:
                ids = list(item.devices_ids)
                decision, state = self._matcher.allocate(self.resource, ids)
                handed = self._allocate(decision, state, ids, context)
                responses.append(_container_response(handed))
        except PodResourcesError as exc:
            self._unavailable(context, "Allocate", exc)
        finally:
            self._reporter.metrics.latency.labels(self.resource, "allocate").observe(
                time.perf_counter() - started
            )
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # ------------------------------------------------------------ decisions

    def _preferred(
        self, decision: Decision, state: State, size: int, context: grpc.ServicerContext
    ) -> list[str]:
        metrics = self._reporter.metrics.decisions
        if decision.outcome == GAS:
            metrics.labels(self.resource, "preferred", GAS).inc()
            return list(decision.preferred)
        if decision.outcome == UNMANAGED:
            metrics.labels(self.resource, "preferred", UNMANAGED).inc()
            return []  # the kubelet's own choice; reported at Allocate
        self._refuse(decision, "preferred", f"a request for {size} device(s)", context)

    def _allocate(
        self, decision: Decision, state: State, ids: list[str], context: grpc.ServicerContext
    ) -> ContainerGrant:
        candidate = decision.candidate
        if decision.outcome not in (GAS, UNMANAGED) or candidate is None:
            self._refuse(decision, "allocate", f"devices {', '.join(sorted(ids))}", context)
        container = candidate.container
        with self._cond:
            known = dict(self._cards)
        try:
            if decision.outcome == GAS:
                handed = grant(
                    container.cards,
                    container.tiles,
                    known,
                    composite=container.composite,
                    devfs_root=self._devfs_root,
                )
            else:
                handed = grant(cards_of_ids(ids), (), known, devfs_root=self._devfs_root)
        except AllocationError as exc:
            refused = Decision("mismatch", candidate, str(exc))
            self._refuse(refused, "allocate", f"devices {', '.join(sorted(ids))}", context)
        pod = candidate.pod
        self._matcher.served(pod.uid, container.name, self.resource, ids)
        self._record(candidate, state, handed.cards)
        self._reporter.metrics.decisions.labels(self.resource, "allocate", decision.outcome).inc()
        where = f"{pod.namespace}/{pod.name} container {container.name!r}"
        if decision.outcome == UNMANAGED:
            message = (
                f"container {container.name!r} got {', '.join(handed.cards)} ({self.resource}), "
                f"the kubelet's choice: the pod carries no gas annotations, so gas's books "
                "do not count these cards"
            )
            log.warning("%s: %s", where, message)
            self._reporter.pod_event(candidate, "Warning", REASON_UNMANAGED, message)
        else:
            log.info("%s: %s %s", where, ",".join(handed.cards), dict(handed.envs) or "")
        return handed

    def _record(self, candidate: Candidate, state: State, cards: Sequence[str]) -> None:
        writer = self._reporter.writer
        if writer is None or candidate.container.init:
            return  # gas-node-cards has segments for app containers only
        pod = candidate.pod
        held: dict[str, set[str]] = {}
        for name, resources in state.listing.get(pod.key, {}).items():
            for ids in resources.values():
                held.setdefault(name, set()).update(ids)
        segments = handed_out(pod, writer.segments(pod.uid), held, candidate.container.index, cards)
        writer.record(pod, segments)

    def _refuse(
        self, decision: Decision, method: str, what: str, context: grpc.ServicerContext
    ) -> NoReturn:
        candidate = decision.candidate
        outcome = decision.outcome
        self._reporter.metrics.decisions.labels(self.resource, method, outcome).inc()
        if candidate is None:
            message = (
                f"gas cannot tell which pod {what} of {self.resource} is for: {decision.reason}"
            )
            log.error("%s", message)
            self._reporter.node_event(REASON_UNIDENTIFIED, message)
        else:
            pod, container = candidate.pod, candidate.container
            self._matcher.refused(pod.uid)
            cards = ", ".join(container.cards) or "none"
            message = (
                f"container {container.name!r} cannot get the cards gas chose ({cards}) "
                f"for {what} of {self.resource}: {decision.reason}; refused, so the kubelet "
                "fails the pod's admission rather than hand out a card gas counts elsewhere"
            )
            log.error("%s/%s: %s", pod.namespace, pod.name, message)
            self._reporter.pod_event(candidate, "Warning", REASON_MISMATCH, message)
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)

    def _unavailable(self, context: grpc.ServicerContext, method: str, exc: Exception) -> NoReturn:
        message = f"gas cannot see which devices pods hold: {exc}"
        log.error("%s %s: %s", self.resource, method, message)
        self._reporter.metrics.decisions.labels(self.resource, method.lower(), "error").inc()
        self._reporter.node_event(REASON_UNIDENTIFIED, message)
        context.abort(grpc.StatusCode.UNAVAILABLE, message)


def _device(device: Device) -> pb.Device:
    topology = None
    if device.numa_node is not None and device.numa_node >= 0:
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa_node)])
    return pb.Device(
        ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY, topology=topology
    )


def _container_response(handed: ContainerGrant) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(handed.envs),
        devices=[
            pb.DeviceSpec(
                container_path=node.container_path,
                host_path=node.host_path,
                permissions=node.permissions,
            )
            for node in handed.devices
        ],
    )
