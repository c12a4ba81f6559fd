"""The end-to-end benchmark (real kube-apiserver, kube-scheduler and `gas serve`) runs at its
smoke size and reports what it measured. Figures depend on the machine: only their shape
and the cards are checked."""

from __future__ import annotations

import math
from pathlib import Path

from tests.support import realk8s
from tests.support.benchrun import run_quick


def test_quick_run_schedules_every_pod_alone_and_with_gas(
    tmp_path: Path, k8s: realk8s.Release
) -> None:
    profiles = tmp_path / "cpu"
    stdout, report = run_quick(
        "benchmarks.endtoend",
        tmp_path / "figures.json",
        "--kubernetes",
        k8s.version,
        "--cpu-profile",
        str(profiles),
    )
    assert report["kubernetes"] == k8s.version
    rounds = {r["mode"]: r for r in report["rounds"]}
    assert set(rounds) == {"alone", "noop", "gas"}, stdout
    for mode, result in rounds.items():
        # Quick size: 20 nodes at half their GPU memory hold 30 more pods with room to spare.
        assert result["bound"] == result["pods"] == 30, (mode, stdout)
        assert result["p99_s"] >= result["p50_s"] > 0
        assert result["pods_per_s"] > 0
    with_gas = rounds["gas"]
    # gas placed every pod on cards that hold it, and its worker's CPU was read by thread.
    assert with_gas["over_committed"] == 0, with_gas["over_commit"]
    assert with_gas["gas_cpu_ms"] and all(v >= 0 for v in with_gas["gas_cpu_ms"].values())
    # Registered as shipped: filter and bind for every pod, and no prioritize.
    assert with_gas["requests"].get("filter", 0) >= 30 and with_gas["requests"]["bind"] >= 30
    assert with_gas["requests"].get("prioritize", 0) == 0, with_gas["requests"]
    # The machine ran at least the scheduler and the API server.
    for result in rounds.values():
        assert result["machine_cpu_ms"] >= result["scheduler_cpu_ms"] + result["apiserver_cpu_ms"]
        assert 0 <= result["steal_ms"] <= result["machine_cpu_ms"]
    assert rounds["alone"]["gas_cpu_ms"] == {}
    # The no-op extender in gas's place: it filtered and bound every pod, its CPU read.
    noop = rounds["noop"]
    assert noop["requests"]["filter"] >= 30 and noop["requests"]["bind"] >= 30, noop
    assert noop["requests"]["bindErrors"] == 0
    assert set(noop["gas_cpu_ms"]) == {"noop"} and noop["gas_cpu_ms"]["noop"] > 0
    # The connections gas accepted during the burst, from its metrics: kube-scheduler's
    # HTTP/2 connection opened with the warm-up pod, so few or none.
    assert 0 <= with_gas["connections"] < with_gas["bound"]
    assert math.isnan(rounds["alone"]["connections"])
    # The gas round's CPU profile: its worker's threads by function, the verbs among them
    # (kube-scheduler's calls during the burst), the benchmark's scrapes after it not.
    (profile,) = profiles.glob("*-gas.txt")
    listing = profile.read_text()
    for function in ("Extender.filter", "Extender.bind", "KubeCluster._pod_event"):
        assert f"({function})" in listing, listing[:3000]
    assert "(Metrics.exposition)" not in listing
    assert "_MainThread" in profile.with_suffix(".threads.txt").read_text()
    assert profile.with_suffix(".pstat").stat().st_size > 0
    summary = report["summary"]
    assert summary["throughput_ratio"] > 0
    assert "| gas / alone, pods/s |" in stdout
    assert summary["gas_noop_ratio"] > 0 and summary["noop_pods_per_s"] > 0
    assert "| gas / no-op, pods/s (median of the rounds' pairs) |" in stdout
