"""The GPU use reading's benchmark (`benchmarks.usage_scan`) runs at its smoke size and
prints its figures. Only their shape is checked: figures depend on the machine, and the
goal belongs to the benchmark."""

from __future__ import annotations

from pathlib import Path

from tests.support.benchrun import run_quick


def test_quick_run_prints_its_figures(tmp_path: Path) -> None:
    stdout, figures = run_quick("benchmarks.usage_scan", tmp_path / "usage.json")
    assert (figures["processes"], figures["fds_per_process"], figures["runs"]) == (200, 20, 3)
    # One process in ten holds the GPU (20 fds); half of those through a dup'd fd too (10),
    # and a worker forked from it holds both (20).
    assert figures["drm_fds"] == 50
    assert figures["containers_using_gpus"] > 0
    assert figures["cpu_p90_ms"] >= figures["cpu_median_ms"] > 0
    assert figures["links_only_cpu_median_ms"] > 0
    assert figures["agent_cpu_p90_ms"] >= figures["agent_cpu_median_ms"] > 0
    header, _, row, agents, goal = stdout.splitlines()
    assert header.startswith("| processes | fds each | DRM fds |")
    assert row.startswith("| 200 | 20 | 50 |")
    assert agents.startswith("the agents' reading (containers without a GPU left unread)")
    assert goal.startswith("goal: at most 100 ms of CPU")
