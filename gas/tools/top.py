"""`gas top`: each card of this node and the containers using it, with their real use beside
their share, read once (like `top -n 1`, for GPU shares).

The use comes from the kernel (`gas.host.proc`: the DRM clients in `/proc/<pid>/fdinfo`,
each process's cgroup naming its pod and container), attributed to the cards discovery
finds in sysfs (`gas.host.usage`). With `--interval S` the node is read twice, S seconds
apart, and each container's engines are shown busy in percent of their class.

The share is what gas gave the container: in the extender way its segment of the pod's
`gas-container-cards` with its requests (`gas.core.shares.extender_shares`), in the DRA way
the GAS_CARD<N>_* variables in its environment (`read_shares`). With `--kubeconfig` the
node's pods are listed (`spec.nodeName`) to name each container and read the extender
way's shares; without, containers are named by pod UID and container id, and shares come
from the environment alone.

What could not be read is said on stderr, a line per note, and the rest is shown (exit
0); only a proc root that cannot be listed at all is a failure (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gas.core.model import ANNOTATION_CARDS, SpecError, as_mapping
from gas.core.shares import Share, extender_shares, read_shares
from gas.host.cards import Card
from gas.host.containers import container_ids
from gas.host.discovery import discover_sysfs
from gas.host.errors import NodeError
from gas.host.proc import ProcScan, scan
from gas.host.usage import CardUse, ContainerUse, Usage, attribute, engine_utilization

MI = 1024**2
GI = 1024**3

Utilization = Mapping[tuple[str, str, str], Mapping[str, float]]


@dataclass(frozen=True)
class Named:
    """What the API server says of one container."""

    namespace: str
    pod: str
    container: str
    shares: Mapping[str, Share] | None
    """Card -> share, from the pod's `gas-container-cards`; None: the pod does not say."""


@dataclass(frozen=True)
class Pods:
    """The node's pods, indexed as the kernel names their containers."""

    containers: Mapping[str, Named]
    """Container id (without its runtime's prefix) -> names and shares."""
    pods: Mapping[str, tuple[str, str]]
    """Pod UID -> namespace and name."""


NO_PODS = Pods({}, {})


def index_pods(pods: Sequence[Mapping[str, Any]]) -> tuple[Pods, list[str]]:
    """The pods' containers by id, and what could not be read of them."""
    notes = []
    containers: dict[str, Named] = {}
    uids: dict[str, tuple[str, str]] = {}
    for pod in pods:
        metadata = as_mapping(pod.get("metadata"))
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        uids[str(metadata.get("uid") or "")] = (namespace, name)
        shares: dict[str, dict[str, Share]] | None = None
        if ANNOTATION_CARDS in as_mapping(metadata.get("annotations")):
            try:
                shares = extender_shares(pod)
            except SpecError as exc:
                notes.append(f"pod {namespace}/{name}: its shares cannot be read: {exc}")
        for container_id, container in container_ids(pod).items():
            held = None if shares is None else shares.get(container, {})
            containers[container_id] = Named(namespace, name, container, held)
    return Pods(containers, uids), notes


def read_pods(kubeconfig: str, node: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The pods bound to `node`; on failure none, and a note saying why."""
    from kubernetes.client.exceptions import ApiException

    from gas.host.kubeapi import API_TIMEOUT, core_api
    from gas.kubeapi.core import status_message
    from gas.kubeapi.paging import list_pages

    try:
        api = core_api(kubeconfig)
        found: list[dict[str, Any]] = []
        for page in list_pages(
            api.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
            timeout=API_TIMEOUT,
        ):
            if page.first:
                found = []  # the list started over: what the expired one gave goes
            found.extend(item for item in page.items if isinstance(item, dict))
    except NodeError as exc:
        return [], [f"containers not named: {exc}"]
    except ApiException as exc:
        why = status_message(exc.status, exc.reason, exc.body)
        return [], [f"containers not named: cannot list the pods of node {node}: {why}"]
    except Exception as exc:  # any transport or decoding failure: the use is still shown
        why = str(exc) or type(exc).__name__
        return [], [f"containers not named: cannot list the pods of node {node}: {why}"]
    return found, []


# ---------------------------------------------------------------- the report, as JSON


def _engines(use: ContainerUse) -> dict[str, dict[str, int | None]]:
    return {
        name: {"busy": engine.busy, "total": engine.total, "capacity": engine.capacity}
        for name, engine in sorted(use.engines.items())
    }


def _environment_shares(use: ContainerUse, found: ProcScan) -> dict[str, Share] | None:
    pids = set(use.pids)
    for process in found.processes:
        if process.pid in pids:
            shares = read_shares(process.environment)
            if shares:
                return shares
    return None


def _container(
    card: str,
    use: ContainerUse,
    found: ProcScan,
    pods: Pods,
    busy: Utilization | None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"containerID": use.container_id}
    named = pods.containers.get(use.container_id)
    if named is not None:
        entry["container"] = named.container
    shares = named.shares if named is not None and named.shares is not None else None
    if shares is None:
        shares = _environment_shares(use, found)
    entry["pids"] = list(use.pids)
    entry["memoryBytes"] = use.memory
    if shares is not None:
        # Shares known, but none of this card: it holds none of it.
        share = shares.get(card, Share())
        entry["memoryShareBytes"] = share.memory
        entry["millicoresShare"] = share.millicores
    entry["engines"] = _engines(use)
    if busy is not None:
        entry["utilization"] = dict(busy.get((card, use.pod_uid, use.container_id), {}))
    entry["complete"] = use.complete
    return entry


def _other(card: CardUse, busy: Utilization | None, whole: bool) -> dict[str, Any]:
    other = card.other
    if other is None:
        # Nothing outside pods: none of the card's memory, when the kernel reports it and
        # every process was read.
        known = card.memory_reported and whole
        other = ContainerUse("", "", (), 0 if known else None, {}, whole)
    entry: dict[str, Any] = {
        "memoryBytes": other.memory,
        "pids": list(other.pids),
        "engines": _engines(other),
    }
    if busy is not None:
        entry["utilization"] = dict(busy.get((card.card, "", ""), {}))
    entry["complete"] = other.complete and whole
    return entry


def _card(
    card: CardUse,
    facts: Card | None,
    found: ProcScan,
    pods: Pods,
    busy: Utilization | None,
    whole: bool,
) -> dict[str, Any]:
    grouped: dict[str, list[ContainerUse]] = {}
    for use in card.containers:
        grouped.setdefault(use.pod_uid, []).append(use)
    listed = []
    for uid, uses in grouped.items():
        pod: dict[str, Any] = {"podUID": uid}
        names = pods.pods.get(uid)
        named = next(
            (pods.containers[u.container_id] for u in uses if u.container_id in pods.containers),
            None,
        )
        if names is None and named is not None:
            names = (named.namespace, named.pod)  # a static pod: its UID is the kubelet's own
        if names is not None:
            pod["namespace"], pod["pod"] = names
        pod["containers"] = [_container(card.card, use, found, pods, busy) for use in uses]
        listed.append(pod)
    entries = [*card.containers, *([card.other] if card.other is not None else [])]
    amounts = [use.memory for use in entries]
    entry: dict[str, Any] = {
        "card": card.card,
        "pciAddress": card.pci_address,
        "driver": facts.driver if facts is not None else "",
        "memoryCapacityBytes": facts.memory if facts is not None and facts.memory else None,
        "memoryReported": card.memory_reported,
        # Not known while some process could not be read: it may hold any of it.
        "memoryBytes": None if None in amounts or not whole else sum(a or 0 for a in amounts),
        "pods": listed,
        "other": _other(card, busy, whole),
    }
    return entry


def build_report(
    found: Usage,
    reading: ProcScan,
    cards: Sequence[Card],
    pods: Pods = NO_PODS,
    busy: Utilization | None = None,
    notes: Sequence[str] = (),
    interval: float | None = None,
) -> dict[str, Any]:
    """The JSON of `--json`, from which the table is drawn too."""
    facts = {card.name: card for card in cards}
    report: dict[str, Any] = {
        "cards": [
            _card(c, facts.get(c.card), reading, pods, busy, found.whole) for c in found.cards
        ],
        "complete": found.complete,
        "notes": [*found.notes, *notes],
    }
    if interval is not None:
        report["intervalSeconds"] = interval
    return report


# ---------------------------------------------------------------- the report, as a table


def memory_text(amount: int | None) -> str:
    """`1.5Gi`, `640Mi`, `0.2Mi`; `n/a` when not known."""
    if amount is None:
        return "n/a"
    if amount >= GI:
        return f"{amount / GI:.1f}Gi"
    if amount == 0:
        return "0"
    if amount < 10 * MI:
        return f"{amount / MI:.1f}Mi"
    return f"{amount / MI:.0f}Mi"


def _name(pod: Mapping[str, Any], container: Mapping[str, Any]) -> str:
    if "namespace" in pod and "container" in container:
        return f"{pod['namespace']}/{pod['pod']}/{container['container']}"
    if "namespace" in pod:
        return f"{pod['namespace']}/{pod['pod']}/{container['containerID'][:12]}"
    return f"{pod['podUID']}/{container['containerID'][:12]}"


def _busy_text(entry: Mapping[str, Any]) -> str:
    shares = entry.get("utilization") or {}
    return " ".join(f"{name} {share * 100:.0f}%" for name, share in sorted(shares.items()))


def _row(name: str, entry: Mapping[str, Any], interval: bool) -> list[str]:
    share = entry.get("memoryShareBytes")
    millicores = entry.get("millicoresShare")
    if not entry.get("complete", True):
        name += " (partial)"
    row = [
        "  " + name,
        ",".join(str(pid) for pid in entry["pids"]) or "-",
        memory_text(entry["memoryBytes"]),
        "-" if share is None else memory_text(share),
        "-" if millicores is None else str(millicores),
    ]
    return [*row, _busy_text(entry)] if interval else row


def render(report: Mapping[str, Any]) -> str:
    """The report as top draws it: a line per card, then a line per container on it."""
    interval = "intervalSeconds" in report
    header = ["CARD / CONTAINER", "PIDS", "MEMORY", "SHARE", "MILLICORES"]
    if interval:
        header.append(f"BUSY (over {report['intervalSeconds']:g}s)")
    rows = [header]
    for card in report["cards"]:
        capacity = card["memoryCapacityBytes"]
        used = memory_text(card["memoryBytes"])
        if capacity is not None:
            of = memory_text(capacity)
            memory = f"{used}/{of}" if card["memoryBytes"] is not None else f"n/a of {of}"
        else:
            memory = used
        title = f"{card['card']} {card['pciAddress']} {card['driver']}".rstrip()
        rows.append([title, "", memory, "", "", *([""] if interval else [])])
        for pod in card["pods"]:
            for container in pod["containers"]:
                rows.append(_row(_name(pod, container), container, interval))
        other = card["other"]
        if other["pids"]:
            rows.append(_row("(outside any pod)", other, interval))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if not report["complete"]:
        lines.append("partial result: what could not be read is said on stderr")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- command line


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--proc-root",
        default="/proc",
        metavar="DIR",
        help="the host's /proc, where the processes' GPU clients and cgroups are read (/proc)",
    )
    parser.add_argument(
        "--sysfs-root",
        default="/sys",
        metavar="DIR",
        help="the sysfs tree the cards are read from (/sys)",
    )
    parser.add_argument(
        "--interval",
        type=_seconds,
        metavar="SECONDS",
        help="read twice, this far apart, and show each container's engines busy in percent",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--kubeconfig",
        "--kubeConfig",
        dest="kubeconfig",
        help="name each container and read each pod's shares from the API server (its pods "
        "on --node-name); without it, containers are shown by pod UID and container id",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME") or None,
        metavar="NAME",
        help="this node's name, whose pods --kubeconfig lists (default: $NODE_NAME)",
    )


def _say(notes: Sequence[str]) -> None:
    for note in notes:
        print(f"gas top: {note}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    try:
        cards = discover_sysfs(args.sysfs_root)
    except NodeError as exc:
        _say([str(exc)])
        return 1
    started = time.monotonic()
    reading = scan(args.proc_root, environment=True)
    if not reading.readable:
        _say(reading.notes)
        return 1
    found = attribute(reading, cards)
    busy = None
    if args.interval is not None:
        time.sleep(args.interval)
        again = time.monotonic()
        second = scan(args.proc_root, environment=True)
        if not second.readable:
            _say(second.notes)
            return 1
        later = attribute(second, cards)
        busy = engine_utilization(found, later, again - started)
        reading, found = second, later
    notes: list[str] = []
    if not cards:
        notes.append(f"no Intel GPU card found under {args.sysfs_root}")
    pods = NO_PODS
    if args.kubeconfig:
        if args.node_name:
            listed, unlisted = read_pods(args.kubeconfig, args.node_name)
            pods, unreadable = index_pods(listed)
            notes += [*unlisted, *unreadable]
        else:
            notes.append("containers not named: no node name (give --node-name or set NODE_NAME)")
    report = build_report(found, reading, cards, pods, busy, notes, args.interval)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(render(report))
    _say(report["notes"])
    return 0
