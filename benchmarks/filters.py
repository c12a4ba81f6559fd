"""Filter workloads that differ in how much of gas's kept answers they can use.

- one shape: every pod the same size and no binds, so every node's answer is kept from
  the pod before (the best case);
- many shapes: pods cycling through more sizes than gas keeps answers for, as a real
  queue does, so each filter fits every node afresh (the worst case for the filter);
- interleaved: one filter and then one bind at a time, the common sizes, so every bind
  changes a node and the next filter must fit that node again (production's case).

Each workload also reads gas's own CPU time over its window (`harness.CpuMeter`).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import (
    Client,
    CpuMeter,
    CpuWindow,
    Latencies,
    cpu_window,
    timed_bind,
    timed_filter,
)
from benchmarks.workload import Shape

PodFactory = Callable[[Shape | None], dict[str, Any]]
"""A new pending pod of the shape given, or of the common mix (`pick_shape`) for None."""


@dataclass
class FilterRun:
    filter: Latencies = field(default_factory=Latencies)
    cpu: CpuWindow = field(default_factory=CpuWindow)


@dataclass
class InterleavedRun:
    filter: Latencies = field(default_factory=Latencies)
    bind: Latencies = field(default_factory=Latencies)
    cpu: CpuWindow = field(default_factory=CpuWindow)
    """Requests: the filter+bind pairs (a filter whose pod fits nowhere counts alone)."""
    errors: list[str] = field(default_factory=list)


class FilterDriver:
    """Drives one gas over one kept-alive connection, every node a candidate."""

    def __init__(
        self,
        client: Client,
        names: Sequence[str],
        meter: CpuMeter | None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.names = list(names)
        self.names_json = json.dumps(self.names).encode()
        self.meter = meter
        # Called before a window closes: waits for the work gas does after answering.
        self.settle = settle or (lambda: None)

    def filter(self, pod: dict[str, Any]) -> tuple[float, list[str]]:
        return timed_filter(self.client, pod, self.names_json, len(self.names))

    def filters(self, pods: Sequence[dict[str, Any]]) -> FilterRun:
        """Filters only; the first is not measured (gas fits every node for it afresh)."""
        run = FilterRun()
        if not pods:
            return run
        self.filter(pods[0])
        with cpu_window(self.meter, run.cpu) as window:
            for pod in pods[1:]:
                seconds, _ = self.filter(pod)
                run.filter.add(seconds)
            self.settle()
            window.requests = len(pods) - 1
        return run

    def interleaved(self, pods: Sequence[dict[str, Any]], rng: random.Random) -> InterleavedRun:
        """Filter a pod, bind it to a node that passed, then the next pod."""
        run = InterleavedRun()
        with cpu_window(self.meter, run.cpu) as window:
            for pod in pods:
                seconds, passed = self.filter(pod)
                run.filter.add(seconds)
                if not passed:
                    continue
                seconds, error = timed_bind(self.client, pod, rng.choice(passed))
                run.bind.add(seconds)
                if error:
                    run.errors.append(error)
            self.settle()
            window.requests = len(pods)
        return run


def one_shape_pods(new_pod: PodFactory, shape: Shape, count: int) -> list[dict[str, Any]]:
    return [new_pod(shape) for _ in range(count + 1)]


def many_shape_pods(
    new_pod: PodFactory, shapes: Sequence[Shape], count: int
) -> list[dict[str, Any]]:
    cycle = itertools.cycle(shapes)
    return [new_pod(next(cycle)) for _ in range(count + 1)]
