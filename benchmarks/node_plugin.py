"""`gas node`'s answer time and memory: `GetPreferredAllocation` + `Allocate` for one
container, the way the kubelet calls them, with 110 pods on the node (the kubelet's
default maximum), and the agent's resident memory. Prints figures, asserts nothing.

    python -m benchmarks.node_plugin [ROUNDS]

A real `gas node` process (fake sysfs with 12 cards, 10 shares each), the API-server double
and the kubelet double over real gRPC on unix sockets. 100 pods are admitted (the agent
serves their allocations); each round adds 10 pending ones, times the two calls for each,
then deletes them.

Memory is what an operator sees of the `gas node` process (`ps`, `top`; the kernel's
/proc/<pid>/status): its resident set once registered with no pod yet (`start_rss_mib`),
once it has served every round's allocations (`rss_mib`, split into anonymous and
file-backed pages, the latter mostly shared libraries), and the highest it ever was
(`peak_rss_mib`, VmHWM). The process runs with the DaemonSet's environment
(`MALLOC_ARENA_MAX`, read from deploy/base/node-daemonset.yaml).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gas.node.api.deviceplugin.v1beta1 import api_pb2 as dp
from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard
from tests.support.nodeproc import NodeRig
from tests.support.objects import container, gpu_node, gpu_pod

I915 = "gpu.intel.com/i915"
CARDS = 12
HOLDING = 100
PENDING = 10
DAEMONSET = Path(__file__).resolve().parents[1] / "deploy" / "base" / "node-daemonset.yaml"


def _memory(pid: int) -> dict[str, float]:
    """The process's resident memory in MiB (and its thread count), from the kernel."""
    fields = {"VmRSS": "rss", "VmHWM": "peak", "RssAnon": "anon", "RssFile": "file"}
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            found[fields[key]] = round(int(value.split()[0]) / 1024, 1)
        elif key == "Threads":
            found["threads"] = int(value)
    return found


def _daemonset_env() -> dict[str, str]:
    """The plain `value` variables the DaemonSet gives the gas-node container."""
    for doc in yaml.safe_load_all(DAEMONSET.read_text()):
        if doc and doc.get("kind") == "DaemonSet":
            (agent,) = doc["spec"]["template"]["spec"]["containers"]
            return {e["name"]: e["value"] for e in agent.get("env", []) if "value" in e}
    return {}


def _pod(name: str, card: int) -> dict[str, object]:
    return gpu_pod(
        name,
        container("c", i915="1"),
        container("side"),
        node="n1",
        annotations={"gas-container-cards": f"card{card}|"},
    )


def _allocate_one(rig: NodeRig, api: ApiServerDouble, name: str) -> float:
    """One pending pod's container through the plugin, as the kubelet admits it: the
    seconds `GetPreferredAllocation` + `Allocate` took."""
    endpoint = rig.kubelet._endpoints[I915]
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
        dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    )
    elapsed = time.perf_counter() - started
    with rig.kubelet._lock:
        rig.kubelet._allocated[pod["metadata"]["uid"]] = {"c": {I915: ids}}
    return elapsed


def _start_rig(api: ApiServerDouble, kubeconfig: str, logs: Path) -> NodeRig:
    """The node, its agent started with the DaemonSet's environment."""
    saved = dict(os.environ)
    os.environ.update(_daemonset_env())
    try:
        cards = [FakeCard(i) for i in range(CARDS)]
        return NodeRig(api, kubeconfig, "n1", cards, logs, run=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(rounds: int = 20) -> dict[str, float]:
    logs = Path(tempfile.mkdtemp(prefix="gas-bench-node-"))
    with ApiServerDouble() as api:
        kubeconfig = api.write_kubeconfig(logs / "kubeconfig")
        api.add_node(gpu_node("n1", ".".join(str(i) for i in range(CARDS))))
        rig = _start_rig(api, kubeconfig, logs)
        try:
            rig.wait_registered()
            assert rig.agent.process is not None
            pid = rig.agent.process.pid
            start = _memory(pid)
            for index in range(HOLDING):
                api.add_pod(_pod(f"held{index}", index % CARDS))
            time.sleep(1.0)
            admitted = sum(not a.error for a in rig.kubelet.sync())
            timings: list[float] = []
            for round_ in range(rounds):
                names = [f"r{round_}-{i}" for i in range(PENDING)]
                for i, name in enumerate(names):
                    api.add_pod(_pod(name, (round_ + i) % CARDS))
                time.sleep(0.3)  # the agent's watch delivers them
                timings.extend(_allocate_one(rig, api, name) for name in names)
                for name in names:
                    api.delete_pod("default", name)
                rig.kubelet.sync()  # forgets the deleted pods and their devices
            time.sleep(1.0)  # the agent's last gas-node-cards writes and watch events
            served = _memory(pid)
        finally:
            rig.close()
            shutil.rmtree(logs, ignore_errors=True)
    timings.sort()
    figures = {
        "pods_on_node": HOLDING + PENDING,
        "allocations_served": admitted + len(timings),
        "samples": len(timings),
        "p50_ms": round(statistics.median(timings) * 1000, 2),
        "p99_ms": round(timings[int(len(timings) * 0.99) - 1] * 1000, 2),
        "max_ms": round(timings[-1] * 1000, 2),
        "start_rss_mib": start["rss"],
        "rss_mib": served["rss"],
        "rss_anon_mib": served["anon"],
        "rss_file_mib": served["file"],
        "peak_rss_mib": served["peak"],
        "threads": served["threads"],
    }
    return figures


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)))
