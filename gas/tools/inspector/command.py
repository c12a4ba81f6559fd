"""`gas inspect` and `kubectl gas`: the command line, `--check` and drift from a ledger."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gas.core.model import as_mapping
from gas.tools.inspector.dra import DraReport, dra_json, dra_report, render_dra_table
from gas.tools.inspector.read import (
    InspectError,
    cluster_client,
    fetch_ledger,
    read_cluster,
    read_dra,
)
from gas.tools.inspector.render import render_table, report_json
from gas.tools.inspector.report import build_report
from gas.tools.inspector.usage import (
    UsageRow,
    read_usage,
    render_usage,
    usage_json,
    usage_rows,
)

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2

DRIFT_POLL = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeConfig",
        "--kubeconfig",
        dest="kubeConfig",
        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--node", help="show only this node")
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="output format (table)",
    )
    # `gas` rewrites `-o` to `--o` (GAS's Go-style flags take one dash or two).
    parser.add_argument(
        "--o",
        dest="output",
        choices=("table", "json"),
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--extender",
        metavar="URL",
        help="also compare with the ledger of the gas serving at URL (GET /debug/ledger)",
    )
    parser.add_argument("--cacert", help="CA bundle that signed the extender's certificate")
    parser.add_argument("--cert", help="client certificate for the extender (mutual TLS)")
    parser.add_argument("--key", help="client key for the extender (mutual TLS)")
    parser.add_argument(
        "--insecure", action="store_true", help="do not verify the extender's certificate"
    )
    parser.add_argument(
        "--driftWait",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="how long drift must persist to count: a running gas's watch trails the API "
        "server by a moment (3)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the invariants instead of showing the table: no card over capacity, no "
        "pod or tile accounted twice and, with --extender, the ledger equals the annotations "
        "plus its binds in flight (exit 1 on any violation)",
    )
    parser.add_argument(
        "--placeable",
        action="store_true",
        help="also show how many more pods of common sizes (a quarter, half or whole card, "
        "two cards) each node could take: GPU fragmentation",
    )
    parser.add_argument(
        "--namespace",
        default="gas-system",
        help="gas's namespace, where its node agents run: their /usage is read through the "
        "API server's proxy (gas-system)",
    )
    parser.add_argument(
        "--no-usage",
        dest="usage",
        action="store_false",
        help="leave out each container's GPU use beside its share",
    )
    parser.add_argument("-v", "--v", type=int, default=2, help="log verbosity: 4+ debug (2)")


def run(args: argparse.Namespace) -> int:
    with _quiet_logs(args.v):
        try:
            api_client = cluster_client(args.kubeConfig, args.context)
            nodes, pods = read_cluster(api_client, args.node)
            if (
                args.node is not None
                and not nodes
                and not any(as_mapping(p.get("spec")).get("nodeName") == args.node for p in pods)
            ):
                raise InspectError(f"node {args.node} not found")
            # The nodes `gas dra` serves keep their books in ResourceSlices and claims.
            slices, claims, dra_error = read_dra(api_client, args.node)
            dra = dra_report(slices, claims, args.node)
            if getattr(args, "check", False):
                return _run_check(args, api_client, nodes, pods, dra)
            report = build_report(nodes, pods, args.node, args.placeable)
            rows, usage_errors = _usage(args, api_client)
            if args.extender:
                report.drift_url = args.extender
                report.drift = _check_drift(args, api_client, pods)
        except InspectError as exc:
            print(f"gas inspect: {exc}", file=sys.stderr)
            return EXIT_ERROR
    if args.output == "json":
        whole = report_json(report)
        # Only where there is something to say: a cluster without DRA nodes reads as before.
        if dra.cards or dra.problems or dra_error is not None:
            whole["dra"] = dra_json(dra) | {"error": dra_error}
        if rows or usage_errors:
            whole["usage"] = usage_json(rows, usage_errors)
        text = json.dumps(whole, indent=2) + "\n"
    else:
        used = render_usage(rows, usage_errors)
        text = render_table(report) + _dra_text(dra, dra_error) + _block(used)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `gas inspect | head`: the reader left; Python would complain again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_PROBLEMS if report.failed or dra.problems else EXIT_OK


def _usage(args: argparse.Namespace, api_client: Any) -> tuple[list[UsageRow], list[str]]:
    if not getattr(args, "usage", True):
        return [], []
    answers, errors = read_usage(api_client, args.namespace, args.node)
    return usage_rows(answers, args.node), errors


def _block(lines: list[str]) -> str:
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def _dra_text(dra: DraReport, error: str | None) -> str:
    lines = render_dra_table(dra)
    if dra.problems:
        lines += ["", "DRA problems:", *(f"  {f.message}" for f in dra.problems)]
    if error is not None:
        lines.append(f"DRA nodes not shown: {error}")
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """`kubectl gas [inspect] [flags]`: kubectl runs `kubectl-gas` from PATH."""
    parser = argparse.ArgumentParser(
        prog="kubectl gas",
        description="Show GPU allocation per node and card, from pod annotations (gas).",
    )
    add_arguments(parser)
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["inspect"]:
        arguments = arguments[1:]
    args = parser.parse_args(arguments)
    logging.basicConfig(
        level=logging.DEBUG if args.v >= 4 else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    return run(args)


@contextlib.contextmanager
def _quiet_logs(verbosity: int) -> Iterator[None]:
    """The report already shows what gas's modules would log (unreadable annotations),
    and their progress messages are meant for a server's log, not a terminal."""
    logger = logging.getLogger("gas")
    previous = logger.level
    if verbosity < 4:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _check_drift(
    args: argparse.Namespace, api_client: Any, pods: list[dict[str, Any]]
) -> list[str]:
    """Differences between the annotations and gas's ledger that outlast `--driftWait`.

    gas applies a pod's change when its watch delivers it, a moment after the API server
    shows it; a difference seen once may be that moment, so both sides are read again
    until they agree or the wait is over.
    """
    deadline = time.monotonic() + max(args.driftWait, 0.0)
    differences = _drift(pods, fetch_ledger(args), args.node)
    while differences and time.monotonic() < deadline:
        time.sleep(DRIFT_POLL)
        _, pods = read_cluster(api_client, args.node)
        differences = _drift(pods, fetch_ledger(args), args.node)
    return differences


def _run_check(
    args: argparse.Namespace,
    api_client: Any,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    dra: DraReport,
) -> int:
    """`--check`: the invariants of gas.tools.audit.check_invariants; a violation involving the
    ledger counts only if it outlasts `--driftWait` (the watch trails the API server)."""
    from gas.tools.audit import check_invariants, in_flight

    ledger = fetch_ledger(args) if args.extender else None
    violations = check_invariants(nodes, pods, ledger)
    deadline = time.monotonic() + max(args.driftWait, 0.0)
    while violations and ledger is not None and time.monotonic() < deadline:
        time.sleep(DRIFT_POLL)
        nodes, pods = read_cluster(api_client, args.node)
        ledger = fetch_ledger(args)
        violations = check_invariants(nodes, pods, ledger)
    # kube-scheduler keeps the DRA cards' books; a card past its capacity is still a fault.
    violations = violations + [f.message for f in dra.problems]
    flying = in_flight(ledger) if ledger is not None else []
    if args.output == "json":
        text = json.dumps({"violations": violations, "in_flight": flying}, indent=2) + "\n"
    else:
        lines = [f"Violations ({len(violations)}):", *(f"  {v}" for v in violations)]
        if not violations:
            lines = ["Invariants hold" + (f" (ledger at {args.extender})" if ledger else "")]
        if flying:
            lines += [f"Binds in flight ({len(flying)}):", *(f"  {f}" for f in flying)]
        text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    return EXIT_PROBLEMS if violations else EXIT_OK


def _drift(
    pods: list[dict[str, Any]], ledger: Mapping[str, Any], only_node: str | None
) -> list[str]:
    from gas.tools.audit import drift, usage_from_pods

    expected = _without_zeros(usage_from_pods(pods))
    held = as_mapping(ledger.get("usage"))
    if only_node is not None:
        expected = {n: u for n, u in expected.items() if n == only_node}
        held = {n: u for n, u in held.items() if n == only_node}
    return drift(expected, held)


def _without_zeros(
    usage: Mapping[str, Mapping[str, Mapping[str, int]]],
) -> dict[str, dict[str, dict[str, int]]]:
    """The ledger drops zero amounts (a request of `0`) and empty cards; so must we, or a
    pod asking for 0 of a resource would look like drift."""
    result: dict[str, dict[str, dict[str, int]]] = {}
    for node, cards in usage.items():
        kept = {
            card: {res: amount for res, amount in resources.items() if amount}
            for card, resources in cards.items()
        }
        kept = {card: resources for card, resources in kept.items() if resources}
        if kept:
            result[node] = kept
    return result
