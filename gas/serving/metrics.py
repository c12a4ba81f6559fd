"""Prometheus metrics: request latency and outcomes, rejection reasons, per-card allocation.

Each app has its own registry, so several apps in one process (tests) do not collide.
Per-card gauges are computed from the ledger at scrape time rather than kept up to date on
every change: scrapes are rare, ledger changes are not. What a scrape computes per node (its
card lines, its placeable pods) is kept until the node or its book changes, so a scrape
costs about what changed since the last one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gas.cluster.counters import SyncCounters
from gas.core.ledger import Ledger
from gas.core.ledger_views import LedgerFigures
from gas.core.model import NodeGpu
from gas.core.scoring import POD_SIZES, PlaceableMemo, cluster_placeable

# Filter and bind answer in milliseconds; the scheduler's timeout is seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gas_requests",
            "Extender requests by verb and outcome.",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gas_request_duration_seconds",
            "Time to answer an extender request, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rejections = Counter(
            "gas_node_rejections",
            "Nodes refused to a pod by filter or bind, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.unscored_binds = Counter(
            "gas_unscored_binds",
            "Pods bound whose placement policy scores nodes (binpack, spread) when "
            "kube-scheduler asked gas for no scores after gas's filter passed two or more "
            "nodes: the policy chose the cards, not the node. Register the prioritize verb.",
            ["policy"],
            registry=self.registry,
        )
        # The cluster side's counters, in this registry.
        self.sync = SyncCounters(self.registry)
        self.ledger_rebuilds = self.sync.ledger_rebuilds
        self.watch_restarts = self.sync.watch_restarts
        self.pending_released = self.sync.pending_released
        self.preempt_nodes = Counter(
            "gas_preempt_nodes",
            "Candidate nodes of preempt calls by verdict: as_proposed, trimmed (victims "
            "whose cards the pod does not need spared), extended (lower-priority GPU pods "
            "added where the proposed victims free no cards that fit the pod) or dropped (no "
            "victim set frees cards that fit the pod).",
            ["verdict"],
            registry=self.registry,
        )

    def watch_ledger(self, ledger: Ledger) -> None:
        collector = _LedgerCollector(ledger)
        self.registry.register(collector)
        # Its `computed` count tells how many nodes the scrapes placed pods on.
        self.placeable = collector.placeable

    def exposition(self) -> bytes:
        """The registry in the text format, as `generate_latest` writes it, but for the
        per-card families, whose lines come already written."""
        parts: list[bytes] = []
        run: list[Metric] = []
        for family in self.registry.collect():
            if isinstance(family, _WrittenGauge):
                parts += (generate_latest(_Families(run)), family.text)
                run = []
            else:
                run.append(family)
        parts.append(generate_latest(_Families(run)))
        return b"".join(parts)


class _LedgerCollector(Collector):
    """The families computed from the ledger at scrape time, from one copy of it
    (`Ledger.figures`). Each node's card lines and placeable counts are kept with what
    they were made from and made again only for the nodes that changed since: a scrape at
    thousands of nodes then costs what changed, not the whole cluster.

    Two scrapes may run at once: each replaces the kept lines whole with its own, and a
    node whose kept inputs differ from a scrape's is written again, so a race costs work,
    never a wrong line."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._written: dict[str, _NodeLines] = {}
        self.placeable = PlaceableMemo(POD_SIZES)

    def collect(self) -> Iterator[Metric]:
        figures = self._ledger.figures()
        known = self._written
        written: dict[str, _NodeLines] = {}
        for name, node in figures.nodes.items():
            used = figures.usage.get(name, {})
            lines = known.get(name)
            if lines is None or lines.node is not node:
                capacity = _card_lines(_CAPACITY, node, None)
                lines = _NodeLines(node, used, capacity, _card_lines(_ALLOCATED, node, used))
            elif lines.usage != used:
                lines = dataclasses.replace(
                    lines, usage=used, allocated=_card_lines(_ALLOCATED, node, used)
                )
            written[name] = lines
        self._written = written
        yield _WrittenGauge(
            _CAPACITY,
            b"".join(lines.capacity for lines in written.values()),
            lambda: _card_samples(_CAPACITY, figures, allocated=False),
        )
        yield _WrittenGauge(
            _ALLOCATED,
            b"".join(lines.allocated for lines in written.values()),
            lambda: _card_samples(_ALLOCATED, figures, allocated=True),
        )
        pods = GaugeMetricFamily(
            "gas_ledger_pods", "Pods the ledger holds cards for, by state.", labels=["state"]
        )
        for state in ("reserved", "pending", "bound"):
            pods.add_metric([state], figures.pods.get(state, 0))
        yield pods
        per_node = self.placeable.placeable_pods(
            figures.nodes.values(), figures.usage, figures.blocked, figures.blocking
        )
        gauge = GaugeMetricFamily(
            "gas_placeable_pods",
            "More pods of a common size that the cluster could still place, each size "
            "counted alone (quarter-card, half-card and one-card: that share of one card's "
            "memory.max; two-cards: two whole cards).",
            labels=["size"],
        )
        for size, count in cluster_placeable(per_node, POD_SIZES).items():
            gauge.add_metric([size], count)
        yield gauge


# Untyped in prometheus_client; the value as the text format writes it.
_go_float: Callable[[float], str] = floatToGoString
_CAPACITY = ("gas_card_capacity", "Capacity of one card, by resource.")
_ALLOCATED = ("gas_card_allocated", "Amount of one card given out to pods, by resource.")


@dataclass(frozen=True)
class _NodeLines:
    """One node's lines of the two per-card families, and what they were written from."""

    node: NodeGpu
    usage: Mapping[str, Mapping[str, int]]
    capacity: bytes
    allocated: bytes


def _card_lines(
    family: tuple[str, str], node: NodeGpu, usage: Mapping[str, Mapping[str, int]] | None
) -> bytes:
    """The node's samples of a per-card family as `generate_latest` writes them: labels
    in name order (card, node, resource), values through `floatToGoString`. `usage` None:
    the capacities."""
    name = family[0]
    node_label = _label_value(node.name)
    lines = []
    for card in node.cards:
        card_label = _label_value(card)
        used = usage.get(card, {}) if usage is not None else {}
        for resource, amount in node.capacity.items():
            value = amount if usage is None else used.get(resource, 0)
            lines.append(
                f'{name}{{card="{card_label}",node="{node_label}",'
                f'resource="{_label_value(resource)}"}} {_go_float(value)}\n'
            )
    return "".join(lines).encode()


def _label_value(value: str) -> str:
    """A label value escaped as the text format wants it (as `generate_latest` does)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _card_samples(family: tuple[str, str], figures: LedgerFigures, allocated: bool) -> list[Sample]:
    """The family's samples, for readers of the registry other than `exposition`."""
    gauge = GaugeMetricFamily(*family, labels=["node", "card", "resource"])
    for name, node in figures.nodes.items():
        used = figures.usage.get(name, {})
        for card in node.cards:
            for resource, amount in node.capacity.items():
                value = used.get(card, {}).get(resource, 0) if allocated else amount
                gauge.add_metric([name, card, resource], value)
    return gauge.samples


class _WrittenGauge(Metric):
    """A gauge family whose samples' lines are written already (`text`, with its HELP and
    TYPE lines); its samples are made only when read, by other readers of the registry
    (`CollectorRegistry.get_sample_value`, a plain `generate_latest`)."""

    def __init__(
        self, family: tuple[str, str], lines: bytes, samples: Callable[[], list[Sample]]
    ) -> None:
        super().__init__(*family, "gauge")
        self._make: Callable[[], list[Sample]] | None = samples
        name, documentation = family
        help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
        self.text = f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode() + lines

    @property
    def samples(self) -> list[Sample]:
        if self._make is not None:
            self._made = self._make()
            self._make = None
        return self._made

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._made = value
        self._make = None


class _Families(Collector):
    """Families already collected, for `generate_latest`."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families
