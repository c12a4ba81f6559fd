"""The benchmark figures as Markdown tables and JSON records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.apibind import ApiBindResult
from benchmarks.scenario import QUEUE_SHAPES, ScenarioResult


def fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), "|" + "---:|" * len(header), *map(_row, rows)]


def scenario_table(results: Sequence[ScenarioResult]) -> list[str]:
    header = [
        "nodes",
        "cards",
        "pods",
        "occupancy",
        "filter p50 ms",
        "filter p99 ms",
        "filter/s",
        "new-shape filter ms",
        "bind p50 ms",
        "bind p99 ms",
        "lone bind p50 ms",
        "lone bind p99 ms",
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
            fmt(r.filter.p50_ms, 2),
            fmt(r.filter.p99_ms, 2),
            fmt(r.filter.rps, 0),
            fmt(r.new_shape.p50_ms, 1),
            fmt(r.bind.p50_ms, 2),
            fmt(r.bind.p99_ms, 2),
            fmt(r.bind_alone.p50_ms, 2),
            fmt(r.bind_alone.p99_ms, 2),
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
        "1-shape p50 ms",
        "1-shape p99 ms",
        "1-shape CPU ms",
        f"{many} p50 ms",
        f"{many} p99 ms",
        f"{many} CPU ms",
        "interleaved filter p50 ms",
        "interleaved filter p99 ms",
        "interleaved bind p50 ms",
        "interleaved bind p99 ms",
        "interleaved CPU ms/pair",
        "lone bind CPU ms",
    ]
    rows = [
        [
            f"{r.nodes:,}",
            f"{r.occupancy:.0%}",
            fmt(r.one_shape.filter.p50_ms, 2),
            fmt(r.one_shape.filter.p99_ms, 2),
            fmt(r.one_shape.cpu.ms_per_request, 2),
            fmt(r.many_shapes.filter.p50_ms, 2),
            fmt(r.many_shapes.filter.p99_ms, 2),
            fmt(r.many_shapes.cpu.ms_per_request, 2),
            fmt(r.interleaved.filter.p50_ms, 2),
            fmt(r.interleaved.filter.p99_ms, 2),
            fmt(r.interleaved.bind.p50_ms, 2),
            fmt(r.interleaved.bind.p99_ms, 2),
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
        "interleaved filter p50 ms",
        "interleaved filter p99 ms",
        "interleaved bind p50 ms",
        "interleaved bind p99 ms",
        "bind p50 ms",
        "bind p99 ms",
        "cold bind p50 ms",
        "cold bind p99 ms",
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
                fmt(r.interleaved.filter.p50_ms, 2),
                fmt(r.interleaved.filter.p99_ms, 2),
                fmt(r.interleaved.bind.p50_ms, 2),
                fmt(r.interleaved.bind.p99_ms, 2),
                fmt(r.warm.bind.p50_ms, 2),
                fmt(r.warm.bind.p99_ms, 2),
                fmt(r.cold.bind.p50_ms, 2),
                fmt(r.cold.bind.p99_ms, 2),
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
