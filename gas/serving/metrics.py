"""Prometheus metrics: request latency and outcomes, rejection reasons, per-card allocation.

Each app has its own registry, so several apps in one process (tests) do not collide.
Per-card gauges are computed from the ledger at scrape time rather than kept up to date on
every change: scrapes are rare, ledger changes are not.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gas.cluster.counters import SyncCounters
from gas.core.ledger import Ledger
from gas.core.scoring import POD_SIZES, cluster_placeable, placeable_pods

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
        self.registry.register(_LedgerCollector(ledger))
        self.registry.register(_PlaceableCollector(ledger))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _LedgerCollector(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._ledger.snapshot()
        capacity = GaugeMetricFamily(
            "gas_card_capacity",
            "Capacity of one card, by resource.",
            labels=["node", "card", "resource"],
        )
        allocated = GaugeMetricFamily(
            "gas_card_allocated",
            "Amount of one card given out to pods, by resource.",
            labels=["node", "card", "resource"],
        )
        pods = GaugeMetricFamily(
            "gas_ledger_pods", "Pods the ledger holds cards for, by state.", labels=["state"]
        )
        for node, info in snapshot["nodes"].items():
            used = snapshot["usage"].get(node, {})
            for card in info["cards"]:
                for resource, amount in info["capacity"].items():
                    capacity.add_metric([node, card, resource], amount)
                    allocated.add_metric(
                        [node, card, resource], used.get(card, {}).get(resource, 0)
                    )
        states: dict[str, int] = {}
        for entry in snapshot["pods"].values():
            states[entry["state"]] = states.get(entry["state"], 0) + 1
        for state in ("reserved", "pending", "bound"):
            pods.add_metric([state], states.get(state, 0))
        yield capacity
        yield allocated
        yield pods


class _PlaceableCollector(Collector):
    """`gas_placeable_pods{size}`: fragmentation, from the ledger at scrape time."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._ledger.snapshot()
        blocked: dict[str, set[str]] = {}
        blocked_nodes = set()
        for entry in snapshot["pods"].values():
            blocked.setdefault(entry["node"], set()).update(entry["blocked_cards"])
            if entry["blocks_node"]:
                blocked_nodes.add(entry["node"])
        nodes = [n for n in map(self._ledger.node, snapshot["nodes"]) if n is not None]
        per_node = placeable_pods(
            nodes,
            snapshot["usage"],
            {name: frozenset(cards) for name, cards in blocked.items()},
            frozenset(blocked_nodes),
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
