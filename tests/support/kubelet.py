"""A kubelet double for the device-plugin side of `gas node`, over real gRPC on unix sockets.

What it copies from the kubelet (v1.28, `pkg/kubelet/cm/devicemanager`, `HandlePodAdditions`,
`pkg/kubelet/apis/podresources`):
- serves `v1beta1.Registration` on `<plugin dir>/kubelet.sock`; on `Register` it dials the
  plugin's socket and follows its `ListAndWatch` stream (healthy IDs are what it gives out);
- receives the pods bound to its node in batches, sorts each batch by
  `metadata.creationTimestamp` (ties in no set order, as Go's sort.Sort over pods whose
  order came from a map), and admits them one at a time; a pod is added to the pods it
  knows just before its admission;
- admission allocates container by container (init containers first, then
  `spec.containers` in order), for each device-plugin resource in the limits: available =
  healthy IDs not allocated to anyone; `GetPreferredAllocation(available, [], size)` when
  the plugin offers it; the preferred IDs that are available first, the rest from the
  available ones in no set order; then `Allocate` of those IDs. Any failure rejects the
  pod (phase Failed, reason UnexpectedAdmissionError) and frees what it got;
- serves `v1.PodResourcesLister/List` on its pod-resources socket: every pod it knows, each
  container with the device IDs it holds (pods with none are listed too);
- forgets a pod's devices once the pod is gone from the API server;
- `restart()` deletes every socket in the plugin dir, as a starting kubelet does, and
  serves a fresh `kubelet.sock`; allocations survive (its checkpoint).
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


@dataclass
class _Endpoint:
    resource: str
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    options: dp.DevicePluginOptions
    devices: dict[str, bool] = field(default_factory=dict)  # id -> healthy
    lists: int = 0
    connected: bool = True


@dataclass
class Admission:
    """What became of one pod: `error` is empty when admitted."""

    uid: str
    namespace: str
    name: str
    error: str = ""
    # container name -> resource -> the plugin's ContainerAllocateResponse
    responses: dict[str, dict[str, dp.ContainerAllocateResponse]] = field(default_factory=dict)


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
        self._lock = threading.RLock()
        self._admit_lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._resources: set[str] = set()  # every resource ever registered (checkpoint)
        self._known: dict[str, dict[str, Any]] = {}  # uid -> pod (the pod manager)
        # uid -> container -> resource -> device IDs (podDevices, the checkpoint)
        self._allocated: dict[str, dict[str, dict[str, list[str]]]] = {}
        self.admissions: dict[str, Admission] = {}
        self.batches: list[list[str]] = []
        self.registrations: list[tuple[str, str]] = []  # (resource, endpoint)
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
        again; what was allocated stays (the checkpoint)."""
        with self._admit_lock:
            if self._registration is not None:
                self._registration.stop(grace=None).wait(5)
            with self._lock:
                for endpoint in self._endpoints.values():
                    endpoint.channel.close()
                self._endpoints.clear()
            for entry in self.plugin_dir.iterdir():
                if entry.is_socket():
                    entry.unlink()
            self._serve_registration()

    # ------------------------------------------------------------ registration

    def register(self, request: dp.RegisterRequest) -> None:
        if request.version != "v1beta1":
            raise ValueError(f"unsupported version {request.version}")
        path = self.plugin_dir / request.endpoint
        channel = grpc.insecure_channel(f"unix://{path}")
        endpoint = _Endpoint(
            request.resource_name, channel, dp_grpc.DevicePluginStub(channel), request.options
        )
        with self._lock:
            old = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = endpoint
            self._resources.add(request.resource_name)
            self.registrations.append((request.resource_name, request.endpoint))
        if old is not None:
            old.channel.close()
        threading.Thread(
            target=self._list_and_watch, args=(endpoint,), name="list-and-watch", daemon=True
        ).start()

    def _list_and_watch(self, endpoint: _Endpoint) -> None:
        try:
            for response in endpoint.stub.ListAndWatch(dp.Empty()):
                with self._lock:
                    endpoint.devices = {d.ID: d.health == "Healthy" for d in response.devices}
                    endpoint.lists += 1
                self._sync_node_status()
        except grpc.RpcError:
            pass
        endpoint.connected = False

    def wait_registered(self, resource: str, devices: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                endpoint = self._endpoints.get(resource)
                if endpoint is not None and len(endpoint.devices) == devices:
                    return
            time.sleep(0.02)
        raise TimeoutError(f"{resource} never registered with {devices} devices")

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
            for resource, endpoint in self._endpoints.items():
                capacity[resource] = str(len(endpoint.devices))
                allocatable[resource] = str(sum(endpoint.devices.values()))
            plugin_resources = set(self._endpoints)
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
            present = {p["metadata"]["uid"] for p in pods}
            self._forget_gone(present)
            batch = [
                p
                for p in pods
                if p["metadata"]["uid"] not in self._known
                and not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase", "Pending") == "Pending"
            ]
            return self._admit_batch(batch)

    def _forget_gone(self, present: set[str]) -> None:
        with self._lock:
            for uid in list(self._known):
                if uid not in present:
                    del self._known[uid]
                    self._allocated.pop(uid, None)

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
        try:
            for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
                for resource, count in sorted(_limits(container).items()):
                    with self._lock:
                        endpoint = self._endpoints.get(resource)
                        known = resource in self._resources
                    if count <= 0 or (endpoint is None and not known):
                        continue
                    if endpoint is None:
                        raise RuntimeError(f"cannot allocate unregistered device {resource}")
                    response = self._allocate(meta["uid"], container["name"], endpoint, count)
                    result.responses.setdefault(container["name"], {})[resource] = response
        except Exception as exc:
            result.error = str(exc)
            with self._lock:
                self._allocated.pop(meta["uid"], None)
        self.admissions[meta["uid"]] = result
        self._set_status(pod, result)
        return result

    def _allocate(
        self, uid: str, container: str, endpoint: _Endpoint, count: int
    ) -> dp.ContainerAllocateResponse:
        with self._lock:
            used = {
                i
                for containers in self._allocated.values()
                for resources in containers.values()
                for i in resources.get(endpoint.resource, [])
            }
            available = [i for i, healthy in endpoint.devices.items() if healthy and i not in used]
        if len(available) < count:
            raise RuntimeError(
                f"requested number of devices unavailable for {endpoint.resource}. "
                f"Requested: {count}, Available: {len(available)}"
            )
        self.random.shuffle(available)  # Go's map order
        chosen: list[str] = []
        if endpoint.options.get_preferred_allocation_available:
            preferred = endpoint.stub.GetPreferredAllocation(
                dp.PreferredAllocationRequest(
                    container_requests=[
                        dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, allocation_size=count
                        )
                    ]
                ),
                timeout=10,
            )
            offered = set(available)
            if preferred.container_responses:
                ids = preferred.container_responses[0].deviceIDs
                chosen = [i for i in ids if i in offered][:count]
        chosen += [i for i in available if i not in chosen][: count - len(chosen)]
        response = endpoint.stub.Allocate(
            dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=chosen)]
            ),
            timeout=10,
        )
        if not response.container_responses:
            raise RuntimeError("no containers return in allocation response")
        # Only now, as the device manager inserts into podDevices (what pod-resources
        # reports) after the plugin's answer.
        with self._lock:
            self._allocated.setdefault(uid, {}).setdefault(container, {})[endpoint.resource] = (
                chosen
            )
        return response.container_responses[0]

    def _set_status(self, pod: dict[str, Any], result: Admission) -> None:
        patch: dict[str, Any] = {"status": {"phase": "Running"}}
        if result.error:
            patch = {
                "status": {
                    "phase": "Failed",
                    "reason": "UnexpectedAdmissionError",
                    "message": f"Allocate failed due to {result.error}, which is unexpected",
                }
            }

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
