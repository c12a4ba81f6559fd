"""`/metrics` scrapes written from what they kept: the exposition is byte for byte the one
computed afresh from `Ledger.snapshot()` and `placeable_pods`, whatever changed in between,
and a scrape places pods only on the nodes that changed."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

from prometheus_client import Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from benchmarks.scrape import measure
from benchmarks.workload import make_cluster
from gas.cluster.demo import DemoCluster
from gas.core.allocator import Rejection
from gas.core.holdings import PodHolding, PodObservation
from gas.core.ledger import Ledger
from gas.core.model import I915, NodeGpu
from gas.core.scoring import (
    MEMORY_MAX,
    POD_SIZES,
    PlaceableMemo,
    cluster_placeable,
    placeable_pods,
    size_request,
)
from gas.serving.metrics import Metrics

# ---------------------------------------------------------------- the reference: every
# figure computed afresh from the snapshot at every scrape, as /metrics first did it.


class _ReferenceCards(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._ledger.snapshot()
        labels = ["node", "card", "resource"]
        capacity = GaugeMetricFamily(
            "gas_card_capacity", "Capacity of one card, by resource.", labels=labels
        )
        allocated = GaugeMetricFamily(
            "gas_card_allocated",
            "Amount of one card given out to pods, by resource.",
            labels=labels,
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


class _ReferencePlaceable(Collector):
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


def _with_later_counter(metrics: Metrics) -> Metrics:
    """A family registered after the ledger's, as the app's gas_connections is."""
    later = Counter("gas_later", "Registered after.", ["kind"], registry=metrics.registry)
    later.labels("x").inc(3)
    return metrics


def _timeless(text: bytes) -> bytes:
    """Without the counters' `_created` families: each registry's counters have their own
    creation times."""
    return b"".join(
        line for line in text.splitlines(keepends=True) if b"_created" not in line.split(b"{")[0]
    )


def _reference(ledger: Ledger) -> bytes:
    metrics = Metrics()
    metrics.registry.register(_ReferenceCards(ledger))
    metrics.registry.register(_ReferencePlaceable(ledger))
    return generate_latest(_with_later_counter(metrics).registry)


# ---------------------------------------------------------------- the changes


class _Changes:
    def __init__(self, ledger: Ledger, seed: int) -> None:
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.serial = 0
        self.reserved: list[str] = []
        self.held: list[str] = []

    def uid(self) -> str:
        self.serial += 1
        return f"change-{self.serial}"

    def node(self) -> NodeGpu:
        name = self.rng.choice(self.ledger.node_names())
        node = self.ledger.node(name)
        assert node is not None
        return node

    def reserve(self) -> None:
        node = self.node()
        uid = self.uid()
        request = size_request(node, self.rng.choice(POD_SIZES))
        if not isinstance(
            self.ledger.reserve_placement(uid, "ns", uid, request, node.name), Rejection
        ):
            self.reserved.append(uid)

    def settle(self) -> None:
        if self.reserved:
            uid = self.reserved.pop(self.rng.randrange(len(self.reserved)))
            if self.rng.random() < 0.5:
                self.ledger.commit(uid, landed=self.rng.random() < 0.8)
                self.held.append(uid)
            else:
                self.ledger.cancel(uid)

    def observe(self) -> None:
        """A pod the watch shows on cards it could not read: some blocked, or the node."""
        node = self.node()
        uid = self.uid()
        cards = frozenset(self.rng.sample(node.cards, 1)) if node.cards else frozenset()
        whole = not cards or self.rng.random() < 0.3
        holding = PodHolding(uid, "ns", uid, node.name, (), {}, cards, whole)
        self.ledger.observe(PodObservation(uid, "ns", uid, False, holding))
        self.held.append(uid)

    def forget(self) -> None:
        if self.held:
            self.ledger.forget(self.held.pop(self.rng.randrange(len(self.held))))

    def set_node(self) -> None:
        node = self.node()
        capacity = dict(node.capacity)
        capacity[MEMORY_MAX] = capacity.get(MEMORY_MAX, 1000) * self.rng.choice((1, 2))
        self.ledger.set_node(dataclasses.replace(node, capacity=capacity))

    def same_node_again(self) -> None:
        """An equal node object: the ledger keeps the one it has."""
        node = self.node()
        self.ledger.set_node(dataclasses.replace(node))

    def add_node(self) -> None:
        # Label values the text format must escape.
        name = f'odd"node\\{self.serial}\n'
        self.serial += 1
        capacity = {I915: 2, MEMORY_MAX: 16 * 2**30}
        self.ledger.set_node(NodeGpu(name, ("card0", "card1"), capacity))

    def remove_node(self) -> None:
        if len(self.ledger.node_names()) > 3:
            self.ledger.remove_node(self.node().name)

    def any(self) -> None:
        change = self.rng.choices(
            (
                self.reserve,
                self.settle,
                self.observe,
                self.forget,
                self.set_node,
                self.same_node_again,
                self.add_node,
                self.remove_node,
            ),
            weights=(6, 5, 2, 3, 1, 1, 1, 1),
        )[0]
        change()


def _loaded(nodes: int) -> Ledger:
    ledger = Ledger()
    DemoCluster(ledger, make_cluster(nodes, 0.5).as_demo_file()).start()
    return ledger


# ---------------------------------------------------------------- tests


def test_exposition_is_that_of_the_snapshot_after_every_change() -> None:
    ledger = _loaded(25)
    metrics = Metrics()
    metrics.watch_ledger(ledger)
    _with_later_counter(metrics)
    changes = _Changes(ledger, seed=7)
    for step in range(300):
        for _ in range(changes.rng.randint(0, 3)):
            changes.any()
        assert _timeless(metrics.exposition()) == _timeless(_reference(ledger)), f"step {step}"
    text = metrics.exposition().decode()
    assert 'node="odd\\"node\\\\' in text  # the escaped names were scraped
    assert "gas_later_total" in text.split("gas_placeable_pods")[-1]


def test_the_registry_still_gives_the_card_samples() -> None:
    """Readers other than `exposition` (a plain `generate_latest`, `get_sample_value`)
    see the same per-card samples."""
    ledger = _loaded(5)
    metrics = Metrics()
    metrics.watch_ledger(ledger)
    written = metrics.exposition()
    assert generate_latest(metrics.registry) == written
    assert _timeless(written) == _timeless(_reference_plain(ledger))
    name = ledger.node_names()[0]
    node = ledger.node(name)
    assert node is not None
    labels = {"node": name, "card": node.cards[0], "resource": I915}
    assert metrics.registry.get_sample_value("gas_card_capacity", labels) == node.capacity[I915]


def _reference_plain(ledger: Ledger) -> bytes:
    metrics = Metrics()
    metrics.registry.register(_ReferenceCards(ledger))
    metrics.registry.register(_ReferencePlaceable(ledger))
    return generate_latest(metrics.registry)


def test_a_scrape_places_pods_only_on_nodes_that_changed() -> None:
    ledger = _loaded(20)
    metrics = Metrics()
    metrics.watch_ledger(ledger)
    metrics.exposition()
    assert metrics.placeable.computed == 20
    metrics.exposition()
    assert metrics.placeable.computed == 20  # nothing changed, nothing placed

    changes = _Changes(ledger, seed=3)
    node = changes.node()
    request = size_request(node, POD_SIZES[0])
    assert not isinstance(ledger.reserve_placement("p", "ns", "p", request, node.name), Rejection)
    metrics.exposition()
    assert metrics.placeable.computed == 21  # that node only
    ledger.commit("p")  # the state changes, the usage does not
    metrics.exposition()
    assert metrics.placeable.computed == 21
    # A relist of the same nodes, as new objects: nothing to compute again.
    relisted = [dataclasses.replace(n) for n in map(ledger.node, ledger.node_names()) if n]
    ledger.replace_nodes(relisted)
    metrics.exposition()
    assert metrics.placeable.computed == 21

    ledger.set_node(dataclasses.replace(node))  # equal: the ledger keeps its own object
    changes.set_node()  # a new capacity: the node is computed again
    changes.observe()  # blocked cards
    ledger.remove_node(ledger.node_names()[-1])
    metrics.exposition()
    assert metrics.placeable.computed in (22, 23)  # one node changed twice counts once
    assert _timeless(metrics.exposition()) == _timeless(_reference_plain(ledger))


def test_the_memo_answers_as_placeable_pods() -> None:
    ledger = _loaded(12)
    memo = PlaceableMemo()
    changes = _Changes(ledger, seed=11)
    for _ in range(40):
        changes.any()
        figures = ledger.figures()
        expected = placeable_pods(
            figures.nodes.values(), figures.usage, figures.blocked, figures.blocking
        )
        assert (
            memo.placeable_pods(
                figures.nodes.values(), figures.usage, figures.blocked, figures.blocking
            )
            == expected
        )
    figures = ledger.figures()
    before = memo.computed
    memo.placeable_pods(figures.nodes.values(), figures.usage, figures.blocked, figures.blocking)
    assert memo.computed == before


def test_the_scrape_benchmark_reports_its_figures() -> None:
    figures = measure(8, binds=3)
    # Three repeats of three binds each, every one landing on a half-full cluster.
    assert figures["nodes"] == 8 and figures["binds"] == 3 and figures["bound"] == 9
    assert isinstance(figures["first_ms"], float) and isinstance(figures["after_binds_ms"], float)
