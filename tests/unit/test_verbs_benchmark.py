"""The in-process replay of kube-scheduler's calls (`benchmarks.verbs`) sends what v1.28
sends and schedules its burst without over-committing a card. Its figures are not checked:
speed goals belong to the benchmarks."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from benchmarks.verbs import Scheduler, feasible_count, main, run
from gas.tools.audit import check_invariants


@pytest.mark.parametrize(
    ("nodes", "found"), [(50, 50), (100, 100), (1000, 420), (5000, 500), (100_000, 5000)]
)
def test_feasible_count_is_kube_schedulers(nodes: int, found: int) -> None:
    # numFeasibleNodesToFind: adaptive percentage 50 - nodes/125, at least 5%, at least
    # 100 nodes.
    assert feasible_count(nodes) == found


def test_windows_rotate_over_every_node_in_shuffled_blocks() -> None:
    names = [f"n{i}" for i in range(1000)]
    scheduler = Scheduler(lambda path, body: None, names, seed=1)
    first, second, third = scheduler.window(), scheduler.window(), scheduler.window()
    assert len(first) == len(set(first)) == 420
    assert not set(first) & set(second)
    # 1,260 names from 1,000: the third window wraps round to the first's start.
    assert set(first) | set(second) | set(third) == set(names)
    order = scheduler.order
    assert first != order[:420] and set(first) == set(order[:420])


def test_a_burst_is_scheduled_with_no_card_over_committed() -> None:
    scheduler, nodes, pods = run(120, 40, 0.5, seed=3)
    assert scheduler.bound == 40
    assert all(seconds > 0 for seconds in scheduler.cpu.values())
    burst = [p for p in pods if p["metadata"]["name"].startswith("verbs-")]
    assert len(burst) == 40 and all(p["spec"].get("nodeName") for p in burst)
    assert all(p["metadata"]["annotations"]["gas-container-cards"] for p in burst)
    assert check_invariants(nodes, pods, require_annotations=True) == []


def test_main_prints_each_verb_per_pod(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "60", "--pods", "10", "--runs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("60 nodes at 50%, 10 pods, filters naming 60 nodes, 0 ms before")
    assert [line.split(":")[0] for line in out[1:]] == ["run 1", "run 2", "median per pod"]
    for line in out[1:]:
        # As the shipped configurations register gas: no prioritize.
        assert all(f"{verb} " in line for verb in ("filter", "bind", "all"))
        assert "prioritize" not in line
    assert main(["--nodes", "60", "--pods", "10", "--runs", "1", "--prioritize"]) == 0
    for line in capsys.readouterr().out.splitlines()[1:]:
        assert all(f"{verb} " in line for verb in ("filter", "prioritize", "bind", "all"))


def test_prioritize_follows_a_filter_that_passed_two_or_more_nodes() -> None:
    # As kube-scheduler v1.28: scores are asked for only when there is a choice.
    calls: list[str] = []
    passing = iter([1, 0, 2])

    def post(path: str, body: bytes) -> tuple[int, list[Any], bytes]:
        calls.append(path.rsplit("/", 1)[-1])
        names = orjson.loads(body).get("NodeNames") or []
        if calls[-1] == "filter":
            return 200, [], orjson.dumps({"NodeNames": names[: next(passing)]})
        return 200, [], orjson.dumps({} if calls[-1] == "bind" else [])

    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}}
    scheduler = Scheduler(post, [f"n{i}" for i in range(10)], seed=1, prioritize=True)
    for _ in range(3):
        scheduler.schedule(pod)
    # Filters passing 1, 0 and then 2 nodes.
    assert calls == ["filter", "bind", "filter", "filter", "prioritize", "bind"]


def test_gap_waits_before_each_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    scheduler, _, _ = run(30, 5, 0.5, seed=1, gap=0.04)
    assert scheduler.bound == 5 and waits == [0.04] * 5
