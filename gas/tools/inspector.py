"""`gas inspect` (also the kubectl plugin `kubectl gas`): GPU allocation per node and card.

Reads nodes and pods from the API server and recomputes, from pod annotations alone and
with the ledger's own code (`gas.core.ledger.observe_pod`, `gas.tools.audit.usage_from_pods`), what
every card has given out: the same numbers a freshly started gas would hold. It needs no
running gas, only read access to nodes and pods; `--extender URL` also asks a running gas
for its ledger (`/debug/ledger`) and reports where the two disagree (drift).

Nodes are shown when they have GPU labels or `gpu.intel.com/*` allocatable, or when a pod
holds cards on them; other nodes are only counted. Rows are sorted by node, then card in
numeric order. Memory resources are shown in binary units (`5Gi`), others as integers.

Problems (exit status 1): a card given out beyond its capacity or held on a card the node
does not list (gas never does either; seeing one means drift or a hand-made annotation),
a `gas-container-cards` or `gas-container-tiles` annotation that cannot be read (gas then
counts the cards it names, or the whole node, as full), and drift from `--extender`.
Warnings (shown, exit status unchanged): a GPU node whose labels or allocatable cannot be
read (gas sends it no GPU pod), and a bound GPU pod without gas's annotation (not
accounted by gas: it was scheduled around the extender).

Exit status: 0 all well, 1 problems found, 2 the cluster or the extender could not be read
or `--node` names no node.

`-o json` prints one object; keys are stable, amounts are exact integers (bytes for memory):

    {
      "nodes": [                      # sorted by name
        {
          "name": "node-a",
          "problem": null,            # why the node's labels/allocatable cannot be read
          "blocked_by": [],           # pods whose unreadable annotation blocks the whole node
          "cards": [                  # numeric card order
            {
              "name": "card0",
              "listed": true,         # false: pods hold it but the node's labels omit it
              "over_capacity": false,
              "blocked": false,       # counted as full by gas (see blocked_by)
              "resources": {"i915": {"allocated": 1, "capacity": 1}, ...},
              "pods": ["default/train"],
              "blocked_by": []        # pods whose unreadable annotation names this card
            }
          ]
        }
      ],
      "totals": {
        "nodes": 3, "cards": 7, "pods": 5,
        "nodes_without_gpus": 1,      # listed by the API server but not shown
        "resources": {"i915": {"allocated": 4, "capacity": 7}, ...}
      },
      "problems": [                   # each: kind, node, card, pod (null when n/a), message
        {"kind": "over_capacity" | "annotation" | "drift", ...}
      ],
      "warnings": [{"kind": "node" | "unaccounted", ...}],
      "drift": null,                  # without --extender; else {"url": ..., "differences": [...]}
      "placeable": {                  # only with --placeable: more pods of each size that fit
        "nodes": {"node-a": {"quarter-card": 4, "half-card": 2, "one-card": 1, "two-cards": 0}},
        "total": {"quarter-card": 4, ...}   # each size counted alone (gas.core.scoring)
      }
    }

Resource names drop the `gpu.intel.com/` prefix: `i915`, `memory.max`, `millicores`, ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    GPU_COUNT_RESOURCES,
    RESOURCE_PREFIX,
    NodeGpu,
    SpecError,
    as_mapping,
    card_number,
    node_from_object,
    pod_request,
    sort_cards,
)
from gas.core.quantity import format_quantity

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2

NODE_MISSING = "node does not exist"
PAGE_SIZE = 500
API_TIMEOUT = (5.0, 60.0)
EXTENDER_TIMEOUT = 10.0
DRIFT_POLL = 0.5


# ---------------------------------------------------------------- the report


@dataclass
class CardView:
    name: str
    listed: bool
    resources: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Short resource name -> (allocated, capacity)."""
    pods: list[str] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)

    @property
    def over_capacity(self) -> bool:
        if not self.listed:
            return bool(self.resources)
        return any(allocated > capacity for allocated, capacity in self.resources.values())


@dataclass
class NodeView:
    name: str
    problem: str | None
    cards: list[CardView] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    node: str | None = None
    card: str | None = None
    pod: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node": self.node,
            "card": self.card,
            "pod": self.pod,
            "message": self.message,
        }


@dataclass
class Report:
    nodes: list[NodeView]
    pods: int
    nodes_without_gpus: int
    problems: list[Finding]
    warnings: list[Finding]
    drift_url: str | None = None
    drift: list[str] = field(default_factory=list)
    placeable: dict[str, dict[str, int]] | None = None
    """Node -> pod size -> more pods of that size that fit (`gas.core.scoring.placeable_pods`);
    None unless asked for (`--placeable`)."""

    @property
    def resources(self) -> list[str]:
        """Every resource shown, GPU counts first."""
        names = {r for node in self.nodes for card in node.cards for r in card.resources}
        return sorted(names, key=_resource_order)

    def totals(self) -> dict[str, tuple[int, int]]:
        sums: dict[str, tuple[int, int]] = {}
        for node in self.nodes:
            for card in node.cards:
                for res, (allocated, capacity) in card.resources.items():
                    had = sums.get(res, (0, 0))
                    sums[res] = (had[0] + allocated, had[1] + capacity)
        return {res: sums[res] for res in sorted(sums, key=_resource_order)}

    @property
    def card_count(self) -> int:
        return sum(1 for node in self.nodes for card in node.cards if card.listed)

    @property
    def failed(self) -> bool:
        return bool(self.problems or self.drift)


def build_report(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    only_node: str | None = None,
    placeable: bool = False,
) -> Report:
    """What the annotations of `pods` give out on the cards of `nodes` (pure)."""
    # Imported when used: `gas` imports this module to build its parser on every start.
    from gas.core.ledger import observe_pod
    from gas.tools.audit import usage_from_pods

    gpus = {gpu.name: gpu for gpu in map(node_from_object, nodes)}
    gpu_like = {_name(obj) for obj in nodes if _looks_like_gpu_node(obj)}
    usage = usage_from_pods(pods)

    holders: dict[str, dict[str, list[str]]] = {}  # node -> card -> pods
    card_blockers: dict[str, dict[str, list[str]]] = {}
    node_blockers: dict[str, list[str]] = {}
    holding_pods: dict[str, set[str]] = {}  # node -> pod UIDs
    problems: list[Finding] = []
    warnings: list[Finding] = []
    for pod in pods:
        observation = observe_pod(pod)
        if observation is None or observation.terminal:
            continue
        who = f"{observation.namespace}/{observation.name}"
        holding = observation.holding
        if holding is None:
            node = as_mapping(pod.get("spec")).get("nodeName")
            if isinstance(node, str) and node and _uses_gpus(pod):
                warnings.append(
                    Finding(
                        "unaccounted",
                        f"pod {who} on {node} uses GPUs but has no {ANNOTATION_CARDS} "
                        "annotation: gas does not account it (scheduled around the extender?)",
                        node=node,
                        pod=who,
                    )
                )
            continue
        holding_pods.setdefault(holding.node, set()).add(holding.uid)
        cards = {c for segment in holding.allocation for c in segment} | set(holding.usage)
        for card in cards:
            holders.setdefault(holding.node, {}).setdefault(card, []).append(who)
        if holding.blocked_cards or holding.blocks_node:
            for card in holding.blocked_cards:
                card_blockers.setdefault(holding.node, {}).setdefault(card, []).append(who)
            if holding.blocks_node:
                node_blockers.setdefault(holding.node, []).append(who)
            # Readable cards with blocked ones: the cards were accounted and it is the
            # tiles annotation that could not be read.
            annotation = ANNOTATION_TILES if holding.allocation else ANNOTATION_CARDS
            value = as_mapping(as_mapping(pod.get("metadata")).get("annotations")).get(annotation)
            held = ", ".join(sort_cards(holding.blocked_cards)) or "the whole node"
            problems.append(
                Finding(
                    "annotation",
                    f"pod {who} on {holding.node}: {annotation}={_short(value)} "
                    f"cannot be read; gas counts {held} as full",
                    node=holding.node,
                    pod=who,
                )
            )

    if only_node is not None:
        shown = {only_node}
    else:
        shown = gpu_like | set(usage) | set(holders) | set(node_blockers)
        shown |= {name for name, gpu in gpus.items() if gpu.cards}
    views = []
    for name in sorted(shown):
        gpu = gpus.get(name) or NodeGpu(name=name, problem=NODE_MISSING)
        view = _node_view(
            gpu,
            usage.get(name, {}),
            holders.get(name, {}),
            card_blockers.get(name, {}),
            node_blockers.get(name, []),
        )
        views.append(view)
        if gpu.problem is not None and gpu.problem != NODE_MISSING:
            warnings.append(Finding("node", f"{name}: {gpu.problem}", node=name))
        problems.extend(_capacity_findings(view))

    fragmentation = None
    if placeable:
        from gas.core.scoring import placeable_pods

        fragmentation = placeable_pods(
            [gpus[v.name] for v in views if v.name in gpus and gpus[v.name].cards],
            usage,
            {node: frozenset(cards) for node, cards in card_blockers.items()},
            frozenset(node_blockers),
        )
    return Report(
        placeable=fragmentation,
        nodes=views,
        pods=sum(len(holding_pods.get(view.name, ())) for view in views),
        nodes_without_gpus=len({_name(obj) for obj in nodes} - shown),
        problems=sorted(problems, key=_finding_order),
        warnings=sorted(warnings, key=_finding_order),
    )


def _node_view(
    gpu: NodeGpu,
    usage: Mapping[str, Mapping[str, int]],
    holders: Mapping[str, list[str]],
    blockers: Mapping[str, list[str]],
    node_blockers: list[str],
) -> NodeView:
    view = NodeView(gpu.name, gpu.problem, blocked_by=sorted(node_blockers))
    listed = set(gpu.cards)
    # A blocked card the node does not have holds nothing, so it gets no row.
    names = listed | set(usage) | set(holders) | (set(blockers) & listed)
    for card in sort_cards(names):
        card_view = CardView(card, card in listed)
        card_usage = usage.get(card, {})
        resources = set(card_usage) | (set(gpu.capacity) if card_view.listed else set())
        for res in sorted(resources):
            capacity = gpu.capacity.get(res, 0) if card_view.listed else 0
            card_view.resources[_short_resource(res)] = (card_usage.get(res, 0), capacity)
        card_view.pods = sorted(holders.get(card, []))
        card_view.blocked_by = sorted(blockers.get(card, []))
        view.cards.append(card_view)
    return view


def _capacity_findings(view: NodeView) -> list[Finding]:
    findings = []
    for card in view.cards:
        where = f"{view.name}/{card.name}"
        if not card.listed:
            if card.over_capacity:
                why = view.problem or "not a card of the node's labels"
                findings.append(
                    Finding(
                        "over_capacity",
                        f"{where}: held by {', '.join(card.pods)}, but the card is unknown ({why})",
                        node=view.name,
                        card=card.name,
                    )
                )
            continue
        for res, (allocated, capacity) in card.resources.items():
            if allocated > capacity:
                findings.append(
                    Finding(
                        "over_capacity",
                        f"{where}: {res} {_amount(res, allocated)} allocated, "
                        f"capacity {_amount(res, capacity)}",
                        node=view.name,
                        card=card.name,
                    )
                )
    return findings


def _looks_like_gpu_node(node: Mapping[str, Any]) -> bool:
    labels = as_mapping(as_mapping(node.get("metadata")).get("labels"))
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    return any(str(key).startswith(RESOURCE_PREFIX) for key in (*labels, *allocatable))


def _uses_gpus(pod: Mapping[str, Any]) -> bool:
    try:
        return pod_request(pod).needs_gpu
    except SpecError:
        # Only GPU requests or a missing container list make a pod unreadable here: a
        # bound pod with broken GPU requests is worth a look too.
        return True


def _name(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("name") or "")


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _short_resource(resource: str) -> str:
    return resource.removeprefix(RESOURCE_PREFIX)


def _resource_order(short: str) -> tuple[int, str]:
    gpu_counts = [_short_resource(r) for r in GPU_COUNT_RESOURCES]
    return (gpu_counts.index(short), short) if short in gpu_counts else (len(gpu_counts), short)


def _finding_order(finding: Finding) -> tuple[str, int, str, str, str]:
    card = card_number(finding.card) if finding.card else -1
    return (finding.node or "", card, finding.pod or "", finding.kind, finding.message)


def _amount(resource: str, value: int) -> str:
    # Only memory is counted in bytes; binary suffixes on millicores would mislead.
    return format_quantity(value) if resource.startswith("memory") else str(value)


# ---------------------------------------------------------------- rendering


def render_table(report: Report) -> str:
    resources = report.resources
    rows = [["NODE", "CARD", "STATUS", *resources, "PODS"]]
    for node in report.nodes:
        if not node.cards:
            status = "unusable" if node.problem else "no cards"
            rows.append([node.name, "-", status, *["-"] * len(resources), ""])
        for card in node.cards:
            flags = []
            if card.over_capacity:
                flags.append("over")
            if not card.listed:
                flags.append("unknown")
            if card.blocked_by or node.blocked_by:
                flags.append("blocked")
            cells = [node.name, card.name, ",".join(flags) or "ok"]
            for res in resources:
                pair = card.resources.get(res)
                cells.append(f"{_amount(res, pair[0])}/{_amount(res, pair[1])}" if pair else "-")
            blockers = sorted({*card.blocked_by, *node.blocked_by})
            names = card.pods + [f"{b} (unreadable)" for b in blockers if b not in card.pods]
            cells.append(", ".join(names))
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


def _placeable_lines(report: Report) -> list[str]:
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


def _total_line(report: Report) -> str:
    parts = [
        _plural(len(report.nodes), "node"),
        _plural(report.card_count, "card"),
        _plural(report.pods, "pod"),
    ]
    line = "Total: " + ", ".join(parts)
    totals = report.totals()
    if totals:
        line += "; " + ", ".join(
            f"{res} {_amount(res, a)}/{_amount(res, c)}" for res, (a, c) in totals.items()
        )
    if report.nodes_without_gpus:
        line += f" ({_plural(report.nodes_without_gpus, 'node')} without GPUs not shown)"
    return line


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def report_json(report: Report) -> dict[str, Any]:
    def amounts(resources: Mapping[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
        return {
            res: {"allocated": a, "capacity": c}
            for res, (a, c) in sorted(resources.items(), key=lambda i: _resource_order(i[0]))
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


# ---------------------------------------------------------------- command line


class InspectError(Exception):
    """The cluster or the extender could not be read; the message says what failed."""


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
    parser.add_argument("-v", "--v", type=int, default=2, help="log verbosity: 4+ debug (2)")


def run(args: argparse.Namespace) -> int:
    with _quiet_logs(args.v):
        try:
            api_client = _api_client(args.kubeConfig, args.context)
            nodes, pods = _read_cluster(api_client, args.node)
            if (
                args.node is not None
                and not nodes
                and not any(as_mapping(p.get("spec")).get("nodeName") == args.node for p in pods)
            ):
                raise InspectError(f"node {args.node} not found")
            if getattr(args, "check", False):
                return _run_check(args, api_client, nodes, pods)
            report = build_report(nodes, pods, args.node, args.placeable)
            if args.extender:
                report.drift_url = args.extender
                report.drift = _check_drift(args, api_client, pods)
        except InspectError as exc:
            print(f"gas inspect: {exc}", file=sys.stderr)
            return EXIT_ERROR
    text = json.dumps(report_json(report), indent=2) + "\n" if args.output == "json" else None
    try:
        sys.stdout.write(text or render_table(report))
        sys.stdout.flush()
    except BrokenPipeError:
        # `gas inspect | head`: the reader left; Python would complain again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_PROBLEMS if report.failed else EXIT_OK


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


def _api_client(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client, config

    from gas.cluster.kube import load_api_client

    try:
        if kubeconfig is None and context is None:
            with contextlib.suppress(config.ConfigException):
                return load_api_client(None)  # in a pod: its ServiceAccount
        configuration = client.Configuration()
        # Read now, not at import time as the client's own default is.
        path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        load_kube_config: Any = config.load_kube_config  # untyped in the client
        load_kube_config(
            config_file=path,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except config.ConfigException as exc:
        raise InspectError(
            f"no usable Kubernetes configuration ({exc}); "
            "give --kubeConfig, set KUBECONFIG, or run in a pod"
        ) from exc
    except OSError as exc:
        raise InspectError(f"cannot read the kubeconfig: {exc}") from exc
    return client.ApiClient(configuration)


def _read_cluster(
    api_client: Any, only_node: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    if only_node is None:
        nodes = _list_all(core.list_node, "nodes")
        pods = _list_all(core.list_pod_for_all_namespaces, "pods")
    else:
        nodes = _list_all(core.list_node, "nodes", field_selector=f"metadata.name={only_node}")
        pods = _list_all(
            core.list_pod_for_all_namespaces, "pods", field_selector=f"spec.nodeName={only_node}"
        )
    return nodes, pods


def _list_all(call: Any, what: str, **selectors: str) -> list[dict[str, Any]]:
    """Every item, a page at a time: one huge list would be slow on the API server too."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        paging: dict[str, Any] = {"limit": PAGE_SIZE}
        if token:
            paging["_continue"] = token
        try:
            response = call(
                _preload_content=False, _request_timeout=API_TIMEOUT, **selectors, **paging
            )
            body = json.loads(response.data)
        except Exception as exc:
            raise InspectError(f"cannot list {what}: {_api_error(exc)}") from exc
        items.extend(item for item in body.get("items") or [] if isinstance(item, dict))
        token = as_mapping(body.get("metadata")).get("continue")
        if not token:
            return items


def _api_error(exc: Exception) -> str:
    from kubernetes import client

    if isinstance(exc, client.ApiException):
        try:
            message = as_mapping(json.loads(exc.body or "")).get("message")
        except ValueError:
            message = None
        return f"{exc.status} {message or exc.reason}"
    return str(exc) or type(exc).__name__


def _check_drift(
    args: argparse.Namespace, api_client: Any, pods: list[dict[str, Any]]
) -> list[str]:
    """Differences between the annotations and gas's ledger that outlast `--driftWait`.

    gas applies a pod's change when its watch delivers it, a moment after the API server
    shows it; a difference seen once may be that moment, so both sides are read again
    until they agree or the wait is over.
    """
    deadline = time.monotonic() + max(args.driftWait, 0.0)
    differences = _drift(pods, _fetch_ledger(args), args.node)
    while differences and time.monotonic() < deadline:
        time.sleep(DRIFT_POLL)
        _, pods = _read_cluster(api_client, args.node)
        differences = _drift(pods, _fetch_ledger(args), args.node)
    return differences


def _run_check(
    args: argparse.Namespace,
    api_client: Any,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
) -> int:
    """`--check`: the invariants of gas.tools.audit.check_invariants; a violation involving the
    ledger counts only if it outlasts `--driftWait` (the watch trails the API server)."""
    from gas.tools.audit import check_invariants, in_flight

    ledger = _fetch_ledger(args) if args.extender else None
    violations = check_invariants(nodes, pods, ledger)
    deadline = time.monotonic() + max(args.driftWait, 0.0)
    while violations and ledger is not None and time.monotonic() < deadline:
        time.sleep(DRIFT_POLL)
        nodes, pods = _read_cluster(api_client, args.node)
        ledger = _fetch_ledger(args)
        violations = check_invariants(nodes, pods, ledger)
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


def _fetch_ledger(args: argparse.Namespace) -> Mapping[str, Any]:
    import requests
    import urllib3

    verify: bool | str = args.cacert or True
    if args.insecure:
        verify = False
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    if bool(args.cert) != bool(args.key):
        raise InspectError("--cert and --key go together")
    url = args.extender.rstrip("/") + "/debug/ledger"
    try:
        response = requests.get(
            url,
            verify=verify,
            cert=(args.cert, args.key) if args.cert else None,
            timeout=EXTENDER_TIMEOUT,
        )
        response.raise_for_status()
        ledger = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise InspectError(f"cannot read the ledger at {url}: {exc}") from exc
    if not isinstance(ledger, dict) or not isinstance(ledger.get("usage"), dict):
        raise InspectError(f"{url} did not answer a gas ledger")
    return ledger
