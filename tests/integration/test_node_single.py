"""One `gas node` per node: a second agent is refused, naming the first, rather than taking
the device-plugin socket from it; a socket file nobody serves is still replaced."""

from __future__ import annotations

import os
import signal
import socket
import struct
from pathlib import Path

from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard
from tests.support.nodeproc import NodeProcess, NodeRig
from tests.support.objects import gpu_node
from tests.support.polling import wait_for

I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"
BOTH = [(I915, "gas-i915.sock"), (XE, "gas-xe.sock")]


def listener(path: str) -> tuple[bool, int | None]:
    """Whether a process accepts connections on `path`, and its pid (SO_PEERCRED)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return False, None
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return True, struct.unpack("3i", creds)[0]


def _second(rig: NodeRig, kubeconfig: str, log: Path) -> NodeProcess:
    return NodeProcess(rig.node, kubeconfig, rig.kubelet, rig.sysfs, rig.devfs, log)


def test_a_second_agent_is_refused_and_a_dead_ones_socket_replaced(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    apiserver.add_node(gpu_node("n1", "0.1"))
    rig = NodeRig(apiserver, kubeconfig, "n1", [FakeCard(0), FakeCard(1, driver="xe")], tmp_path)
    second: NodeProcess | None = None
    try:
        rig.wait_registered()
        second = _second(rig, kubeconfig, tmp_path / "second.log")
        assert rig.agent.process is not None and second.process is not None
        first_pid = rig.agent.process.pid
        assert second.process.wait(timeout=60) == 1
        said = second.log()
        assert f"pid {first_pid}: " in said and "gas.cli node --node-name n1" in said, said
        assert "another process" in said and "Traceback" not in said
        # The first kept its sockets and was never made to register again.
        assert rig.agent.alive()
        assert sorted(rig.kubelet.registrations) == BOTH
        sockets = [str(rig.kubelet.plugin_dir / name) for _, name in BOTH]
        assert [listener(path) for path in sockets] == [(True, first_pid)] * 2

        # Killed, the first leaves its socket files behind, answered by no one: replaced.
        rig.agent.stop(signal.SIGKILL)
        assert all(os.path.exists(path) for path in sockets)
        assert [listener(path) for path in sockets] == [(False, None)] * 2
        second.start()
        wait_for(lambda: len(rig.kubelet.registrations) == 4, timeout=30, what="registered")
        assert sorted(rig.kubelet.registrations) == sorted(BOTH + BOTH)
        assert second.alive() and second.process is not None
        assert [listener(path) for path in sockets] == [(True, second.process.pid)] * 2
    finally:
        if second is not None:
            second.stop()
        rig.close()


def test_an_agent_whose_socket_is_taken_while_it_runs_stops_naming_the_taker(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    """Two agents started at once can both find the socket free; the one whose socket the
    other then replaces stops (one agent stays) instead of serving a socket nobody reaches."""
    apiserver.add_node(gpu_node("n1", "0"))
    rig = NodeRig(apiserver, kubeconfig, "n1", [FakeCard(0)], tmp_path)
    taker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        rig.wait_registered()
        path = rig.kubelet.plugin_dir / "gas-i915.sock"
        path.unlink()  # as a second agent serving the same socket does
        taker.bind(str(path))
        taker.listen()
        assert rig.agent.process is not None
        assert rig.agent.process.wait(timeout=30) == 1
        said = rig.agent.log()
        assert f"another process (pid {os.getpid()}: " in said, said
        assert "Traceback" not in said
        assert path.exists(), said
        assert listener(str(path)) == (True, os.getpid())  # the taker's, left alone
    finally:
        taker.close()
        rig.close()
