"""The request-overhead benchmark runs end to end at its smoke size and prints its tables
and figures. Only their shape is checked: figures depend on the machine."""

from __future__ import annotations

from pathlib import Path

from tests.support.benchrun import run_quick


def test_quick_overhead_run_prints_every_figure(tmp_path: Path) -> None:
    stdout, record = run_quick("benchmarks.overhead", tmp_path / "overhead.json")
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
        assert f"| {name} |" in stdout
    in_process = record["in_process_ms"]
    assert {"gas filter, 0 nodes, in process", "gas filter, 100 nodes, in process"} <= set(
        in_process
    )
    assert any(name.startswith("encode 500-node reply") for name in in_process)
    assert any(name.startswith("decode 500-node request") for name in in_process)
    assert all(value > 0 for value in in_process.values())
