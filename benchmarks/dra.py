"""The DRA way against the extender way: pods per second through the real kube-scheduler.

    .venv/bin/python -m benchmarks.dra                 # 1,000 nodes, 1,000 pods a round
    .venv/bin/python -m benchmarks.dra --quick         # a smoke size (seconds)
    .venv/bin/python -m benchmarks.dra --rounds 2 --json f.json
    .venv/bin/python -m benchmarks.dra --only plain,dra   # some setups only

One control plane of the real 1.37 binaries (`tests/support/realk8s.py`) holds N fake
nodes of 4 to 8 cards of 16 GiB (`benchmarks.workload`), empty. Each round starts a
kube-scheduler, binds a warm-up pod, creates a burst of P pending pods and notes when each
is bound (benchmarks.endtoend's `Bench`, whose clocks and CPU readings these rounds share).
The setups:

- `plain`: pods asking for CPU and memory only, no GPU: what kube-scheduler does alone;
- `extender`: GPU pods through `gas serve` as kube-scheduler's extender, as shipped
  (benchmarks.endtoend's `gas` round: the same mix of a quarter, half, whole card and two
  half cards);
- `dra` and its variants: the same mix as ResourceClaims on the nodes' ResourceSlices,
  placed by kube-scheduler alone. Each node's slice is gas's own
  (`gas.dra.slices.resource_slice` of the node's fake cards, as `gas dra` publishes it); a
  variant changes one of gas's choices: one slice per card instead of one per node
  (`dra-slice-per-card`), one attribute instead of eight (`dra-one-attribute`), a CEL
  selector in every request (`dra-cel`), memory's request policy as a list of valid values
  instead of a range with steps (`dra-valid-values`).

Each pod's claim is created before the round's clock starts (one ResourceClaim per pod,
named in the pod): the figure is kube-scheduler's, not kube-controller-manager's making
claims from templates. Between rounds kube-controller-manager (its resourceclaim
controller alone) frees the round's claims, and is stopped before the next burst. After
each DRA round every card's books are checked (`gas.tools.inspector.dra`: the sum of
`consumedCapacity` per card within its capacity).

Then `NodePrepareResources` latency: a real `gas dra` process on fake cards, against the
API-server double, driven over gRPC by the DRA kubelet double (`tests/support/draproc.py`):
10 claims in one call, and 10 calls of one claim at once, each time fresh claims
(unprepared after), repeated.

Prints Markdown tables; never fails on time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.endtoend import (
    CREATORS,
    NAMESPACE,
    Api,
    Bench,
    Round,
    burst_pods,
    create_all,
    fmt,
    node_for_api,
)
from benchmarks.harness import percentile
from benchmarks.workload import CARD_MEMORY_GI, SHAPES, Shape, make_cluster
from gas.dra.driver import DRIVER, MEMORY, STANDARD
from gas.dra.slices import PciFacts, plain, resource_slice, slice_name
from gas.host.cards import Card
from gas.tools.inspector.dra import dra_report, over_committed
from tests.support import realk8s
from tests.support.objects import intel_cards

VERSION = "1.37"
RESOURCE = "/apis/resource.k8s.io/v1"
CLASS = DRIVER
GI = 2**30
FLEX = PciFacts(device_id="0x56c0", pcie_root="pci0000:00")
SELECTOR = f'device.attributes["{DRIVER}"].model == "Data Center GPU Flex 170"'
VALID_MEMORY = ("1Gi", "2Gi", "4Gi", "8Gi", "16Gi")
"""The valid values of the `dra-valid-values` variant: every size the mix asks for."""


@dataclass(frozen=True)
class Variant:
    description: str
    slice_per_card: bool = False
    one_attribute: bool = False
    selector: bool = False
    valid_values: bool = False


VARIANTS = {
    "dra": Variant("DRA, gas's slices as published"),
    "dra-cel": Variant("DRA, a CEL selector in each request", selector=True),
    "dra-one-attribute": Variant("DRA, one attribute per card", one_attribute=True),
    "dra-slice-per-card": Variant("DRA, one slice per card", slice_per_card=True),
    "dra-valid-values": Variant("DRA, memory policy of valid values", valid_values=True),
}
SETUPS = {
    "plain": "plain pods, no GPU",
    "extender": "GPU pods, kube-scheduler + gas serve",
    **{name: v.description for name, v in VARIANTS.items()},
}


# ---------------------------------------------------------------- objects (pure)


def node_cards(node: dict[str, Any]) -> list[Card]:
    """The fake cards of a benchmark node: Flex 170s of 16 GiB, one tile each."""
    count = len(node["metadata"]["labels"]["gpu.intel.com/gpu-numbers"].split("."))
    return intel_cards(count, CARD_MEMORY_GI * GI)


def variant_slices(
    name: str, uid: str, cards: list[Card], variant: Variant
) -> list[dict[str, Any]]:
    """The node's slices: gas's own, changed as `variant` says."""
    whole = resource_slice(name, uid, plain(cards, {c.name: FLEX for c in cards}), 1)
    for device in whole["spec"]["devices"]:
        if variant.one_attribute:
            # The one a two-card request's constraint needs.
            device["attributes"] = {
                k: v for k, v in device["attributes"].items() if k == f"{STANDARD}/pciBusID"
            }
        if variant.valid_values:
            device["capacity"][MEMORY]["requestPolicy"] = {
                "default": "2Gi",
                "validValues": list(VALID_MEMORY),
            }
    if not variant.slice_per_card:
        return [whole]
    devices = whole["spec"]["devices"]
    slices = []
    for device in devices:
        one = json.loads(json.dumps(whole))
        one["metadata"]["name"] = f"{slice_name(name)}-{device['name']}"
        one["spec"]["pool"]["resourceSliceCount"] = len(devices)
        one["spec"]["devices"] = [device]
        slices.append(one)
    return slices


def device_class() -> dict[str, Any]:
    """gas's DeviceClass without `extendedResourceName`: the extender rounds' pods ask for
    `gpu.intel.com/i915`, which must stay the nodes' own resource."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_object(name: str, round_name: str, shape: Shape, variant: Variant) -> dict[str, Any]:
    """A claim of `shape`: one request per card, each of its memory and millicores; two
    cards are kept apart by their PCI addresses, as docs/dra.md tells users to."""
    exactly: dict[str, Any] = {
        "deviceClassName": CLASS,
        "capacity": {
            "requests": {"memory": f"{shape.memory_gi}Gi", "millicores": str(shape.millicores)}
        },
    }
    if variant.selector:
        exactly["selectors"] = [{"cel": {"expression": SELECTOR}}]
    requests = [{"name": f"gpu{i}", "exactly": exactly} for i in range(shape.cards)]
    devices: dict[str, Any] = {"requests": requests}
    if shape.cards > 1:
        devices["constraints"] = [
            {
                "requests": [r["name"] for r in requests],
                "distinctAttribute": f"{STANDARD}/pciBusID",
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"round": round_name}},
        "spec": {"devices": devices},
    }


def _pod(name: str, round_name: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"round": round_name}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": "app", "image": "registry.example/app:1", "resources": resources}
            ],
        },
    }


def plain_pod(name: str, round_name: str) -> dict[str, Any]:
    return _pod(name, round_name, {"requests": {"cpu": "100m", "memory": "64Mi"}})


def claim_pod(name: str, round_name: str) -> dict[str, Any]:
    """A pod using the claim of its own name."""
    pod = _pod(name, round_name, {"claims": [{"name": "gpu"}]})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    return pod


def burst_shapes(count: int, round_name: str, seed: int) -> list[Shape]:
    """The extender rounds' mix, drawn as they draw it."""
    return [shape for _, shape in burst_pods(count, round_name, seed)]


# ---------------------------------------------------------------- the rounds


class DraBench(Bench):
    """benchmarks.endtoend's rounds, with plain and DRA pods besides gas's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mode = ""
        self.published: Variant | None = None
        self.uids: dict[str, str] = {}
        self.claim_problems: dict[str, list[str]] = {}

    def run(self, mode: str) -> Round:
        self.mode = mode
        if mode in VARIANTS:
            self._publish(VARIANTS[mode])
        return super().run("gas" if mode == "extender" else mode)

    def burst(self, name: str) -> list[tuple[dict[str, Any], Shape]]:
        if self.mode == "extender":
            return super().burst(name)
        shapes = burst_shapes(self.pods, name, self.rounds)
        if self.mode == "plain":
            return [(plain_pod(f"{name}-{i:05d}", name), s) for i, s in enumerate(shapes)]
        variant = VARIANTS[self.mode]
        claims = [claim_object(f"{name}-{i:05d}", name, s, variant) for i, s in enumerate(shapes)]
        create_all(self.api, f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", claims, CREATORS)
        return [(claim_pod(f"{name}-{i:05d}", name), s) for i, s in enumerate(shapes)]

    def _warm_up(self, name: str) -> None:
        if self.mode not in VARIANTS:
            super()._warm_up(name)
            return
        warm = f"{name}-warm"
        claim = claim_object(warm, name, SHAPES[0], VARIANTS[self.mode])
        self.api.create(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", claim)
        pod = claim_pod(warm, name)
        pod["metadata"]["labels"]["warm"] = "1"
        self.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, answer = self.api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{warm}")
            if status == 200 and answer["spec"].get("nodeName"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"round {name}: the warm-up pod was never bound")

    def _check(self, result: Round, name: str) -> None:
        if self.mode == "extender":
            super()._check(result, name)
        elif self.mode in VARIANTS:
            slices = self.api.get(f"{RESOURCE}/resourceslices")["items"]
            claims = self.api.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims")["items"]
            result.over_commit = list(over_committed(dra_report(slices, claims)))

    def _clean(self, name: str) -> None:
        super()._clean(name)
        if self.mode not in VARIANTS:
            return
        # The claims of deleted pods stay allocated (and undeletable) until the claim
        # controller frees them; it runs only now, so it takes no CPU from a burst.
        manager = self.plane.start_controller_manager(
            "resourceclaim-controller", ["--kube-api-qps=2000", "--kube-api-burst=2000"]
        )
        try:
            path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
            status, answer = self.api.call("DELETE", f"{path}?labelSelector=round%3D{name}")
            if status != 200:
                raise RuntimeError(f"deleting round {name}'s claims: {status} {answer}")
            deadline = time.monotonic() + 600
            while self.api.get(f"{path}?labelSelector=round%3D{name}&limit=1")["items"]:
                manager.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"round {name}'s claims were never freed")
                time.sleep(0.5)
        finally:
            manager.stop()
            self.plane.processes.remove(manager)

    def _publish(self, variant: Variant) -> None:
        """Every node's slices as `variant` has them (unchanged if they already are)."""
        shape = (variant.slice_per_card, variant.one_attribute, variant.valid_values)
        if self.published is not None and shape == (
            self.published.slice_per_card,
            self.published.one_attribute,
            self.published.valid_values,
        ):
            return
        if not self.uids:
            listed = self.api.get("/api/v1/nodes")["items"]
            self.uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in listed}
        status, answer = self.api.call("DELETE", f"{RESOURCE}/resourceslices")
        if status != 200:
            raise RuntimeError(f"deleting the slices: {status} {str(answer)[:300]}")
        slices = [
            s
            for node in self.nodes
            for s in variant_slices(
                node["metadata"]["name"],
                self.uids[node["metadata"]["name"]],
                node_cards(node),
                variant,
            )
        ]
        create_all(self.api, f"{RESOURCE}/resourceslices", slices, CREATORS)
        self.published = variant


# ---------------------------------------------------------------- NodePrepareResources


@dataclass
class PrepareFigures:
    repeats: int
    batch_s: list[float]
    """One NodePrepareResources call carrying 10 claims, per repetition."""
    concurrent_s: list[float]
    """Each of 10 calls of one claim made at once."""
    concurrent_wall_s: list[float]
    """From the first of the 10 calls to the last answer."""
    errors: int

    def record(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float]:
            if not values:
                return {"p50_ms": float("nan"), "p99_ms": float("nan")}
            return {
                "p50_ms": statistics.median(values) * 1000,
                "p99_ms": percentile(values, 0.99) * 1000,
            }

        return {
            "repeats": self.repeats,
            "claims": 10,
            "one_call_of_10": stats(self.batch_s),
            "ten_calls_at_once": stats(self.concurrent_s),
            "ten_calls_at_once_wall": stats(self.concurrent_wall_s),
            "errors": self.errors,
        }


_ANSWERS = threading.Lock()


def _timed_prepare(rig: Any, ref: Any, figures: PrepareFigures, answers: list[Any]) -> None:
    began = time.perf_counter()
    answer = rig.kubelet.prepare([ref])
    with _ANSWERS:
        figures.concurrent_s.append(time.perf_counter() - began)
        answers.append(answer)


def measure_prepare(workdir: Path, repeats: int) -> PrepareFigures:
    from tests.support.apiserver import ApiServerDouble
    from tests.support.draproc import DraRig, share
    from tests.support.fakesysfs import FakeCard

    figures = PrepareFigures(repeats, [], [], [], 0)
    with ApiServerDouble() as api:
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        rig = DraRig(api, kubeconfig, "prep-node", [FakeCard(0), FakeCard(1)], workdir)
        try:
            rig.start_registered()
            serial = 0

            def claims() -> list[Any]:
                nonlocal serial
                made = []
                for _ in range(10):
                    serial += 1
                    card = f"card{serial % 2}"
                    made.append(rig.add_claim(f"c{serial}", [share("gpu", card)]))
                return made

            def count_errors(answer: Any) -> None:
                figures.errors += sum(1 for c in answer.claims.values() if c.error)

            # One round not counted: the process's first calls import and connect.
            warm = claims()
            rig.kubelet.prepare(warm)
            rig.kubelet.unprepare(warm)
            for _ in range(repeats):
                batch = claims()
                began = time.perf_counter()
                answer = rig.kubelet.prepare(batch)
                figures.batch_s.append(time.perf_counter() - began)
                count_errors(answer)
                rig.kubelet.unprepare(batch)

                several = claims()
                answers: list[Any] = []
                threads = [
                    threading.Thread(target=_timed_prepare, args=(rig, ref, figures, answers))
                    for ref in several
                ]
                began = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                figures.concurrent_wall_s.append(time.perf_counter() - began)
                for answer in answers:
                    count_errors(answer)
                rig.kubelet.unprepare(several)
        finally:
            rig.close()
    return figures


# ---------------------------------------------------------------- report


def rounds_table(rounds: Sequence[Round], setups: Sequence[str]) -> list[str]:
    header = [
        "round",
        "setup",
        "bound",
        "pods/s",
        "p50 s",
        "p99 s",
        "scheduler CPU ms/pod",
        "apiserver CPU ms/pod",
        "gas CPU ms/pod",
        "machine CPU ms/pod",
        "of it stolen ms/pod",
        "over-committed",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for r, setup in zip(rounds, setups, strict=True):
        per_pod = r.bound or 1
        gpu = setup != "plain"
        cells = [
            r.name,
            SETUPS[setup],
            f"{r.bound:,}/{r.pods:,}",
            fmt(r.pods_per_s, 0),
            fmt(r.p50_s, 2),
            fmt(r.p99_s, 2),
            fmt(r.scheduler_cpu_ms / per_pod, 2),
            fmt(r.apiserver_cpu_ms / per_pod, 2),
            fmt(r.gas_ms_per_pod(), 2) if setup == "extender" else "n/a",
            fmt(r.machine_cpu_ms / per_pod, 2),
            fmt(r.steal_ms / per_pod, 2),
            str(len(r.over_commit)) if gpu else "n/a",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def prepare_table(figures: PrepareFigures) -> list[str]:
    record = figures.record()
    lines = [
        f"NodePrepareResources against a real gas dra, {figures.repeats} repetitions, "
        f"{figures.errors} claim errors:",
        "",
        "| call | p50 ms | p99 ms |",
        "|---|---:|---:|",
    ]
    for key, label in (
        ("one_call_of_10", "one call of 10 claims"),
        ("ten_calls_at_once", "each of 10 calls of one claim, at once"),
        ("ten_calls_at_once_wall", "the 10 calls at once, first to last"),
    ):
        lines.append(
            f"| {label} | {fmt(record[key]['p50_ms'], 1)} | {fmt(record[key]['p99_ms'], 1)} |"
        )
    return lines


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.dra", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000, help="pods in each round's burst")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each setup")
    parser.add_argument(
        "--only", help=f"comma-separated setups to run (of {', '.join(SETUPS)}; default all)"
    )
    parser.add_argument("--repeats", type=int, default=50, help="NodePrepareResources repetitions")
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds without a bind that end a round"
    )
    parser.add_argument("--keep", help="working directory to keep (logs), else a temporary one")
    parser.add_argument("--quick", action="store_true", help="smoke size: 20 nodes, 30 pods")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.quick:
        # The settle as benchmarks.endtoend's quick run has it (and why).
        args.nodes, args.pods, args.rounds, args.settle, args.repeats = 20, 30, 1, 15.0, 5
    setups = args.only.split(",") if args.only else list(SETUPS)
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        parser.error(f"unknown setups: {', '.join(unknown)}")

    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gas-dra-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"kubernetes": VERSION, "nodes": args.nodes, "pods": args.pods}
    record["load_before"] = load()
    print(f"load average before: {record['load_before']}", flush=True)
    reason = realk8s.missing(VERSION)
    rounds: list[Round] = []
    names: list[str] = []
    if reason is not None:
        print(f"scheduling rounds skipped: {reason}")
        record["skipped"] = reason
    else:
        cluster = make_cluster(args.nodes, 0.0)
        record["cards"] = cluster.cards
        plane = realk8s.ControlPlane(
            workdir,
            version=VERSION,
            apiserver_args=[
                # No kubelet lifts the not-ready taint this admission puts on a new node.
                "--disable-admission-plugins=TaintNodesByCondition",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
            ],
        )
        try:
            with plane:
                plane.prepare_namespace(NAMESPACE)
                api = Api(plane)
                began = time.monotonic()
                create_all(api, "/api/v1/nodes", [node_for_api(n) for n in cluster.nodes], CREATORS)
                api.create(f"{RESOURCE}/deviceclasses", device_class())
                print(
                    f"{args.nodes:,} nodes ({cluster.cards:,} cards, empty) created in "
                    f"{time.monotonic() - began:.1f} s; bursts of {args.pods:,} pods "
                    f"({', '.join(s.name for s in SHAPES)}), {args.rounds} round(s) per setup\n",
                    flush=True,
                )
                bench = DraBench(plane, workdir, cluster.nodes, [], args.pods, args.settle, [])
                for _ in range(args.rounds):
                    for setup in setups:
                        result = bench.run(setup)
                        result.mode = setup
                        rounds.append(result)
                        names.append(setup)
                        print(
                            f"{result.name} ({setup}): {result.bound}/{result.pods} bound, "
                            f"{fmt(result.pods_per_s, 0)} pods/s, p50 {fmt(result.p50_s, 2)} s, "
                            f"p99 {fmt(result.p99_s, 2)} s, scheduler "
                            f"{fmt(result.scheduler_cpu_ms / max(1, result.bound), 2)} ms/pod, "
                            f"load {load()}",
                            flush=True,
                        )
        except BaseException:
            shutil.rmtree(workdir / "etcd", ignore_errors=True)
            print(f"failed; the processes' logs are in {workdir}", file=sys.stderr)
            raise
    prepare = measure_prepare(workdir, args.repeats)
    record["load_after"] = load()
    print()
    if rounds:
        print("\n".join(rounds_table(rounds, names)))
        for r in rounds:
            for problem in r.over_commit[:10]:
                print(f"{r.name}: {problem}")
        print()
    print("\n".join(prepare_table(prepare)))
    print(f"\nload average after: {record['load_after']}")
    record["rounds"] = [
        dict(r.record(), setup=setup, description=SETUPS[setup])
        for r, setup in zip(rounds, names, strict=True)
    ]
    record["prepare"] = prepare.record()
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    if args.keep:
        print(f"\nlogs: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
