"""The request-overhead benchmark runs end to end at its smoke size and prints its tables
and figures. Only their shape is checked: figures depend on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_overhead_run_prints_every_figure(tmp_path: Path) -> None:
    figures = tmp_path / "overhead.json"
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.overhead", "--quick", "--json", str(figures)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(figures.read_text())
    rows = {row["name"]: row for row in record["http"]}
    for name in (
        "bare WSGI",
        "one-line Flask route",
        "bare WSGI, stock gthread worker",
        "gas /healthz",
        "filter 0 nodes, 1 shape",
        "filter 100 nodes, 1 shape",
        "filter 100 nodes, 1 shape (head, body: 2 writes)",
        "filter 100 nodes, 64 shapes",
    ):
        row = rows[name]
        assert 0 < row["p50_ms"] <= row["p99_ms"], name
        assert row["cpu_ms"] >= 0, name
        assert f"| {name} |" in done.stdout
    in_process = record["in_process_ms"]
    assert {"gas filter, 0 nodes, in process", "gas filter, 100 nodes, in process"} <= set(
        in_process
    )
    assert any(name.startswith("encode 500-node reply") for name in in_process)
    assert any(name.startswith("decode 500-node request") for name in in_process)
    assert all(value > 0 for value in in_process.values())
