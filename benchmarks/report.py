"""The benchmark figures as Markdown tables and JSON records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.apibind import ApiBindResult
from benchmarks.harness import Latencies
from benchmarks.scenario import QUEUE_SHAPES, ScenarioResult


def fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), "|" + "---:|" * len(header), *map(_row, rows)]


def _percentile_header(name: str) -> list[str]:
    return [f"{name} p50 ms", f"{name} p99 ms"]


def _percentile_cells(latencies: Latencies) -> list[str]:
    """The cells under `_percentile_header`, in its order."""
    return [fmt(latencies.p50_ms, 2), fmt(latencies.p99_ms, 2)]


def scenario_table(results: Sequence[ScenarioResult]) -> list[str]:
    header = [
        "nodes",
        "cards",
        "pods",
        "occupancy",
        *_percentile_header("filter"),
        "filter/s",
        "new-shape filter ms",
        *_percentile_header("bind"),
        *_percentile_header("lone bind"),
        "bind/s",
        "Nodes-mode filter p50 ms",
        "gas RSS MiB",
    ]
    rows = [
        [
            f"{r.nodes:,}",
            f"{r.cards:,}",
            f"{r.pods:,}",
            f"{r.occupancy:.0%}",
            *_percentile_cells(r.filter),
            fmt(r.filter.rps, 0),
            fmt(r.new_shape.p50_ms, 1),
            *_percentile_cells(r.bind),
            *_percentile_cells(r.bind_alone),
            fmt(r.bind_burst.rps, 0),
            fmt(r.nodes_mode.p50_ms, 1),
            fmt(r.rss_mib, 0),
        ]
        for r in results
    ]
    return _table(header, rows)


def workload_table(results: Sequence[ScenarioResult]) -> list[str]:
    many = f"{QUEUE_SHAPES}-shape"
    header = [
        "nodes",
        "occupancy",
        *_percentile_header("1-shape"),
        "1-shape CPU ms",
        *_percentile_header(f"{many}"),
        f"{many} CPU ms",
        *_percentile_header("interleaved filter"),
        *_percentile_header("interleaved bind"),
        "interleaved CPU ms/pair",
        "lone bind CPU ms",
    ]
    rows = [
        [
            f"{r.nodes:,}",
            f"{r.occupancy:.0%}",
            *_percentile_cells(r.one_shape.filter),
            fmt(r.one_shape.cpu.ms_per_request, 2),
            *_percentile_cells(r.many_shapes.filter),
            fmt(r.many_shapes.cpu.ms_per_request, 2),
            *_percentile_cells(r.interleaved.filter),
            *_percentile_cells(r.interleaved.bind),
            fmt(r.interleaved.cpu.ms_per_request, 2),
            fmt(r.bind_alone_cpu.ms_per_request, 2),
        ]
        for r in results
    ]
    return _table(header, rows)


def api_table(results: Sequence[ApiBindResult]) -> list[str]:
    header = [
        "nodes",
        "pods",
        "binds",
        *_percentile_header("interleaved filter"),
        *_percentile_header("interleaved bind"),
        *_percentile_header("bind"),
        *_percentile_header("cold bind"),
        "CPU ms/pair",
        "CPU ms/bind",
        "CPU ms/cold bind",
        "writes/bind",
        "Bindings/bind",
        "Events/bind",
        "patches/bind",
    ]
    rows = []
    for r in results:
        writes = r.bind_writes
        rows.append(
            [
                f"{r.nodes:,}",
                f"{r.pods:,}",
                f"{len(r.warm.bind.seconds):,}",
                *_percentile_cells(r.interleaved.filter),
                *_percentile_cells(r.interleaved.bind),
                *_percentile_cells(r.warm.bind),
                *_percentile_cells(r.cold.bind),
                fmt(r.interleaved.cpu.ms_per_request, 2),
                fmt(r.warm.cpu.ms_per_request, 2),
                fmt(r.cold.cpu.ms_per_request, 2),
                fmt(r.per_bind(writes.total), 2),
                fmt(r.per_bind(writes.bindings), 2),
                fmt(r.per_bind(writes.events), 2),
                fmt(r.per_bind(writes.patches), 2),
            ]
        )
    return _table(header, rows)


def scenario_json(r: ScenarioResult) -> dict[str, Any]:
    return {
        "nodes": r.nodes,
        "occupancy": r.occupancy,
        "pods": r.pods,
        "filter_p50_ms": r.filter.p50_ms,
        "filter_p99_ms": r.filter.p99_ms,
        "filter_rps": r.filter.rps,
        "new_shape_filter_p50_ms": r.new_shape.p50_ms,
        "bind_p50_ms": r.bind.p50_ms,
        "bind_p99_ms": r.bind.p99_ms,
        "lone_bind_p50_ms": r.bind_alone.p50_ms,
        "lone_bind_p99_ms": r.bind_alone.p99_ms,
        "lone_bind_cpu_ms": r.bind_alone_cpu.ms_per_request,
        "bind_rps": r.bind_burst.rps,
        "nodes_mode_p50_ms": r.nodes_mode.p50_ms,
        "one_shape_filter_p50_ms": r.one_shape.filter.p50_ms,
        "one_shape_filter_p99_ms": r.one_shape.filter.p99_ms,
        "one_shape_filter_cpu_ms": r.one_shape.cpu.ms_per_request,
        "many_shapes": QUEUE_SHAPES,
        "many_shape_filter_p50_ms": r.many_shapes.filter.p50_ms,
        "many_shape_filter_p99_ms": r.many_shapes.filter.p99_ms,
        "many_shape_filter_cpu_ms": r.many_shapes.cpu.ms_per_request,
        "interleaved_filter_p50_ms": r.interleaved.filter.p50_ms,
        "interleaved_filter_p99_ms": r.interleaved.filter.p99_ms,
        "interleaved_bind_p50_ms": r.interleaved.bind.p50_ms,
        "interleaved_bind_p99_ms": r.interleaved.bind.p99_ms,
        "interleaved_cpu_ms_per_pair": r.interleaved.cpu.ms_per_request,
        "rss_mib": r.rss_mib,
        "peak_rss_mib": r.peak_rss_mib,
    }


def api_json(r: ApiBindResult) -> dict[str, Any]:
    writes = r.bind_writes
    return {
        "nodes": r.nodes,
        "pods": r.pods,
        "binds": len(r.warm.bind.seconds),
        "cold_binds": len(r.cold.bind.seconds),
        "interleaved_filter_p50_ms": r.interleaved.filter.p50_ms,
        "interleaved_filter_p99_ms": r.interleaved.filter.p99_ms,
        "interleaved_bind_p50_ms": r.interleaved.bind.p50_ms,
        "interleaved_bind_p99_ms": r.interleaved.bind.p99_ms,
        "interleaved_cpu_ms_per_pair": r.interleaved.cpu.ms_per_request,
        "interleaved_writes": vars(r.interleaved_writes),
        "bind_p50_ms": r.warm.bind.p50_ms,
        "bind_p99_ms": r.warm.bind.p99_ms,
        "bind_cpu_ms": r.warm.cpu.ms_per_request,
        "cold_bind_p50_ms": r.cold.bind.p50_ms,
        "cold_bind_p99_ms": r.cold.bind.p99_ms,
        "cold_bind_cpu_ms": r.cold.cpu.ms_per_request,
        "writes_per_bind": r.per_bind(writes.total),
        "bindings_per_bind": r.per_bind(writes.bindings),
        "events_per_bind": r.per_bind(writes.events),
        "patches_per_bind": r.per_bind(writes.patches),
        "errors": r.errors,
        "ready_s": r.startup_seconds,
    }
