"""Each container's real use of its cards, beside its share, every `--usage-interval`
seconds, in both agents: the metrics, the over-use state, its Events and, where the
operator asks for it, evictions.

A round scans the node's processes (`gas.host.proc`), attributes their DRM clients to
cards and containers (`gas.host.usage`), names each container and finds its share (the
agent's `holder`: from the pod in the extender way, from the container's own environment
in the DRA way), and steps the over-use state (`gas.host.overuse`). What could not be read
is said once, until it changes, and never turned into a zero: a container whose use is
unknown has no use series, and is never judged.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gas.core.shares import Share, read_shares
from gas.host import proc, usage
from gas.host.cards import Card
from gas.host.cgroups import PodContainer
from gas.host.containers import Holder
from gas.host.overuse import EVICT, Eviction, Exceeding, Observation, OverUse, card_states

_DIGITS = re.compile(r"[0-9]+")
log = logging.getLogger(__name__)

LABELS = ("namespace", "pod", "container", "card")
USAGE_PATH = "/usage"
"""Where an agent's metrics port answers the latest round as JSON (`gas inspect` reads it
through the API server's proxy)."""


@dataclass(frozen=True)
class Seen:
    """One container's use of one card in the latest round, with its holder and share."""

    holder: Holder
    container_id: str
    card: str
    memory: int | None
    share: Share | None
    engines: Mapping[str, float]


def fresh_notes(said: frozenset[str], notes: Iterable[str]) -> tuple[list[str], frozenset[str]]:
    """The notes not said in the last round, and what is said now. A note is told from
    another by its words, not its counts: "3 process(es) ... permission denied" in one
    round and "4 process(es)" in the next is one thing, said once until it goes away."""
    kinds = {_DIGITS.sub("#", note): note for note in notes}
    return [note for kind, note in kinds.items() if kind not in said], frozenset(kinds)


class UsageMetrics(Collector):
    """The latest round's per-container series (a pod gone is gone from them), and the
    counters of what was said and done."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._latest: list[Seen] = []
        self._lock = threading.Lock()
        registry.register(self)
        self.exceeded = Counter(
            "gas_gpu_share_exceeded_total",
            "Containers found over their share of a card's memory past the grace period",
            ["card"],
            registry=registry,
        )
        self.evictions = Counter(
            "gas_gpu_overuse_evictions_total",
            "Evictions asked for over-use, by card and result (evicted, refused, failed)",
            ["card", "result"],
            registry=registry,
        )
        self.scans = Histogram(
            "gas_gpu_usage_scan_seconds",
            "CPU time of one round's scan of the node's processes",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=registry,
        )

    def set(self, seen: list[Seen]) -> None:
        with self._lock:
            self._latest = seen

    def latest(self) -> list[Seen]:
        with self._lock:
            return list(self._latest)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        memory = GaugeMetricFamily(
            "gas_container_gpu_memory_bytes",
            "Device memory a container's DRM clients hold on a card",
            labels=LABELS,
        )
        share = GaugeMetricFamily(
            "gas_container_gpu_memory_share_bytes",
            "A container's share of a card's memory",
            labels=LABELS,
        )
        millicores = GaugeMetricFamily(
            "gas_container_gpu_millicores_share",
            "A container's share of a card's compute, in millicores",
            labels=LABELS,
        )
        engines = GaugeMetricFamily(
            "gas_container_gpu_engine_utilization",
            "The share of a card's engines of a class a container kept busy (0 to 1)",
            labels=(*LABELS, "engine"),
        )
        for seen in self.latest():
            h = seen.holder
            values = [h.namespace, h.pod, h.container, seen.card]
            if seen.memory is not None:
                memory.add_metric(values, seen.memory)
            if seen.share is not None:
                share.add_metric(values, seen.share.memory)
                millicores.add_metric(values, seen.share.millicores)
            for engine, busy in sorted(seen.engines.items()):
                engines.add_metric([*values, engine], busy)
        yield from (memory, share, millicores, engines)


Announce = Callable[[Holder, str, str], None]
"""`announce(holder, reason, message)`: a Warning Event on the holder's pod."""
Evict = Callable[[Eviction], str]
"""Ask the API server to evict; the result: `evicted`, `refused` (a PodDisruptionBudget),
`gone` or `failed`, with the reason after a colon."""


class UsageWatch(threading.Thread):
    def __init__(
        self,
        *,
        proc_root: str,
        interval: float,
        cards: Callable[[], Sequence[Card]],
        holder: Callable[[str, str], Holder | None],
        overuse: OverUse,
        metrics: UsageMetrics,
        announce: Announce,
        evict: Evict,
        stop: threading.Event,
        environment: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="gpu-usage", daemon=True)
        self.proc_root = proc_root
        self.interval = interval
        self._cards = cards
        self._holder = holder
        self.overuse = overuse
        self.metrics = metrics
        self._announce = announce
        self._evict = evict
        self._stop_event = stop
        self._environment = environment
        self._clock = clock
        self._before: tuple[float, usage.Usage] | None = None
        self._said: frozenset[str] = frozenset()
        self.rounds = 0

    def answer(self, node: str) -> Callable[[], tuple[int, str, bytes]]:
        """The agent's `/usage` answer."""
        return lambda: usage_answer(node, self.metrics)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.round()
            except Exception:  # the next round tries again
                log.exception("reading the GPU use failed")

    def round(self) -> list[Seen]:
        # The thread's own CPU: the agent's other threads (gRPC, metrics) are not the scan's.
        started = time.thread_time()
        scan = proc.scan(self.proc_root, environment=self._environment, skip=self._skip)
        cards = list(self._cards())
        found = usage.attribute(scan, cards)
        self.metrics.scans.observe(time.thread_time() - started)
        now = self._clock()
        busy = self._utilization(now, found)
        self._say(found.notes)
        seen = list(self._seen(scan, found, busy))
        self.metrics.set(seen)
        capacity = {card.name: card.memory for card in cards}
        step = self.overuse.step(now, _observations(seen), card_states(capacity, _held(found)))
        for exceeding in step.exceeding:
            self._exceeded(now, exceeding)
        for observation in step.ended:
            log.info(
                "container %s of pod %s/%s is back within its share of %s",
                observation.container,
                observation.namespace,
                observation.pod,
                observation.card,
            )
        for eviction in step.evictions:
            self._evicting(eviction)
        self.rounds += 1
        return seen

    def _skip(self, owner: PodContainer) -> bool:
        holder = self._holder(owner.pod_uid, owner.container_id)
        return holder is not None and not holder.devices

    def _utilization(
        self, now: float, found: usage.Usage
    ) -> dict[tuple[str, str, str], dict[str, float]]:
        before, self._before = self._before, (now, found)
        if before is None:
            return {}
        return usage.engine_utilization(before[1], found, now - before[0])

    def _say(self, notes: tuple[str, ...]) -> None:
        fresh, self._said = fresh_notes(self._said, notes)
        for note in fresh:
            log.warning("GPU use: %s", note)

    def _seen(
        self,
        scan: proc.ProcScan,
        found: usage.Usage,
        busy: Mapping[tuple[str, str, str], Mapping[str, float]],
    ) -> Iterator[Seen]:
        environments = _environments(scan) if self._environment else {}
        for card in found.cards:
            for used in card.containers:
                holder = self._holder(used.pod_uid, used.container_id)
                if holder is None:
                    continue  # a container the API server does not name (yet)
                shares = holder.shares
                if shares is None:
                    shares = read_shares(environments.get((used.pod_uid, used.container_id), {}))
                yield Seen(
                    holder,
                    used.container_id,
                    card.card,
                    used.memory if used.complete else None,
                    shares.get(card.card),
                    busy.get((card.card, used.pod_uid, used.container_id), {}),
                )

    def _exceeded(self, now: float, exceeding: Exceeding) -> None:
        o = exceeding.observation
        holder = Holder(o.namespace, o.pod, o.pod_uid, o.container)
        message = exceeding.describe(now)
        if self.overuse.policy == EVICT:
            message += "; it is evicted while the card is contended"
        log.warning("pod %s/%s: %s", o.namespace, o.pod, message)
        self.metrics.exceeded.labels(o.card).inc()
        self._announce(holder, "GPUShareExceeded", message)

    def _evicting(self, eviction: Eviction) -> None:
        result = self._evict(eviction)
        outcome, _, why = result.partition(":")
        self.metrics.evictions.labels(eviction.card, outcome).inc()
        holder = Holder(eviction.namespace, eviction.pod, eviction.pod_uid, "")
        if outcome == "evicted":
            message = f"evicted through the Eviction API: {eviction.reason}"
        elif outcome == "refused":
            message = f"not evicted, the Eviction API refused it ({why.strip()}): {eviction.reason}"
        else:
            message = f"not evicted ({why.strip() or outcome}): {eviction.reason}"
        log.warning("pod %s/%s: %s", eviction.namespace, eviction.pod, message)
        if outcome != "gone":
            self._announce(holder, "GPUShareExceeded", message)


def _environments(scan: proc.ProcScan) -> dict[tuple[str, str], Mapping[str, str]]:
    """Each container's GAS_* environment, from the first of its processes that has one."""
    found: dict[tuple[str, str], Mapping[str, str]] = {}
    for process in scan.processes:
        if process.owner is not None and process.environment:
            found.setdefault(
                (process.owner.pod_uid, process.owner.container_id), process.environment
            )
    return found


def _observations(seen: Iterable[Seen]) -> list[Observation]:
    return [
        Observation(
            s.card,
            s.holder.pod_uid,
            s.container_id,
            s.holder.namespace,
            s.holder.pod,
            s.holder.container,
            s.memory,
            # A share of no memory (a pod that asked only for a card) is not one to judge.
            s.share.memory if s.share is not None and s.share.memory > 0 else None,
        )
        for s in seen
    ]


def _held(found: usage.Usage) -> dict[str, int | None]:
    """Per card, what all its clients hold (pods' and others'); None where some client's
    memory could not be read, and contention cannot be told."""
    held: dict[str, int | None] = {}
    for card in found.cards:
        entries = [*card.containers, *([card.other] if card.other is not None else [])]
        if not card.memory_reported or not all(
            e.complete and e.memory is not None for e in entries
        ):
            held[card.card] = None
        else:
            held[card.card] = sum(e.memory or 0 for e in entries)
    return held


def usage_answer(node: str, metrics: UsageMetrics) -> tuple[int, str, bytes]:
    """The agent's `/usage`: the node and the latest round's containers."""
    body = {"node": node, "containers": describe_seen(metrics.latest())}
    return 200, "application/json", json.dumps(body, sort_keys=True).encode()


def describe_seen(seen: Iterable[Seen]) -> list[dict[str, Any]]:
    """The latest round as JSON, one entry per container and card."""
    return [
        {
            "namespace": s.holder.namespace,
            "pod": s.holder.pod,
            "podUID": s.holder.pod_uid,
            "container": s.holder.container,
            "card": s.card,
            "memoryBytes": s.memory,
            "memoryShareBytes": s.share.memory if s.share is not None else None,
            "millicoresShare": s.share.millicores if s.share is not None else None,
            "engines": dict(s.engines),
        }
        for s in seen
    ]


def watch_usage(
    args: Any,
    *,
    core: Any,
    node: str,
    component: str,
    cards: Callable[[], Sequence[Card]],
    holder: Callable[[str, str], Holder | None],
    registry: CollectorRegistry,
    sender: Any,
    stop: threading.Event,
    environment: bool,
) -> UsageWatch | None:
    """The agent's usage watch from its flags (`gas.host.flags.add_usage`), not started;
    None when `--usage-interval` is 0. `core` is its RawCoreV1Api (evictions), `sender`
    its EventSender."""
    from gas.host.overuse_calls import announcer, evictor

    if args.usage_interval <= 0:
        return None
    return UsageWatch(
        proc_root=args.proc_root,
        interval=args.usage_interval,
        cards=cards,
        holder=holder,
        overuse=OverUse(args.overuse_grace, args.overuse_policy),
        metrics=UsageMetrics(registry),
        announce=announcer(sender, component, node),
        evict=evictor(core),
        stop=stop,
        environment=environment,
    )
