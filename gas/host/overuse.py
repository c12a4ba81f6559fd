"""When a container's use of a card's memory is over its share, and what is done about it:
no I/O, no clock of its own.

Each round the agent observes, per container and card, the device memory the container's
clients hold and its share of the card (None where it holds no gas share there). A
container is **over** while its use is above its share. Over for longer than the grace
period, it is **exceeding**: said once per episode (an Event, a counter, a log line). With
the `evict` policy an exceeding pod is evicted, but only while its card is **contended**
(all the card's clients together hold more than the card has to give), and only the pod
most over its share on that card (by bytes) in a round; the next round looks again.

Never acted on: a container within its share, one that holds no gas share on the card
(its use is shown, not judged), and anything on partial data: a container whose use could
not be read whole, or a card whose contention cannot be told (some client's memory not
read). Compute use is never judged: the kernel has no per-client throttle to enforce it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

REPORT = "report"
EVICT = "evict"
POLICIES = (REPORT, EVICT)


@dataclass(frozen=True)
class Observation:
    """One container's use of one card in one round."""

    card: str
    pod_uid: str
    container_id: str
    namespace: str
    pod: str
    container: str
    used: int | None
    """Device memory bytes; None: not read (partial, or not reported by the kernel)."""
    share: int | None
    """Its share of the card's memory in bytes; None: no gas share on this card."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.card, self.pod_uid, self.container_id)

    @property
    def over(self) -> bool:
        return self.used is not None and self.share is not None and self.used > self.share


@dataclass(frozen=True)
class CardState:
    """What the card has to give, and what all its clients hold (None: not read whole)."""

    card: str
    capacity: int
    used: int | None

    @property
    def contended(self) -> bool:
        return self.used is not None and self.capacity > 0 and self.used > self.capacity


@dataclass(frozen=True)
class Exceeding:
    """A container over its share for longer than the grace period."""

    observation: Observation
    since: float

    def describe(self, now: float) -> str:
        o = self.observation
        assert o.used is not None and o.share is not None
        return (
            f"container {o.container} uses {_bytes(o.used)} of {o.card}'s memory, over its "
            f"share of {_bytes(o.share)} for {now - self.since:.0f}s"
        )


@dataclass(frozen=True)
class Eviction:
    """The pod to evict for a contended card."""

    card: str
    namespace: str
    pod: str
    pod_uid: str
    reason: str


@dataclass
class Round:
    """What one round decided."""

    exceeding: list[Exceeding] = field(default_factory=list)
    """Containers that became exceeding in this round (each said once per episode)."""
    ended: list[Observation] = field(default_factory=list)
    """Containers whose episode ended (back within their share, or gone)."""
    evictions: list[Eviction] = field(default_factory=list)


@dataclass
class OverUse:
    grace: float
    policy: str = REPORT
    since: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """Key -> when it was first seen over, while it stays over."""
    said: set[tuple[str, str, str]] = field(default_factory=set)
    """Keys whose episode has been reported."""
    evicting: dict[str, float] = field(default_factory=dict)
    """Pod UID -> when its eviction was asked for (not asked again within the grace)."""

    def step(
        self, now: float, observations: Sequence[Observation], cards: Iterable[CardState]
    ) -> Round:
        result = Round()
        seen = {o.key: o for o in observations}
        for key in list(self.since):
            current = seen.get(key)
            if current is None or not current.over:
                del self.since[key]
                if key in self.said:
                    self.said.discard(key)
                    if current is not None:
                        result.ended.append(current)
        for observation in observations:
            if not observation.over:
                continue
            first = self.since.setdefault(observation.key, now)
            if now - first >= self.grace and observation.key not in self.said:
                self.said.add(observation.key)
                result.exceeding.append(Exceeding(observation, first))
        self.evicting = {u: t for u, t in self.evicting.items() if now - t < self.grace}
        if self.policy == EVICT:
            result.evictions = self._evictions(now, observations, cards)
        return result

    def _evictions(
        self, now: float, observations: Sequence[Observation], cards: Iterable[CardState]
    ) -> list[Eviction]:
        by_card: dict[str, list[Observation]] = {}
        for o in observations:
            if o.key in self.said and o.over:
                by_card.setdefault(o.card, []).append(o)
        chosen = []
        for state in cards:
            candidates = [o for o in by_card.get(state.card, []) if o.pod_uid not in self.evicting]
            if not state.contended or not candidates:
                continue
            excess: dict[str, int] = {}
            for o in candidates:
                assert o.used is not None and o.share is not None
                excess[o.pod_uid] = excess.get(o.pod_uid, 0) + o.used - o.share
            pod_uid = max(sorted(excess), key=lambda uid: excess[uid])
            first = next(o for o in candidates if o.pod_uid == pod_uid)
            assert state.used is not None
            self.evicting[pod_uid] = now
            chosen.append(
                Eviction(
                    state.card,
                    first.namespace,
                    first.pod,
                    pod_uid,
                    f"{state.card} is contended ({_bytes(state.used)} held of "
                    f"{_bytes(state.capacity)}) and pod {first.namespace}/{first.pod} is the "
                    f"most over its share there, by {_bytes(excess[pod_uid])}",
                )
            )
        return chosen


def card_states(capacity: Mapping[str, int], used: Mapping[str, int | None]) -> list[CardState]:
    return [CardState(card, capacity[card], used.get(card)) for card in sorted(capacity)]


def _bytes(amount: int) -> str:
    for unit, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if amount >= size:
            value = amount / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{amount}B"
