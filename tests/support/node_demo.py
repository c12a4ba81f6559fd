"""`./scripts/run-node-demo.sh`: the whole system on one machine, against the test doubles.

An API-server double, two GPU nodes each with a fake sysfs/devfs, a kubelet double and a
real `gas node` process (which labels the node, publishes its GPU capacity and serves the
device plugin), the real `gas serve` over mutual TLS, and a kube-scheduler emulator that
places a few pods through it, saying for the one no card can hold why each node cannot. It
then prints, for every container, the cards gas chose and the devices the container
received, and `gas inspect`'s per-card table; it exits 1 when any container did not get
exactly the cards gas chose.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gas.core.model import ANNOTATION_CARDS, ANNOTATION_TILES, parse_cards, parse_tiles
from gas.node.allocation import affinity_mask, composite_hierarchy
from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard
from tests.support.gasproc import GasProcess, make_tls_files
from tests.support.kubelet import Admission, response_cards
from tests.support.nodeproc import NodeRig
from tests.support.objects import container, gpu_pod
from tests.support.scheduler import Outcome, SchedulerEmulator

GIB = 1 << 30
MEMORY = "gpu.intel.com/memory.max"
NODES = {
    "gpu-node-1": [FakeCard(0, lmem_per_tile=8 * GIB), FakeCard(1, lmem_per_tile=8 * GIB)],
    "gpu-node-2": [FakeCard(0, tiles=2, lmem_per_tile=4 * GIB)],
}


def demo_pods() -> list[dict[str, Any]]:
    return [
        # First, while gpu-node-1's total (two 8Gi cards: 16Gi) still covers it, so that
        # kube-scheduler's node totals let it through and gas's filter says why no card can.
        gpu_pod("too-big", container("model", i915="1", memory_max="12Gi")),
        gpu_pod("inference-a", container("model", i915="1", memory_max="5Gi")),
        gpu_pod("inference-b", container("model", i915="1", memory_max="5Gi")),
        gpu_pod(
            "pipeline",
            container("decode", i915="1", memory_max="2Gi"),
            container("sidecar"),
            container("encode", i915="1", memory_max="2Gi"),
        ),
        gpu_pod("tiled", container("solver", i915="1", tiles="2", memory_max="2Gi")),
    ]


def why_unschedulable(outcome: Outcome) -> list[str]:
    """For each node, why the pod did not go there: gas's filter's reason, or the one of
    kube-scheduler's own fit when it left the node out before asking gas."""
    reasons = {
        **{n: f"{r} (kube-scheduler: the node's total)" for n, r in outcome.unfit_nodes.items()},
        **{
            n: f"{r} (gas's filter: its cards are busy now)"
            for n, r in outcome.failed_nodes.items()
        },
        **{
            n: f"{r} (gas's filter: no card of the node could hold it, even idle)"
            for n, r in outcome.unresolvable_nodes.items()
        },
    }
    return [f"  {node}: {reasons[node]}" for node in sorted(reasons)]


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _received(admission: Admission, name: str) -> tuple[list[str], str | None]:
    cards: set[str] = set()
    mask = None
    for response in admission.responses.get(name, {}).values():
        cards.update(response_cards(response))
        mask = response.envs.get("ZE_AFFINITY_MASK", mask)
    return sorted(cards, key=lambda c: int(c[4:])), mask


def report(api: ApiServerDouble, rigs: list[NodeRig]) -> int:
    """Print each container's decision next to what it received; the count of mismatches."""
    wrong = 0
    print(f"{'POD/CONTAINER':<26}{'NODE':<12}{'GAS CHOSE':<14}{'RECEIVED':<14}{'TILE MASK':<10}OK")
    for rig in rigs:
        tiles_per_card = {f"card{c.number}": c.tiles for c in rig.cards}
        for admission in sorted(rig.kubelet.admissions.values(), key=lambda a: a.name):
            pod = api.get_pod(admission.namespace, admission.name)
            if pod is None:
                continue
            notes = pod["metadata"].get("annotations") or {}
            specs = pod["spec"]["containers"]
            chosen = parse_cards(notes.get(ANNOTATION_CARDS, ""), len(specs))
            tiles = parse_tiles(notes.get(ANNOTATION_TILES) or "|" * (len(specs) - 1), chosen)
            for index, spec in enumerate(specs):
                got, mask = _received(admission, spec["name"])
                env = {e["name"]: e["value"] for e in spec.get("env") or []}
                want_mask = affinity_mask(
                    tiles[index],
                    chosen[index],
                    {c: tiles_per_card[c] for c in chosen[index]},
                    composite_hierarchy(env),
                )
                ok = list(chosen[index]) == got and mask == want_mask and not admission.error
                wrong += not ok
                print(
                    f"{admission.name + '/' + spec['name']:<26}{rig.node:<12}"
                    f"{','.join(chosen[index]) or '-':<14}{','.join(got) or '-':<14}"
                    f"{mask or '-':<10}{'yes' if ok else 'NO ' + admission.error}"
                )
    return wrong


def run(keep: bool) -> int:
    work = Path(tempfile.mkdtemp(prefix="gas-node-demo-"))
    rigs: list[NodeRig] = []
    gas: GasProcess | None = None
    with ApiServerDouble() as api:
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        try:
            for name, cards in NODES.items():
                api.add_node({"metadata": {"name": name, "labels": {}}, "status": {}})
                rigs.append(NodeRig(api, kubeconfig, name, cards, work))
            for rig in rigs:
                rig.wait_registered()
            print(f"gas node is running on {', '.join(NODES)} (logs in {work})")
            (work / "tls").mkdir()
            tls = make_tls_files(work / "tls")
            gas = GasProcess(["--kubeConfig", kubeconfig], work / "gas-serve.log", tls)
            gas.wait_ready()
            _wait(
                lambda: all(MEMORY in _allocatable(api, n) for n in NODES),
                30,
                "the nodes' GPU capacity",
            )
            scheduler = SchedulerEmulator(
                api, gas.url, cert=(tls.client_cert, tls.client_key), verify=tls.ca
            )
            pods = demo_pods()
            for pod in pods:
                api.add_pod(pod)
            for pod in pods:
                outcome = scheduler.schedule("default", pod["metadata"]["name"]).result(30)
                where = outcome.node if outcome.bound else "unschedulable (waits)"
                print(f"scheduled {pod['metadata']['name']}: {where}")
                if not outcome.bound:
                    print("\n".join(why_unschedulable(outcome)))
            placed = {p["metadata"]["name"] for p in api.list_pods() if p["spec"].get("nodeName")}
            _wait(
                lambda: placed <= {a.name for r in rigs for a in r.kubelet.admissions.values()},
                30,
                "the kubelets to admit the pods",
            )
            print()
            wrong = report(api, rigs)
            print()
            subprocess.run(
                [sys.executable, "-m", "gas.cli", "inspect", "--kubeconfig", kubeconfig],
                check=False,
            )
            if keep:
                print(f"\nrunning; API server double at {api.url}; Ctrl-C to stop")
                while True:
                    time.sleep(3600)
            return 1 if wrong else 0
        except KeyboardInterrupt:
            return 0
        finally:
            if gas is not None:
                gas.stop()
            for rig in rigs:
                rig.close()


def _allocatable(api: ApiServerDouble, name: str) -> dict[str, Any]:
    node = api.get_node(name) or {}
    return dict((node.get("status") or {}).get("allocatable") or {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep running after the report")
    return run(parser.parse_args().keep)


if __name__ == "__main__":
    sys.exit(main())
