"""The kubelet's unix sockets `gas node` uses, and who answers on one.

No gRPC here: `gas node`'s flags name these paths, and the command line is built without
the `node` extra installed.

Two agents on one node (a second DaemonSet, one run by hand beside the pod) would take the
plugin socket from each other, each registering again every few seconds while the kubelet
stalls in admission. So an agent serves a socket only after checking that no process
answers on it; a socket file nobody answers on (left by an agent that died) is replaced.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

from gas.core.model import GPU_COUNT_RESOURCES

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
PROBE_TIMEOUT = 2.0

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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


def describe(pid: int | None) -> str:
    """`pid 42: gas node --node-name n1`, as far as this process can see the other."""
    if pid is None:
        return "its pid could not be learned: another PID namespace, or too busy to answer"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            words = file.read().split(b"\0")
    except OSError:
        return f"pid {pid}"
    command = " ".join(w.decode(errors="replace") for w in words if w)
    return f"pid {pid}: {command}" if command else f"pid {pid}"


def listener(path: str, timeout: float = PROBE_TIMEOUT) -> tuple[bool, int | None]:
    """Whether a process accepts connections on the unix socket `path`, and its pid
    (SO_PEERCRED; None where the kernel cannot say it in this PID namespace).

    A socket file nobody listens on (left by a process that died) refuses the connection:
    that is (False, None), and the file may be replaced. A listener too busy to accept
    within `timeout` still counts as one."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False, None
    except FileNotFoundError:
        return False, None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False, None
        except TimeoutError:
            return True, None
        pid, _, _ = _PEERCRED.unpack(
            probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
    return True, pid if pid > 0 else None


def check_free(path: str) -> None:
    """SocketTaken when another process listens on `path`."""
    answered, pid = listener(path)
    if answered and pid != os.getpid():
        raise SocketTaken(path, pid)


def check_plugin_sockets(plugin_dir: str) -> None:
    """SocketTaken when another process serves any of gas's device-plugin sockets."""
    for resource in GPU_COUNT_RESOURCES:
        check_free(os.path.join(plugin_dir, socket_name(resource)))
