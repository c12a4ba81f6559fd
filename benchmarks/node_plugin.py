"""`gas node`'s answer time and memory: `GetPreferredAllocation` + `Allocate` for one
container, the way the kubelet calls them, with 110 pods on the node (the kubelet's
default maximum), and the agent's resident memory. Prints figures, asserts nothing.

    python -m benchmarks.node_plugin [ROUNDS]

A real `gas node` process (fake sysfs with 12 cards, 10 shares each), the API-server double
and the kubelet double over real gRPC on unix sockets. 100 pods hold devices; each round
adds 10 pending ones, times the two calls for each, then deletes them.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gas.node.api.deviceplugin.v1beta1 import api_pb2 as dp
from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard
from tests.support.nodeproc import NodeRig
from tests.support.objects import container, gpu_node, gpu_pod

I915 = "gpu.intel.com/i915"
CARDS = 12
HOLDING = 100
PENDING = 10


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _pod(name: str, card: int) -> dict[str, object]:
    return gpu_pod(
        name,
        container("c", i915="1"),
        container("side"),
        node="n1",
        annotations={"gas-container-cards": f"card{card}|"},
    )


def main(rounds: int = 20) -> dict[str, float]:
    logs = Path(tempfile.mkdtemp(prefix="gas-bench-node-"))
    with ApiServerDouble() as api:
        kubeconfig = api.write_kubeconfig(logs / "kubeconfig")
        api.add_node(gpu_node("n1", ".".join(str(i) for i in range(CARDS))))
        rig = NodeRig(api, kubeconfig, "n1", [FakeCard(i) for i in range(CARDS)], logs, run=False)
        try:
            rig.wait_registered()
            for index in range(HOLDING):
                api.add_pod(_pod(f"held{index}", index % CARDS))
            time.sleep(1.0)
            rig.kubelet.sync()
            endpoint = rig.kubelet._endpoints[I915]
            timings: list[float] = []
            for round_ in range(rounds):
                names = [f"r{round_}-{i}" for i in range(PENDING)]
                for i, name in enumerate(names):
                    api.add_pod(_pod(name, (round_ + i) % CARDS))
                time.sleep(0.3)  # the agent's watch delivers them
                for name in names:
                    pod = api.get_pod("default", name)
                    assert pod is not None
                    # the kubelet knows the pod from now on, as before its admission
                    with rig.kubelet._lock:
                        rig.kubelet._known[pod["metadata"]["uid"]] = pod
                    used = {
                        i
                        for containers in rig.kubelet._allocated.values()
                        for res in containers.values()
                        for i in res.get(I915, [])
                    }
                    available = [i for i, ok in endpoint.devices.items() if ok and i not in used]
                    started = time.perf_counter()
                    preferred = endpoint.stub.GetPreferredAllocation(
                        dp.PreferredAllocationRequest(
                            container_requests=[
                                dp.ContainerPreferredAllocationRequest(
                                    available_deviceIDs=available, allocation_size=1
                                )
                            ]
                        )
                    )
                    ids = list(preferred.container_responses[0].deviceIDs)
                    endpoint.stub.Allocate(
                        dp.AllocateRequest(
                            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
                        )
                    )
                    timings.append(time.perf_counter() - started)
                    with rig.kubelet._lock:
                        rig.kubelet._allocated[pod["metadata"]["uid"]] = {"c": {I915: ids}}
                for name in names:
                    api.delete_pod("default", name)
                rig.kubelet.sync()  # forgets the deleted pods and their devices
            assert rig.agent.process is not None
            rss = _rss_kib(rig.agent.process.pid)
        finally:
            rig.close()
            shutil.rmtree(logs, ignore_errors=True)
    timings.sort()
    figures = {
        "pods_on_node": HOLDING + PENDING,
        "samples": len(timings),
        "p50_ms": round(statistics.median(timings) * 1000, 2),
        "p99_ms": round(timings[int(len(timings) * 0.99) - 1] * 1000, 2),
        "max_ms": round(timings[-1] * 1000, 2),
        "rss_mib": round(rss / 1024, 1),
    }
    return figures


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)))
