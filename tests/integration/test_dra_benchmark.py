"""The DRA benchmark (real kube-apiserver and kube-scheduler 1.37, `gas serve`, a real
`gas dra` under the DRA kubelet double) runs at its smoke size and reports what it
measured. Figures depend on the machine: only their shape and the cards are checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.dra import SETUPS
from tests.support import realk8s
from tests.support.benchrun import run_quick

pytestmark = pytest.mark.timeout(300)


def test_quick_run_of_every_setup_and_of_prepare(tmp_path: Path) -> None:
    stdout, report = run_quick("benchmarks.dra", tmp_path / "figures.json")
    prepare = report["prepare"]
    # 10 claims in one call and 10 calls at once, each repetition; none refused.
    assert prepare["claims"] == 10 and prepare["repeats"] == 5 and prepare["errors"] == 0
    for key in ("one_call_of_10", "ten_calls_at_once", "ten_calls_at_once_wall"):
        assert prepare[key]["p99_ms"] >= prepare[key]["p50_ms"] > 0, key
    assert "| one call of 10 claims |" in stdout
    assert report["load_before"] and report["load_after"]
    if realk8s.missing("1.37") is not None:
        assert report["skipped"] and report["rounds"] == []
        return
    rounds = {r["setup"]: r for r in report["rounds"]}
    assert list(rounds) == list(SETUPS), stdout
    for setup, result in rounds.items():
        # Quick size: 20 empty nodes hold 30 pods of any setup with room to spare.
        assert result["bound"] == result["pods"] == 30, (setup, stdout)
        assert result["p99_s"] >= result["p50_s"] > 0
        assert result["pods_per_s"] > 0 and result["scheduler_cpu_ms"] > 0
        # No card given beyond its capacity: gas's books in the extender round, the sum
        # of consumedCapacity per card in the DRA rounds.
        assert result["over_committed"] == 0, result["over_commit"]
    # gas took part in its round only.
    assert rounds["extender"]["gas_cpu_ms"] and not rounds["dra"]["gas_cpu_ms"]
    assert "| DRA, one slice per card |" in stdout
