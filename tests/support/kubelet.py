"""A kubelet double for the device-plugin side of `gas node`, over real gRPC on unix sockets.

What it copies from the kubelet (v1.28, `pkg/kubelet/cm/devicemanager`, `HandlePodAdditions`,
`pkg/kubelet/apis/podresources`), as strictly as the tests can bear:
- serves `v1beta1.Registration` on `<plugin dir>/kubelet.sock`; `Register` dials the
  plugin's socket (blocking, 10 s) and asks `GetDevicePluginOptions` before it answers, so a
  plugin not serving yet fails to register; the options used are that answer's, not the
  request's; then it follows the plugin's `ListAndWatch` stream (healthy IDs are what it
  gives out);
- when a `ListAndWatch` stream ends, the client registered for that resource *now* is
  disconnected and every device of the resource turns unhealthy: 1.28's `runClient` does
  that even when the plugin has registered again meanwhile;
- receives the pods bound to its node in batches, sorts each batch by
  `metadata.creationTimestamp` (ties in no set order, as Go's sort.Sort over pods whose
  order came from a map), and admits them one at a time; a pod is added to the pods it
  knows just before its admission;
- admission runs the admit handlers in the kubelet's order: a pod marked with `reject()`
  is refused before its devices (eviction, sysctls), between two containers (the CPU
  manager) or after them (resources fit, node affinity), with the reason given;
- devices are allocated container by container (init containers first, then
  `spec.containers` in order), for each device-plugin resource in the limits, as
  `devicesToAllocate` does: a container that holds devices already gets no call; devices of
  init containers are reused by the app containers after them; available = healthy IDs not
  allocated to anyone; split by the topology manager's NUMA hint (`numa_hint`: None is
  policy `none`, no hint) into aligned devices (on a hinted NUMA node), unaligned ones and
  ones without topology (`filterByAffinity`). More aligned devices than needed:
  `GetPreferredAllocation(aligned + reused, reused, size)`, the preferred aligned IDs
  first, the rest from the aligned ones. Otherwise every aligned device is taken (exactly
  as many as needed: `Allocate` without asking), then
  `GetPreferredAllocation(available + reused, reused + aligned, size)`, the preferred
  available IDs first, then unaligned, then without topology. So with no hint (no
  topology manager, or devices without topology) the kubelet always asks, whatever the
  number of free devices. Sets iterate in no set order. Then `Allocate` of those IDs in no
  set order. Any failure rejects the pod (phase Failed, reason UnexpectedAdmissionError)
  and frees what it got;
- serves `v1.PodResourcesLister/List` on its pod-resources socket: every pod it knows
  (admitted or refused), each app container with the device IDs it holds, or none;
- frees a pod's devices once the pod is gone from the API server or has finished;
- `restart()` deletes every socket in the plugin dir, as a starting kubelet does, and
  serves a fresh `kubelet.sock`; allocations survive (its checkpoint), and a resource
  known from before has no devices until its plugin registers again.
It also keeps the node's status as the kubelet's status sync does: a device-plugin
resource's capacity is its device count and its allocatable the healthy ones; other
extended resources in capacity are copied to allocatable.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Collection
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gas.core.quantity import parse_quantity
from gas.node.api.deviceplugin.v1beta1 import api_pb2 as dp
from gas.node.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gas.node.api.podresources.v1 import api_pb2 as pr
from gas.node.api.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.support.apiserver import ApiServerDouble

PREFIX = "gpu.intel.com/"
DIAL_TIMEOUT = 10.0
RPC_TIMEOUT = 30.0
"""The kubelet sets none; a test must not hang on a stuck plugin."""
TERMINAL_PHASES = ("Succeeded", "Failed")
AFTER_DEVICES = -1
"""`reject(..., before_container=AFTER_DEVICES)`: refused once every container has its
devices, as by the predicate admit handler (resources fit, node affinity, ports)."""


@dataclass
class _Endpoint:
    resource: str
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    options: dp.DevicePluginOptions
    incarnation: int
    devices: dict[str, bool] = field(default_factory=dict)  # id -> healthy
    numa: dict[str, frozenset[int]] = field(default_factory=dict)  # id -> its NUMA nodes
    lists: int = 0
    connected: bool = True


@dataclass
class Admission:
    """What became of one pod: `error` is empty when admitted."""

    uid: str
    namespace: str
    name: str
    error: str = ""
    reason: str = ""
    # container name -> resource -> the plugin's ContainerAllocateResponse
    responses: dict[str, dict[str, dp.ContainerAllocateResponse]] = field(default_factory=dict)
    preferred_calls: int = 0


class Refused(Exception):
    """An admit handler other than the device manager's refused the pod."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _limits(container: dict[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    # Quantities as the API server accepts them (`5Gi` for memory.max, `1` for devices).
    return {k: parse_quantity(v) for k, v in merged.items() if k.startswith(PREFIX)}


class KubeletDouble:
    def __init__(
        self,
        api: ApiServerDouble,
        node: str,
        root: Path,
        *,
        seed: int = 0,
        poll: float = 0.05,
        status_lag: float = 0.0,
    ) -> None:
        self.api = api
        self.node = node
        self.plugin_dir = root / "device-plugins"
        self.pod_resources_socket = root / "pod-resources" / "kubelet.sock"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self.random = random.Random(seed)
        self.poll = poll
        self.status_lag = status_lag
        self.numa_hint: frozenset[int] | None = None
        """The topology manager's NUMA affinity for every container; None: policy `none`."""
        self._lock = threading.RLock()
        self._admit_lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._resources: set[str] = set()  # every resource ever registered (checkpoint)
        self._incarnation = 0
        self._known: dict[str, dict[str, Any]] = {}  # uid -> pod (the pod manager)
        # uid -> container -> resource -> device IDs (podDevices, the checkpoint)
        self._allocated: dict[str, dict[str, dict[str, list[str]]]] = {}
        self._rejects: dict[str, tuple[int, str, str]] = {}  # name -> (before, reason, text)
        self.admissions: dict[str, Admission] = {}
        self.batches: list[list[str]] = []
        self.registrations: list[tuple[str, str]] = []  # (resource, endpoint)
        self.disconnects: list[str] = []  # resources whose client was disconnected
        self._registration: grpc.Server | None = None
        self._pod_resources: grpc.Server | None = None
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self.paused = threading.Event()

    # ------------------------------------------------------------ lifecycle

    def start(self, run: bool = True) -> KubeletDouble:
        self._serve_registration()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        server.start()
        self._pod_resources = server
        if run:
            self._loop = threading.Thread(target=self._run, name="kubelet", daemon=True)
            self._loop.start()
        return self

    def _serve_registration(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._registration = server

    def stop(self) -> None:
        self._stop.set()
        if self._loop is not None:
            self._loop.join(timeout=10)
        for server in (self._registration, self._pod_resources):
            if server is not None:
                server.stop(grace=None)
        with self._lock:
            for endpoint in self._endpoints.values():
                endpoint.channel.close()

    def restart(self) -> None:
        """As a kubelet restart: every socket in the plugin dir goes, plugins must register
        again; what was allocated stays (the checkpoint), and a resource known from before
        has no devices until its plugin registers again."""
        with self._admit_lock:
            if self._registration is not None:
                self._registration.stop(grace=None).wait(5)
            with self._lock:
                self._incarnation += 1  # the old process's goroutines are gone with it
                for endpoint in self._endpoints.values():
                    endpoint.channel.close()
                self._endpoints.clear()
            for entry in self.plugin_dir.iterdir():
                if entry.is_socket():
                    entry.unlink()
            self._serve_registration()
        self._sync_node_status()

    # ------------------------------------------------------------ registration

    def register(self, request: dp.RegisterRequest) -> None:
        if request.version != "v1beta1":
            raise ValueError(f"unsupported version {request.version}")
        if "/" not in request.resource_name or request.resource_name.startswith("kubernetes.io/"):
            raise ValueError(f"invalid name of device plugin socket: {request.resource_name}")
        path = self.plugin_dir / request.endpoint
        channel = grpc.insecure_channel(f"unix://{path}")
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            # dial with grpc.WithBlock, then PluginConnected asks the options
            grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT)
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=DIAL_TIMEOUT)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            channel.close()
            raise ConnectionError(f"failed to dial device plugin {path}: {exc!r}") from None
        with self._lock:
            old = self._endpoints.get(request.resource_name)
            endpoint = _Endpoint(request.resource_name, channel, stub, options, self._incarnation)
            if old is not None:  # the devices stay as they were until the plugin lists
                endpoint.devices = dict(old.devices)
            self._endpoints[request.resource_name] = endpoint
            self._resources.add(request.resource_name)
            self.registrations.append((request.resource_name, request.endpoint))
        # The old client is not closed: its stream runs on until the plugin ends it.
        threading.Thread(
            target=self._list_and_watch, args=(endpoint,), name="list-and-watch", daemon=True
        ).start()

    def _list_and_watch(self, endpoint: _Endpoint) -> None:
        try:
            for response in endpoint.stub.ListAndWatch(dp.Empty()):
                with self._lock:
                    endpoint.devices = {d.ID: d.health == "Healthy" for d in response.devices}
                    endpoint.numa = {
                        d.ID: frozenset(n.ID for n in d.topology.nodes) for d in response.devices
                    }
                    endpoint.lists += 1
                self._sync_node_status()
        except (grpc.RpcError, ValueError):
            pass
        self._disconnect(endpoint)
        self._sync_node_status()

    def _disconnect(self, ended: _Endpoint) -> None:
        """runClient after its stream ended: disconnect the client registered for the
        resource now, whichever it is (1.28), and mark every device unhealthy."""
        with self._lock:
            current = self._endpoints.get(ended.resource)
            if self._stop.is_set() or current is None:
                return
            if current.incarnation != ended.incarnation:
                return
            current.connected = False
            current.devices = dict.fromkeys(current.devices, False)
            self.disconnects.append(ended.resource)
        current.channel.close()

    def drop_stream(self, resource: str) -> None:
        """Close the connection to the resource's plugin, as the kubelet's disconnect does."""
        with self._lock:
            endpoint = self._endpoints.get(resource)
        if endpoint is not None:
            endpoint.channel.close()

    def wait_registered(self, resource: str, devices: int, timeout: float = 20.0) -> None:
        """Until the resource's plugin is connected and has listed `devices` healthy devices."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                endpoint = self._endpoints.get(resource)
                if (
                    endpoint is not None
                    and endpoint.connected
                    and endpoint.lists > 0
                    and len(endpoint.devices) == devices
                    and all(endpoint.devices.values())
                ):
                    return
            time.sleep(0.02)
        raise TimeoutError(f"{resource} never registered with {devices} healthy devices")

    def devices(self, resource: str) -> dict[str, bool]:
        with self._lock:
            endpoint = self._endpoints.get(resource)
            return dict(endpoint.devices) if endpoint is not None else {}

    def _sync_node_status(self) -> None:
        node = self.api.get_node(self.node)
        if node is None:
            return
        status = node.get("status") or {}
        capacity = dict(status.get("capacity") or {})
        allocatable = dict(status.get("allocatable") or {})
        with self._lock:
            for resource in self._resources:
                endpoint = self._endpoints.get(resource)
                found = endpoint.devices if endpoint is not None else {}
                capacity[resource] = str(len(found))
                allocatable[resource] = str(sum(found.values()))
            plugin_resources = set(self._resources)
        for key, value in capacity.items():
            if key.startswith(PREFIX) and key not in plugin_resources:
                allocatable[key] = value
        # As the kubelet does, an extended resource gone from capacity leaves allocatable.
        gone: dict[str, None] = {
            key: None for key in allocatable if key.startswith(PREFIX) and key not in capacity
        }
        for key in gone:
            del allocatable[key]
        if capacity != status.get("capacity") or allocatable != status.get("allocatable"):
            with contextlib.suppress(Exception):
                self.api.patch_node(
                    self.node,
                    {"status": {"capacity": capacity, "allocatable": {**allocatable, **gone}}},
                )

    # ------------------------------------------------------------ admission

    def reject(
        self, name: str, reason: str = "OutOfcpu", before_container: int = 0, message: str = ""
    ) -> None:
        """Have an admit handler other than the device manager's refuse pod `name`: before
        any device (0), before app container number `before_container` (the CPU manager
        runs before the device manager for each container), or `AFTER_DEVICES`."""
        text = message or f"Node didn't have enough resource: {reason}"
        self._rejects[name] = (before_container, reason, text)

    def _run(self) -> None:
        last_status = 0.0
        while not self._stop.is_set():
            if not self.paused.is_set():
                self.sync()
            if time.monotonic() - last_status > 0.5:
                self._sync_node_status()
                last_status = time.monotonic()
            self._stop.wait(self.poll)

    def sync(self) -> list[Admission]:
        """Take the pods bound to this node that it has not seen, as one batch."""
        with self._admit_lock:
            pods = [
                p
                for p in self.api.list_pods()
                if (p.get("spec") or {}).get("nodeName") == self.node
            ]
            self._forget_gone(pods)
            batch = [
                p
                for p in pods
                if p["metadata"]["uid"] not in self._known
                and not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase", "Pending") == "Pending"
            ]
            return self._admit_batch(batch)

    def _forget_gone(self, pods: list[dict[str, Any]]) -> None:
        """Pods deleted leave the pod manager; pods finished free their devices
        (UpdateAllocatedDevices keeps only active pods' devices)."""
        present = {p["metadata"]["uid"] for p in pods}
        finished = {
            p["metadata"]["uid"]
            for p in pods
            if (p.get("status") or {}).get("phase") in TERMINAL_PHASES
        }
        with self._lock:
            for uid in list(self._known):
                if uid not in present:
                    del self._known[uid]
            for uid in list(self._allocated):
                if uid not in present or uid in finished:
                    del self._allocated[uid]

    def _admit_batch(self, batch: list[dict[str, Any]]) -> list[Admission]:
        if not batch:
            return []
        self.random.shuffle(batch)
        batch.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""))
        self.batches.append([p["metadata"]["name"] for p in batch])
        results = []
        for pod in batch:
            with self._lock:
                self._known[pod["metadata"]["uid"]] = pod
            results.append(self._admit(pod))
        return results

    def _admit(self, pod: dict[str, Any]) -> Admission:
        meta = pod["metadata"]
        result = Admission(meta["uid"], meta["namespace"], meta["name"])
        spec = pod.get("spec") or {}
        inits = list(spec.get("initContainers") or [])
        apps = list(spec.get("containers") or [])
        before, reason, text = self._rejects.get(meta["name"], (len(apps) + 1, "", ""))
        steps = [(c, True, None) for c in inits] + [(c, False, i) for i, c in enumerate(apps)]
        reuse: dict[str, set[str]] = {}
        try:
            if before == 0:
                raise Refused(reason, text)
            for container, init, index in steps:
                if index is not None and index == before:
                    raise Refused(reason, text)
                self._allocate_container(result, container, reuse, init)
            if before == AFTER_DEVICES:
                raise Refused(reason, text)
        except Refused as exc:
            result.error, result.reason = str(exc), exc.reason
        except Exception as exc:
            result.error, result.reason = str(exc), "UnexpectedAdmissionError"
        if result.error:
            with self._lock:
                self._allocated.pop(meta["uid"], None)
        self.admissions[meta["uid"]] = result
        self._set_status(pod, result)
        return result

    def _allocate_container(
        self, result: Admission, container: dict[str, Any], reuse: dict[str, set[str]], init: bool
    ) -> None:
        """Manager.Allocate for one container: each device-plugin resource of its limits
        (a Go map: in no set order); an init container's devices are then reusable by the
        containers after it, an app container's are no longer."""
        limits = list(_limits(container).items())
        self.random.shuffle(limits)
        name = container["name"]
        for resource, count in limits:
            with self._lock:
                endpoint = self._endpoints.get(resource)
                known = resource in self._resources
            if not known:
                continue  # not a device-plugin resource (memory.max, millicores, ...)
            if endpoint is None:
                raise RuntimeError(
                    f"no healthy devices present; cannot allocate unhealthy devices {resource}"
                )
            response = self._allocate(result, name, endpoint, count, reuse.get(resource, set()))
            if response is not None:
                result.responses.setdefault(name, {})[resource] = response
        with self._lock:
            held = {
                r: set(ids) for r, ids in self._allocated.get(result.uid, {}).get(name, {}).items()
            }
        for resource, ids in held.items():
            if init:
                reuse.setdefault(resource, set()).update(ids)
            else:
                reuse.get(resource, set()).difference_update(ids)

    def _devices_to_allocate(
        self,
        result: Admission,
        container: str,
        endpoint: _Endpoint,
        required: int,
        reusable: set[str],
    ) -> list[str]:
        """devicesToAllocate: [] when the container holds its devices already."""
        resource = endpoint.resource
        with self._lock:
            previous = self._allocated.get(result.uid, {}).get(container, {}).get(resource)
            healthy = {i for i, ok in endpoint.devices.items() if ok}
            in_use = {
                i
                for containers in self._allocated.values()
                for resources in containers.values()
                for i in resources.get(resource, [])
            }
        if previous is not None and len(previous) != required:
            raise RuntimeError(
                f"pod {result.uid!r} container {container!r} changed request for resource "
                f"{resource!r} from {len(previous)} to {required}"
            )
        if not healthy:
            raise RuntimeError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        if previous is not None:
            if not healthy >= set(previous):
                raise RuntimeError(
                    "previously allocated devices are no longer healthy; cannot allocate "
                    f"unhealthy devices {resource}"
                )
            return []
        allocated = self._pick(sorted(reusable), required)
        if len(allocated) == required:
            return allocated
        needed = required - len(allocated)
        available = sorted(healthy - in_use - set(allocated))
        if len(available) < needed:
            raise RuntimeError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        aligned, unaligned, no_topology = self._by_affinity(endpoint, available)

        def take_from(ids: Collection[str]) -> bool:
            """allocateRemainingFrom: True once enough are taken."""
            for i in self._pick(sorted(set(ids) - set(allocated))):
                if len(allocated) == required:
                    break
                allocated.append(i)
            return len(allocated) == required

        if needed < len(aligned):
            preferred = self._preferred(result, endpoint, aligned + allocated, allocated, required)
            if take_from(preferred & set(aligned)) or take_from(aligned):
                return allocated
            raise RuntimeError("unexpectedly allocated less resources than required")
        if take_from(aligned):
            return allocated  # exactly as many aligned as needed: no GetPreferredAllocation
        preferred = self._preferred(result, endpoint, available + allocated, allocated, required)
        if take_from(preferred & set(available)) or take_from(unaligned):
            return allocated
        if take_from(no_topology):
            return allocated
        raise RuntimeError("unexpectedly allocated less resources than required")

    def _by_affinity(
        self, endpoint: _Endpoint, available: list[str]
    ) -> tuple[list[str], list[str], list[str]]:
        """filterByAffinity: (aligned, unaligned, without topology); all without a hint."""
        hint = self.numa_hint
        if hint is None or not any(endpoint.numa.values()):
            return [], [], available
        aligned = [i for i in available if endpoint.numa.get(i, frozenset()) & hint]
        unaligned = [i for i in available if endpoint.numa.get(i) and i not in aligned]
        return aligned, unaligned, [i for i in available if not endpoint.numa.get(i)]

    def _preferred(
        self,
        result: Admission,
        endpoint: _Endpoint,
        offered: list[str],
        must_include: list[str],
        size: int,
    ) -> set[str]:
        """callGetPreferredAllocationIfAvailable: the IDs the plugin prefers, or none."""
        if not endpoint.options.get_preferred_allocation_available:
            return set()
        result.preferred_calls += 1
        preferred = endpoint.stub.GetPreferredAllocation(
            dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=self._pick(offered),
                        must_include_deviceIDs=self._pick(must_include),
                        allocation_size=size,
                    )
                ]
            ),
            timeout=RPC_TIMEOUT,
        )
        if not preferred.container_responses:
            return set()
        return set(preferred.container_responses[0].deviceIDs)

    def _pick(self, ids: list[str], count: int | None = None) -> list[str]:
        """`count` of `ids` in no set order (a Go set's iteration)."""
        ids = list(ids)
        self.random.shuffle(ids)
        return ids if count is None else ids[:count]

    def _allocate(
        self,
        result: Admission,
        container: str,
        endpoint: _Endpoint,
        count: int,
        reusable: set[str],
    ) -> dp.ContainerAllocateResponse | None:
        chosen = self._devices_to_allocate(result, container, endpoint, count, reusable)
        if not chosen:
            return None
        response = endpoint.stub.Allocate(
            dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=self._pick(chosen))]
            ),
            timeout=RPC_TIMEOUT,
        )
        if not response.container_responses:
            raise RuntimeError("no containers return in allocation response")
        # Only now, as the device manager inserts into podDevices (what pod-resources
        # reports) after the plugin's answer.
        with self._lock:
            self._allocated.setdefault(result.uid, {}).setdefault(container, {})[
                endpoint.resource
            ] = sorted(chosen)
        return response.container_responses[0]

    def _set_status(self, pod: dict[str, Any], result: Admission) -> None:
        patch: dict[str, Any] = {"status": {"phase": "Running"}}
        if result.error:
            message = result.error
            if result.reason == "UnexpectedAdmissionError":
                message = f"Allocate failed due to {result.error}, which is unexpected"
            patch = {"status": {"phase": "Failed", "reason": result.reason, "message": message}}

        def write() -> None:
            with contextlib.suppress(Exception):
                self.api.patch_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], patch)

        if self.status_lag > 0:
            timer = threading.Timer(self.status_lag, write)
            timer.daemon = True
            timer.start()
        else:
            write()

    # ------------------------------------------------------------ pod-resources

    def list_pod_resources(self) -> pr.ListPodResourcesResponse:
        with self._lock:
            pods = []
            for uid, pod in self._known.items():
                containers = []
                for container in (pod.get("spec") or {}).get("containers") or []:
                    held = self._allocated.get(uid, {}).get(container["name"], {})
                    containers.append(
                        pr.ContainerResources(
                            name=container["name"],
                            devices=[
                                pr.ContainerDevices(resource_name=r, device_ids=ids)
                                for r, ids in sorted(held.items())
                            ],
                        )
                    )
                meta = pod["metadata"]
                pods.append(
                    pr.PodResources(
                        name=meta["name"], namespace=meta["namespace"], containers=containers
                    )
                )
        return pr.ListPodResourcesResponse(pod_resources=pods)

    def allocated(self, uid: str) -> dict[str, dict[str, list[str]]]:
        with self._lock:
            return {c: dict(r) for c, r in self._allocated.get(uid, {}).items()}


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletDouble) -> None:
        self._kubelet = kubelet

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        try:
            self._kubelet.register(request)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ConnectionError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletDouble) -> None:
        self._kubelet = kubelet

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        return self._kubelet.list_pod_resources()

    def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        for pod in self._kubelet.list_pod_resources().pod_resources:
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return pr.GetPodResourcesResponse(pod_resources=pod)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        devices = []
        for resource in ("gpu.intel.com/i915", "gpu.intel.com/xe"):
            ids = sorted(self._kubelet.devices(resource))
            if ids:
                devices.append(pr.ContainerDevices(resource_name=resource, device_ids=ids))
        return pr.AllocatableResourcesResponse(devices=devices)


def response_cards(response: dp.ContainerAllocateResponse) -> tuple[str, ...]:
    """The cards whose device nodes a container was given, in numeric order."""
    from gas.core.model import sort_cards

    return sort_cards(
        os.path.basename(d.host_path) for d in response.devices if "/card" in d.host_path
    )
