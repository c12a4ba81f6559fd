"""The kubelet's unix sockets `gas node` uses, and the check that no other agent serves
gas's device-plugin sockets (`gas.host.sockets` says who answers on one).

No gRPC here: `gas node`'s flags name these paths, and the command line is built without
the `node` extra installed. Two device plugins of one resource take the plugin socket from
each other, each registering again every few seconds while the kubelet stalls in
admission.
"""

from __future__ import annotations

import os

from gas.core.model import GPU_COUNT_RESOURCES
from gas.host.sockets import describe, listener

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def socket_name(resource: str) -> str:
    """`gpu.intel.com/i915` -> `gas-i915.sock`."""
    return f"gas-{resource.rsplit('/', 1)[-1]}.sock"


class SocketTaken(Exception):
    """Another process serves on a socket this agent would serve on."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        super().__init__(
            f"another process ({describe(pid)}) serves the device plugin socket {path}: two "
            "gas node agents on one node take the socket from each other and the kubelet "
            "stalls admitting pods; stop the other one (a second DaemonSet, or one run by "
            "hand) before starting this one"
        )


def check_free(path: str) -> None:
    """SocketTaken when another process listens on `path`."""
    answered, pid = listener(path)
    if answered and pid != os.getpid():
        raise SocketTaken(path, pid)


def check_plugin_sockets(plugin_dir: str) -> None:
    """SocketTaken when another process serves any of gas's device-plugin sockets."""
    for resource in GPU_COUNT_RESOURCES:
        check_free(os.path.join(plugin_dir, socket_name(resource)))
