"""Who answers on a unix socket: an agent serves one of the kubelet's sockets only after
checking that no other process does.

Two agents on one node (a second DaemonSet, one run by hand beside the pod) would take a
socket from each other and answer for the same cards twice. A socket file nobody answers
on (left by an agent that died) may be replaced; one a live process answers on may not.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

PROBE_TIMEOUT = 2.0

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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
