"""The benchmark runner: gas measured through real HTTPS and gunicorn, and its core alone.

    .venv/bin/python -m benchmarks.run            # the full set (several minutes)
    .venv/bin/python -m benchmarks.run --quick    # a small smoke size (seconds)
    .venv/bin/python -m benchmarks.run --sizes 1000 --occupancy 0.9 --rounds 500

For each cluster size and occupancy it writes a demo-cluster file (nodes of 4 to 8 cards,
running pods carrying `gas-container-cards`), starts `gas serve --demo --demoFile` with a
throwaway CA and mutual TLS, and drives it as kube-scheduler does: one filter at a time
(`NodeNames` mode, every node a candidate), each followed by an asynchronous bind to a node
that passed, several binds in flight at once. The demo cluster's bind writes in memory, so
bind latency is gas's own work without the API write. Latencies are measured at the client,
from sending the request to having read the whole reply.

Then, on the same gas: filters of one pod shape, filters cycling through 64 shapes, and
filters interleaved with binds one at a time (`benchmarks.filters`), each with gas's own
CPU time per request read in its worker; a burst of concurrent binds (bind throughput), a
few filters with whole Node objects (`Nodes` mode) and the worker's resident memory.

Then, per cluster size, gas list+watching the test suite's API-server double: bind latency
with the API write, gas's CPU per bind and the API writes per bind (`benchmarks.apibind`);
gas's memory once synced with 50,000 pods; the ledger rebuilt from 50,000 pods in a fresh
process (time and peak memory); allocator calls per second; and `Ledger.judge_names` (a
filter of one pod shape) in-process.
Prints figures as Markdown tables; never fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.apibind import ApiBindResult, run_api_binds
from benchmarks.harness import BIND_CONCURRENCY, gas_server
from benchmarks.scenario import QUEUE_SHAPES, ScenarioResult, run_scenario
from benchmarks.workload import make_cluster
from tests.support.gasproc import TLSFiles, make_tls_files

API_OCCUPANCY = 0.5
"""Occupancy of the clusters binds are measured on against the API-server double."""


# ---------------------------------------------------------------- memory against an API server


def production_memory(
    nodes: int, pods: int, directory: Path, tls: TLSFiles, seed: int = 1
) -> dict[str, float]:
    """gas as deployed: list+watch from an API server (the test suite's double, in this
    process), so the worker holds only what gas itself keeps of the pods. Its resident
    memory once synced, and the time from start to ready (list, rebuild, serve)."""
    from tests.support.apiserver import ApiServerDouble

    cluster = make_cluster(nodes, 0.9, seed, max_pods=pods)
    with ApiServerDouble() as api:
        for node in cluster.nodes:
            api.add_node(node)
        for pod in cluster.pods:
            api.add_pod(pod)
        count = len(cluster.pods)
        del cluster
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        with gas_server(None, directory, tls, kubeconfig=kubeconfig) as server:
            rss, peak = server.worker_memory_mib()
            startup = server.startup_seconds
    return {"nodes": nodes, "pods": count, "rss_mib": rss, "peak_mib": peak, "ready_s": startup}


# ---------------------------------------------------------------- rebuild, in a fresh process


def rebuild_figures(nodes: int, pods: int, seed: int = 1) -> dict[str, float]:
    """Run `benchmarks.rebuild` in a fresh interpreter so its peak memory is its own."""
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.rebuild", str(nodes), str(pods), str(seed)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke size, in seconds")
    parser.add_argument("--sizes", help="node counts, comma-separated (100,1000,5000)")
    parser.add_argument("--occupancy", help="occupancies, comma-separated (0.5,0.9)")
    parser.add_argument("--rounds", type=int, help="measured filters per workload (300)")
    parser.add_argument("--burst", type=int, help="binds in the throughput burst (300)")
    parser.add_argument(
        "--api-binds", type=int, help="binds per window against the API-server double (200)"
    )
    parser.add_argument(
        "--nodes-mode-rounds", type=int, help="filters with whole Node objects (10)"
    )
    parser.add_argument("--rebuild-nodes", type=int, help="nodes for the rebuild (5000)")
    parser.add_argument("--rebuild-pods", type=int, help="pods for the rebuild (50000)")
    parser.add_argument("--allocator-calls", type=int, help="allocator calls timed (50000)")
    parser.add_argument("--skip-http", action="store_true", help="in-process figures only")
    parser.add_argument(
        "--core",
        action="store_true",
        help="also time Ledger.judge_names in-process (64 shapes, churn)",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    quick = args.quick
    args.sizes = _ints(args.sizes) or ([50] if quick else [100, 1000, 5000])
    args.occupancy = _floats(args.occupancy) or ([0.5] if quick else [0.5, 0.9])
    args.rounds = args.rounds or (20 if quick else 300)
    args.burst = args.burst if args.burst is not None else (20 if quick else 300)
    args.api_binds = args.api_binds or (20 if quick else 200)
    if args.nodes_mode_rounds is None:
        args.nodes_mode_rounds = 3 if quick else 10
    args.rebuild_nodes = args.rebuild_nodes or (200 if quick else 5000)
    args.rebuild_pods = args.rebuild_pods or (2000 if quick else 50_000)
    args.allocator_calls = args.allocator_calls or (2000 if quick else 50_000)

    print(
        f"gas benchmarks: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.machine()}",
        flush=True,
    )
    figures: dict[str, Any] = {}
    if not args.skip_http:
        _http_figures(args, figures)
    _core_figures(args, figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def _http_figures(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    results: list[ScenarioResult] = []
    api_results: list[ApiBindResult] = []
    with tempfile.TemporaryDirectory(prefix="gas-bench-") as tmp:
        tls = make_tls_files(Path(tmp))
        for nodes in args.sizes:
            for occupancy in args.occupancy:
                directory = Path(tmp) / f"{nodes}-{occupancy}"
                directory.mkdir()
                result = run_scenario(
                    nodes,
                    occupancy,
                    args.rounds,
                    directory,
                    tls,
                    seed=args.seed,
                    burst=args.burst,
                    nodes_mode_rounds=args.nodes_mode_rounds,
                )
                results.append(result)
                print(
                    f"  {nodes} nodes at {occupancy:.0%}: gas ready in "
                    f"{result.startup_seconds:.1f} s, {result.passed_share:.0%} of nodes "
                    f"passed, {result.bind_errors} bind errors, peak RSS "
                    f"{report.fmt(result.peak_rss_mib, 0)} MiB",
                    flush=True,
                )
            api_results.append(_api_binds(nodes, args, Path(tmp), tls))
    rounds, burst = args.rounds, args.burst
    print()
    print(
        f"Filter (NodeNames mode, every node a candidate) and bind over HTTPS with mutual "
        f"TLS, one gunicorn worker, demo cluster; {rounds} filters, each followed by an "
        f"asynchronous bind ({BIND_CONCURRENCY} in flight at most). New-shape filter: a "
        f"pod shape gas has not seen. Lone bind: {burst} binds one at a time; bind/s: "
        f"{burst} binds at once. gas RSS includes the demo cluster's own pod store."
    )
    print()
    print("\n".join(report.scenario_table(results)))
    print()
    print(
        f"Filter workloads on the same gas, {rounds} requests each, one at a time: one pod "
        f"shape and no binds (every answer kept); {QUEUE_SHAPES} shapes in turn and no "
        f"binds (more than gas keeps answers for); interleaved: a filter of the common "
        f"shapes, then a bind of its pod, then the next (every bind changes a node). CPU: "
        f"gas worker's CPU time per request over the window (per filter+bind pair when "
        f"interleaved; lone bind: the {burst} binds one at a time)."
    )
    print()
    print("\n".join(report.workload_table(results)))
    figures["scenarios"] = [report.scenario_json(r) for r in results]

    print()
    print(
        f"Binds against an API server (gas list+watching the test suite's API-server "
        f"double at {API_OCCUPANCY:.0%} occupancy), one request at a time: {args.api_binds} "
        f"filter+bind pairs interleaved; {args.api_binds} binds of pods gas filtered "
        f"before; {args.api_binds} cold binds of pods gas never saw (it reads them from "
        f"the API). CPU: gas worker's CPU time per request, including the watch events and "
        f"Events each bind causes. Writes: POST/PUT/PATCH/DELETE requests the API server "
        f"received per bind (binds alone)."
    )
    print()
    print("\n".join(report.api_table(api_results)))
    figures["api_binds"] = [report.api_json(r) for r in api_results]
    for r in api_results:
        if r.errors:
            print(f"  {r.nodes} nodes: {r.errors} bind errors against the API server")

    print()
    with tempfile.TemporaryDirectory(prefix="gas-bench-") as tmp:
        memory = production_memory(
            args.rebuild_nodes, args.rebuild_pods, Path(tmp), make_tls_files(Path(tmp)), args.seed
        )
    figures["production_memory"] = memory
    print(
        "gas against an API server (list+watch of the test suite's API-server double), "
        "synced and idle:"
    )
    print()
    print("| nodes | pods | ready s | gas RSS MiB | gas peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {int(memory['nodes']):,} | {int(memory['pods']):,} | {memory['ready_s']:.1f} "
        f"| {memory['rss_mib']:.0f} | {memory['peak_mib']:.0f} |"
    )


def _api_binds(nodes: int, args: argparse.Namespace, tmp: Path, tls: TLSFiles) -> ApiBindResult:
    directory = tmp / f"{nodes}-api"
    directory.mkdir()
    result = run_api_binds(nodes, API_OCCUPANCY, args.api_binds, directory, tls, seed=args.seed)
    print(
        f"  {nodes} nodes against the API-server double: gas ready in "
        f"{result.startup_seconds:.1f} s, {result.errors} bind errors",
        flush=True,
    )
    return result


def _core_figures(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    print()
    rebuild = rebuild_figures(args.rebuild_nodes, args.rebuild_pods, args.seed)
    figures["rebuild"] = rebuild
    print(
        f"Ledger rebuild from {int(rebuild['pods']):,} running pods on "
        f"{int(rebuild['nodes']):,} nodes (fresh process):"
    )
    print()
    print("| observe_pod s | replace_pods s | total s | ledger MiB | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {rebuild['observe_s']:.2f} | {rebuild['replace_s']:.2f} "
        f"| {rebuild['observe_s'] + rebuild['replace_s']:.2f} "
        f"| {rebuild['ledger_mib']:.0f} | {rebuild['peak_rss_mib']:.0f} |"
    )

    from benchmarks import bench_core

    print()
    allocator = bench_core.bench_allocator(args.allocator_calls)
    figures["allocator_calls_per_s"] = allocator
    print(f"Allocator alone: {allocator:,.0f} calls/s (8-card node, 2-GPU container)")
    if args.core:
        # The filters users send: pod shapes in turn, and nodes changing between filters
        # (one shape asked again would time the kept answer).
        print()
        print("Ledger.judge_names in process, 64 pod shapes in turn; churn: a bind between")
        print("filters.")
        print()
        print("| nodes | occupancy | workload | p50 ms | p99 ms |")
        print("|---:|---:|---|---:|---:|")
        figures["core"] = []
        workloads = (("64 shapes", bench_core.bench_shapes), ("churn", bench_core.bench_churn))
        rounds = 20 if args.quick else 200
        for nodes in args.sizes:
            for occupancy in args.occupancy:
                for name, bench in workloads:
                    p50, p99 = bench(nodes, occupancy, rounds)
                    figures["core"].append(
                        {"nodes": nodes, "occupancy": occupancy, "workload": name, "p50": p50}
                    )
                    print(f"| {nodes:,} | {occupancy:.0%} | {name} | {p50:.2f} | {p99:.2f} |")


def _ints(text: str | None) -> list[int]:
    return [int(part) for part in text.split(",")] if text else []


def _floats(text: str | None) -> list[float]:
    return [float(part) for part in text.split(",")] if text else []


if __name__ == "__main__":
    sys.exit(main())
