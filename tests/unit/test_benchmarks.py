"""The benchmarks' own measuring parts, in-process: the pod shapes of the many-shape
workload, the count of API writes by kind, the CPU meter and the percentile.

The workloads themselves run end to end in tests/integration/test_benchmarks.py.
"""

from __future__ import annotations

import os
import time

from benchmarks.apibind import Writes
from benchmarks.harness import CpuMeter, CpuWindow, cpu_window, percentile
from benchmarks.workload import CARD_MEMORY_GI, CARD_MILLICORES, pod_object, queue_shapes
from gas.core.model import pod_request


def test_queue_shapes_are_distinct_requests_a_card_can_hold() -> None:
    shapes = queue_shapes(64)
    assert len(shapes) == 64
    requests = {repr(pod_request(pod_object("p", "u", shape))) for shape in shapes}
    assert len(requests) == 64  # gas sees 64 different requests, not 64 names
    assert {shape.cards for shape in shapes} == {1, 2, 3, 4}
    for shape in shapes:
        assert 1 <= shape.memory_gi <= CARD_MEMORY_GI
        assert 0 < shape.millicores <= CARD_MILLICORES


def test_writes_are_counted_by_what_they_wrote() -> None:
    writes = Writes()
    writes.add(
        [
            ("POST", "/api/v1/namespaces/a/pods/p/binding"),
            ("POST", "/api/v1/namespaces/a/events"),
            ("POST", "/apis/events.k8s.io/v1/namespaces/a/events"),
            ("PATCH", "/api/v1/namespaces/a/pods/p"),
            ("PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/gas"),
            ("GET", "/api/v1/namespaces/a/pods/p"),
            ("GET", "/api/v1/pods"),
        ]
    )
    assert (writes.bindings, writes.events, writes.patches, writes.other) == (1, 2, 1, 1)
    assert writes.total == 5
    assert (writes + writes).total == 10


def test_cpu_meter_sees_this_process_work() -> None:
    meter = CpuMeter(os.getpid())
    window = CpuWindow()
    with cpu_window(meter, window) as measured:
        deadline = time.process_time() + 0.1
        while time.process_time() < deadline:
            pass
        measured.requests = 4
    # Within a clock tick of the 100 ms spent.
    assert 0.08 <= window.seconds <= 0.5
    assert window.ms_per_request == window.seconds * 1000 / 4


def test_percentile_is_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]
    assert percentile(samples, 0.5) == 50
    assert percentile(samples, 0.99) == 99
    assert percentile(samples[:7], 0.99) == 7
    assert percentile([3.0], 0.99) == 3
    assert percentile(samples[:100], 0.07) == 7  # 0.07 * 100 is 7.000000000000001
