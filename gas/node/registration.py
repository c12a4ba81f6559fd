"""Serving a device plugin on its socket and registering it with the kubelet, again
whenever the kubelet restarts.

The plugin's gRPC server listens on a unix socket in the device-plugin directory, then
calls `v1beta1.Registration/Register` on the kubelet's `kubelet.sock` there. A kubelet
that starts deletes every socket in that directory and creates its `kubelet.sock` anew:
a watcher notices either (the plugin's socket gone, `kubelet.sock` replaced), serves on a
fresh socket and registers again. It also registers again when the kubelet has held no
`ListAndWatch` stream for a few seconds: a 1.28 kubelet drops the registered client when
an older stream of the same resource ends, and says nothing else. Polling the directory
needs no inotify and costs two `stat` calls a second.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent import futures

import grpc

from gas.node.api.deviceplugin.v1beta1 import api_pb2 as pb
from gas.node.api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gas.node.metrics import NodeMetrics
from gas.node.plugin import DevicePlugin
from gas.node.sockets import SocketTaken, check_free, socket_name

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT = 5.0
STREAM_GRACE = 3.0
"""How long after registering the kubelet may go without a `ListAndWatch` stream open
before the plugin registers again (it opens one at once after `Register`)."""


def _identity(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_ctime_ns)


def register(plugin_dir: str, endpoint: str, plugin: DevicePlugin) -> None:
    """One Register call; grpc.RpcError when the kubelet refuses or is not there."""
    target = f"unix://{os.path.join(plugin_dir, KUBELET_SOCKET)}"
    with grpc.insecure_channel(target) as channel:
        pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=plugin.resource,
                options=plugin.options(),
            ),
            timeout=REGISTER_TIMEOUT,
        )


class PluginServer(threading.Thread):
    """Keeps one plugin served and registered for as long as the agent runs."""

    def __init__(
        self,
        plugin: DevicePlugin,
        plugin_dir: str,
        metrics: NodeMetrics,
        stop: threading.Event,
        poll: float = 1.0,
        workers: int = 8,
    ) -> None:
        super().__init__(name=f"plugin-{socket_name(plugin.resource)}", daemon=True)
        self.plugin = plugin
        self.plugin_dir = plugin_dir
        self.endpoint = socket_name(plugin.resource)
        self.path = os.path.join(plugin_dir, self.endpoint)
        self._metrics = metrics
        self._stop_event = stop
        self._poll = poll
        self._workers = workers
        self._server: grpc.Server | None = None
        self._served: tuple[int, int] | None = None  # the socket file it listens on
        self.taken: SocketTaken | None = None
        self._registered_with: tuple[int, int] | None = None
        self._registered_at = 0.0
        self.registrations = 0
        self.registered = threading.Event()

    def run(self) -> None:
        delay = self._poll
        while not self._stop_event.is_set():
            try:
                self._step()
                delay = self._poll
            except SocketTaken as exc:
                # Another agent serves this resource: the node gets one, not two taking
                # the socket from each other; the whole agent stops.
                self.taken = exc
                self._stop_event.set()
                break
            except grpc.RpcError as exc:
                self._metrics.registrations.labels(self.plugin.resource, "failed").inc()
                log.warning("%s: registering with the kubelet failed: %s", self.endpoint, exc)
                self._registered_with = None
                delay = min(max(delay * 2, self._poll), 10.0)
            except Exception:
                log.exception("%s: serving the device plugin failed", self.endpoint)
                self._registered_with = None
                delay = min(max(delay * 2, self._poll), 10.0)
            self._stop_event.wait(delay * random.uniform(0.9, 1.1))
        self._shutdown()

    def _step(self) -> None:
        served = _identity(self.path)
        if self._server is None or served is None:
            if self._server is not None:
                log.info("%s was removed (the kubelet restarted): serving anew", self.path)
            self._serve()
        elif served != self._served:
            check_free(self.path)  # SocketTaken when another agent replaced it
            log.warning("%s was replaced by a socket nobody serves: serving anew", self.path)
            self._serve()
        kubelet = _identity(os.path.join(self.plugin_dir, KUBELET_SOCKET))
        if kubelet is None:
            if self._registered_with is not None:
                log.info("%s: the kubelet's socket is gone; waiting for it", self.endpoint)
                self.registered.clear()
            self._registered_with = None
            return
        if kubelet == self._registered_with and self._stream_lost():
            # A 1.28 kubelet disconnects the registered client when an older stream of
            # the resource ends; the devices turn unhealthy and nothing else says so.
            log.warning(
                "%s: the kubelet holds no ListAndWatch stream; registering again", self.endpoint
            )
            self._registered_with = None
        if kubelet != self._registered_with:
            register(self.plugin_dir, self.endpoint, self.plugin)
            self._registered_with = kubelet
            self._registered_at = time.monotonic()
            self.registrations += 1
            self.registered.set()
            self._metrics.registrations.labels(self.plugin.resource, "ok").inc()
            log.info("%s registered with the kubelet as %s", self.endpoint, self.plugin.resource)

    def _stream_lost(self) -> bool:
        settled = time.monotonic() - self._registered_at > STREAM_GRACE
        return settled and self.plugin.streams() == 0

    def _serve(self) -> None:
        self._shutdown()
        os.makedirs(self.plugin_dir, exist_ok=True)
        check_free(self.path)  # a file nobody answers on is left from an agent that died
        # Bound under a name of its own, then renamed into place: gRPC unlinks the path it
        # bound when the server stops, and that must never be another agent's socket.
        staging = f"{self.path}.{os.getpid()}"
        if os.path.lexists(staging):
            os.unlink(staging)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="plugin")
        )
        pb_grpc.add_DevicePluginServicer_to_server(self.plugin, server)
        server.add_insecure_port(f"unix://{staging}")
        server.start()
        self._server = server
        os.replace(staging, self.path)  # a stale file nobody answered on goes with it
        self._served = _identity(self.path)
        self._registered_with = None

    def _shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=0.5).wait(2.0)

    def close(self) -> None:
        """After the thread ended: the socket goes, so the kubelet marks the devices gone."""
        self.plugin.stop()
        self._shutdown()
        if self.taken is None and os.path.lexists(self.path):
            os.unlink(self.path)  # never another agent's
