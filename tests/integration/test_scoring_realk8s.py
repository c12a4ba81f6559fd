"""Node scoring through the real kube-scheduler v1.28 (`../shared/k8s`): with gas's
prioritize verb registered, a binpack pod goes to the fuller node and gas warns of
nothing; with the verb left out, kube-scheduler never asks for scores, and gas says so
when it binds the pod (the `GPUPolicyNotScored` Event and `gas_unscored_binds_total`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gas.core.model import ANNOTATION_CARDS, ANNOTATION_POLICY
from tests.support import realk8s
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.objects import G, container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.promtext import metric

pytestmark = [
    pytest.mark.timeout(150),
]

NAMESPACE = "team-a"


@pytest.fixture
def plane(tmp_path: Path, k8s: realk8s.Release) -> Iterator[realk8s.ControlPlane]:
    with realk8s.ControlPlane(tmp_path / "plane", version=k8s.version) as plane:
        plane.prepare_namespace(NAMESPACE)
        yield plane


def _configuration(port: int, tls: TLSFiles, **fields: Any) -> str:
    return yaml.safe_dump(
        {
            "profiles": [{"schedulerName": "default-scheduler"}],
            "extenders": [realk8s.gas_extender(port, tls, **fields)],
        }
    )


def test_binpack_through_the_real_scheduler_with_and_without_prioritize(
    plane: realk8s.ControlPlane, tmp_path: Path, tls_files: TLSFiles
) -> None:
    core = client.CoreV1Api(plane.client())
    for name in ("gpu-a", "gpu-b"):
        node = gpu_node(name, "0.1", i915="8", memory_max=str(16 * G))
        realk8s.add_schedulable_node(core, node)
    gas = GasProcess(["--kubeConfig", plane.admin_kubeconfig], tmp_path / "gas.log", tls_files)
    gas.wait_ready()

    def schedule(name: str, annotations: dict[str, str] | None = None) -> str:
        """A GPU pod bound through gas: its node."""
        body: Any = gpu_pod(
            name,
            container(i915="1", memory_max=str(2 * G)),
            namespace=NAMESPACE,
            annotations=annotations,
        )
        del body["status"]
        core.create_namespaced_pod(NAMESPACE, body)

        def node() -> str | None:
            pod = core.read_namespaced_pod(name, NAMESPACE).to_dict()
            annotations = pod["metadata"]["annotations"] or {}
            bound = pod["spec"]["node_name"] and annotations.get(ANNOTATION_CARDS)
            return pod["spec"]["node_name"] if bound else None

        try:
            found: str = wait_for(node, timeout=40, what=f"{name} bound through gas")
        except TimeoutError as exc:
            raise AssertionError(f"{name} not bound; gas:\n{gas.log()[-3000:]}") from exc
        return found

    def warned() -> list[str]:
        events = core.list_namespaced_event(NAMESPACE).items
        return [str(e.involved_object.name) for e in events if e.reason == "GPUPolicyNotScored"]

    binpack = {ANNOTATION_POLICY: "binpack"}
    scored = plane.start_scheduler(_configuration(gas.port, tls_files), name="scored")
    first = schedule("first")  # first fit: either node
    # The fuller node scores higher: the binpack pod joins the first.
    assert schedule("packed", binpack) == first
    scored.stop()

    # The same with no prioritize verb: kube-scheduler's own scores choose the node.
    plane.start_scheduler(
        _configuration(gas.port, tls_files, prioritizeVerb="", weight=None), name="unscored"
    )
    schedule("unheard", binpack)
    wait_for(warned, timeout=20, what="the GPUPolicyNotScored Event")
    assert warned() == ["unheard"]
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_unscored_binds_total", policy="binpack") == 1
    assert metric(text, "gas_requests_total", verb="prioritize", outcome="fit") >= 1
    gas.stop()
