"""`gas serve --schedulerLease` beside the real kube-scheduler v1.28 (`../shared/k8s`) with
leader election on: gas follows the Lease as the real scheduler writes it, steps down when
the scheduler gives it up on SIGTERM, and when a killed scheduler's Lease runs out; the
next scheduler's first pods are bound through gas.

One machine has one hostname, so every scheduler here names this "pod": the hand-overs go
from one scheduler process to the next, each with a new identity, as when a pod's
kube-scheduler container restarts. The two-pod rule is tested in test_follow.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gas.core.model import ANNOTATION_CARDS
from tests.support import realk8s
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for

pytestmark = [
    pytest.mark.timeout(115),
]

NAMESPACE = "gas-system"
LEASE = "gas-scheduler"
DURATION = 4  # leaseDuration, shortened; renewDeadline 3s, retryPeriod 1s


@pytest.fixture
def plane(tmp_path: Path, k8s: realk8s.Release) -> Iterator[realk8s.ControlPlane]:
    with realk8s.ControlPlane(tmp_path / "plane", version=k8s.version) as plane:
        plane.prepare_namespace(NAMESPACE)
        plane.prepare_namespace("team-a")
        yield plane


def _configuration(plane: realk8s.ControlPlane, tls: TLSFiles, port: int) -> str:
    config = {
        "clientConnection": {"kubeconfig": plane.admin_kubeconfig, "qps": 50, "burst": 100},
        "leaderElection": {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceName": LEASE,
            "resourceNamespace": NAMESPACE,
            "leaseDuration": f"{DURATION}s",
            "renewDeadline": "3s",
            "retryPeriod": "1s",
        },
        "profiles": [{"schedulerName": LEASE}],
        "extenders": [realk8s.gas_extender(port, tls)],
    }
    return yaml.safe_dump(config)


def _add_gpu_node(core: client.CoreV1Api, name: str) -> None:
    realk8s.add_schedulable_node(core, gpu_node(name, "0.1.2.3", i915="4"))


def _lease(plane: realk8s.ControlPlane) -> dict[str, Any]:
    lease: dict[str, Any] = json.loads(
        plane.kubectl("get", "lease", LEASE, "-n", NAMESPACE, "-o", "json").stdout
    )
    return lease


def _leading(gas: GasProcess) -> bool:
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    return "gas_leader 1.0" in text


def test_gas_follows_the_real_schedulers_lease_through_a_release_and_a_crash(
    plane: realk8s.ControlPlane,
    tmp_path: Path,
    tls_files: TLSFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = client.CoreV1Api(plane.client())
    _add_gpu_node(core, "gpu-1")
    # kube-scheduler's identity starts with this machine's hostname; gas is told it is the
    # pod of that name.
    hostname = socket.gethostname()
    monkeypatch.setenv("POD_NAME", hostname)
    gas = GasProcess(
        [
            "--kubeConfig",
            plane.admin_kubeconfig,
            f"--schedulerLease={LEASE}",
            f"--leaderElectNamespace={NAMESPACE}",
            "--retryPeriod=500ms",
        ],
        tmp_path / "gas.log",
        tls_files,
    )
    config = _configuration(plane, tls_files, gas.port)
    made = iter(range(100))

    def schedule() -> str:
        """A GPU pod for gas-scheduler, bound through gas: its cards."""
        name = f"p{next(made)}"
        body: Any = gpu_pod(name, container(i915="1"), namespace="team-a")
        del body["status"]
        body["spec"]["schedulerName"] = LEASE
        core.create_namespaced_pod("team-a", body)

        def cards() -> str | None:
            pod = core.read_namespaced_pod(name, "team-a").to_dict()
            annotations = pod["metadata"]["annotations"] or {}
            return annotations.get(ANNOTATION_CARDS) if pod["spec"]["node_name"] else None

        try:
            found: str = wait_for(cards, timeout=40, what=f"{name} bound through gas")
        except TimeoutError as exc:
            raise AssertionError(f"{name} not bound; gas:\n{gas.log()[-3000:]}") from exc
        return found

    try:
        gas.wait_ready()
        assert not _leading(gas)  # ready, but no Lease yet

        first = plane.start_scheduler(config, name="scheduler-1")
        wait_for(lambda: _leading(gas), timeout=30, what="gas following scheduler-1")
        holder = _lease(plane)["spec"]["holderIdentity"]
        assert holder.startswith(hostname + "_")
        assert schedule() == "card0"

        # SIGTERM: kube-scheduler v1.28 gives its Lease up (no holder) and exits; gas stops
        # answering at its next reading.
        first.stop()
        assert first.popen.returncode == 0, first.tail()
        spec = _lease(plane)["spec"]
        assert not spec.get("holderIdentity"), spec
        assert spec["leaseDurationSeconds"] == 1
        wait_for(lambda: not _leading(gas), timeout=5, what="gas stepping down on the release")

        # The next scheduler takes a released Lease at once, and its first pod goes through gas.
        second = plane.start_scheduler(config, name="scheduler-2")
        assert schedule() == "card1"
        assert _leading(gas)
        renewed = _lease(plane)["spec"]
        assert renewed["holderIdentity"] != holder

        # SIGKILL: no release. gas stops on its last reading, by renewTime + leaseDuration.
        os.killpg(second.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: not _leading(gas), timeout=DURATION + 3, what="gas stepping down")
        assert time.monotonic() - killed <= DURATION + 2
        assert _lease(plane)["spec"]["holderIdentity"] == renewed["holderIdentity"]
        refused = gas.post("/scheduler/filter", {"Pod": gpu_pod("x"), "NodeNames": ["gpu-1"]})
        assert refused.status_code == 503
        # Synced all along: the answer says the Lease ran out, not that gas is not synced.
        assert "does not answer the scheduler now: the Lease ran out" in refused.json()["Error"]

        # A new scheduler waits a whole leaseDuration of its own, then takes over.
        third = plane.start_scheduler(config, name="scheduler-3")
        assert schedule() == "card2"
        assert _leading(gas)
        assert third.alive()
    finally:
        gas.stop()
    assert "no longer answering the scheduler (503)" in gas.log()
