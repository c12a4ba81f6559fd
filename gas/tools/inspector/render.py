"""The allocation report as a table for people, or as JSON (its keys are stable)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gas.tools.inspector.report import AllocationReport, format_amount, resource_order


def render_table(report: AllocationReport) -> str:
    resources = report.resources
    # What the node side handed out, beside gas's decision (PODS), once a node reports it.
    handouts = report.handouts_seen
    rows = [["NODE", "CARD", "STATUS", *resources, "PODS", *(["HANDED-OUT"] if handouts else [])]]
    for node in report.nodes:
        if not node.cards:
            status = "unusable" if node.problem else "no cards"
            rows.append([node.name, "-", status, *["-"] * len(resources), ""])
            rows[-1] += [""] if handouts else []
        for card in node.cards:
            flags = []
            if card.over_capacity:
                flags.append("over")
            if not card.listed:
                flags.append("unknown")
            if card.blocked_by or node.blocked_by:
                flags.append("blocked")
            if card.node_drift:
                flags.append("drift")
            cells = [node.name, card.name, ",".join(flags) or "ok"]
            for res in resources:
                pair = card.resources.get(res)
                cells.append(
                    f"{format_amount(res, pair[0])}/{format_amount(res, pair[1])}" if pair else "-"
                )
            blockers = sorted({*card.blocked_by, *node.blocked_by})
            names = card.pods + [f"{b} (unreadable)" for b in blockers if b not in card.pods]
            cells.append(", ".join(names))
            if handouts:
                cells.append(", ".join(card.handed_out))
            rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]
    lines += _placeable_lines(report)
    for title, findings in (("Problems", report.problems), ("Warnings", report.warnings)):
        if findings:
            lines += ["", f"{title}:", *(f"  {f.message}" for f in findings)]
    if report.drift_url is not None:
        lines.append("")
        if report.drift:
            lines.append(f"Drift from the ledger at {report.drift_url}:")
            lines += [f"  {line}" for line in report.drift]
        else:
            lines.append(f"Ledger at {report.drift_url}: no drift")
    lines += ["", _total_line(report)]
    return "\n".join(lines) + "\n"


def _placeable_lines(report: AllocationReport) -> list[str]:
    """Fragmentation: how many more pods of each common size each node could take."""
    from gas.core.scoring import POD_SIZES, cluster_placeable

    if report.placeable is None:
        return []
    sizes = [size.name for size in POD_SIZES]
    rows = [["PLACEABLE", *sizes]]
    rows += [[node, *(str(c.get(s, 0)) for s in sizes)] for node, c in report.placeable.items()]
    total = cluster_placeable(report.placeable)
    rows.append(["total", *(str(total[s]) for s in sizes)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(sizes) + 1)]
    return [
        "",
        *("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows),
    ]


def _total_line(report: AllocationReport) -> str:
    parts = [
        _plural(len(report.nodes), "node"),
        _plural(report.card_count, "card"),
        _plural(report.pods, "pod"),
    ]
    line = "Total: " + ", ".join(parts)
    totals = report.totals()
    if totals:
        line += "; " + ", ".join(
            f"{res} {format_amount(res, a)}/{format_amount(res, c)}"
            for res, (a, c) in totals.items()
        )
    if report.nodes_without_gpus:
        line += f" ({_plural(report.nodes_without_gpus, 'node')} without GPUs not shown)"
    return line


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def report_json(report: AllocationReport) -> dict[str, Any]:
    def amounts(resources: Mapping[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
        return {
            res: {"allocated": a, "capacity": c}
            for res, (a, c) in sorted(resources.items(), key=lambda i: resource_order(i[0]))
        }

    result: dict[str, Any] = {
        "nodes": [
            {
                "name": node.name,
                "problem": node.problem,
                "blocked_by": node.blocked_by,
                "cards": [
                    {
                        "name": card.name,
                        "listed": card.listed,
                        "over_capacity": card.over_capacity,
                        "blocked": bool(card.blocked_by or node.blocked_by),
                        "resources": amounts(card.resources),
                        "pods": card.pods,
                        "blocked_by": card.blocked_by,
                        "handed_out": card.handed_out,
                        "node_drift": card.node_drift,
                    }
                    for card in node.cards
                ],
            }
            for node in report.nodes
        ],
        "totals": {
            "nodes": len(report.nodes),
            "cards": report.card_count,
            "pods": report.pods,
            "nodes_without_gpus": report.nodes_without_gpus,
            "resources": amounts(report.totals()),
        },
        "problems": [f.as_json() for f in report.problems],
        "warnings": [f.as_json() for f in report.warnings],
        "drift": None
        if report.drift_url is None
        else {"url": report.drift_url, "differences": report.drift},
    }
    if report.placeable is not None:
        from gas.core.scoring import cluster_placeable

        total = cluster_placeable(report.placeable)
        result["placeable"] = {"nodes": report.placeable, "total": total}
    return result
