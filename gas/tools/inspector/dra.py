"""The cards of the nodes `gas dra` serves, as kube-scheduler keeps their books: no I/O.

On a DRA node no pod annotation says who holds a card. The books are the ResourceSlices
of the driver (`gpu.gas.intel.com`: each card a device with its capacities) and the
allocated ResourceClaims (`status.allocation.devices.results`: per result the pool, the
card, its `shareID` and its `consumedCapacity`; `status.reservedFor`: the pods using the
claim). A card's consumed amount is the sum of the `consumedCapacity` of every result on
it; kube-scheduler never lets that pass the card's capacity, so a card over capacity is a
problem (a slice rewritten smaller under claims already placed, or a hand-made claim).

Only the newest generation of a pool counts, as for kube-scheduler: slices of an older
generation are what the driver is replacing. A result on a card no current slice
publishes is shown under its pool with no capacity and reported: the card went away (or
the pool was rewritten without it) while a claim still holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gas.core.dra_claims import CAPACITY_MEMORY as MEMORY
from gas.core.dra_claims import CAPACITY_MILLICORES as MILLICORES
from gas.core.dra_claims import CAPACITY_TILES as TILES
from gas.core.dra_claims import DRIVER
from gas.core.quantity import QuantityError, format_quantity, parse_quantity

CAPACITY_ORDER = (MEMORY, MILLICORES, TILES)


@dataclass(frozen=True)
class DraShare:
    """One allocation result on a card: the claim, its request, the pods it is reserved
    for, its shareID (None for a card given whole) and what it consumes. An
    administrator's access (`adminAccess`: a monitoring pod's) is shown but consumes
    nothing of the card's books, as kube-scheduler counts it."""

    claim: str
    request: str
    pods: tuple[str, ...]
    share_id: str | None
    consumed: Mapping[str, int]
    admin: bool = False


@dataclass
class DraCard:
    node: str
    pool: str
    name: str
    published: bool
    """False: a claim holds it but no current slice of the pool publishes it."""
    capacity: dict[str, int] = field(default_factory=dict)
    shares: list[DraShare] = field(default_factory=list)
    shareable: bool = True
    """False: published whole (one claim at a time)."""
    taints: tuple[str, ...] = ()
    """`value:effect` of each taint the slice puts on it (an unhealthy card)."""

    @property
    def consumed(self) -> dict[str, int]:
        sums = dict.fromkeys(self.capacity, 0)
        for share in self.shares:
            if share.admin:
                continue
            for name, amount in share.consumed.items():
                sums[name] = sums.get(name, 0) + amount
        return sums

    @property
    def free(self) -> dict[str, int]:
        consumed = self.consumed
        return {name: value - consumed.get(name, 0) for name, value in self.capacity.items()}

    @property
    def over_capacity(self) -> list[str]:
        """The capacities whose consumed sum passes the card's value."""
        return [n for n, used in self.consumed.items() if used > self.capacity.get(n, 0)]

    @property
    def claims(self) -> list[str]:
        return sorted({share.claim for share in self.shares})

    @property
    def pods(self) -> list[str]:
        return sorted({pod for share in self.shares for pod in share.pods})


@dataclass(frozen=True)
class DraFinding:
    kind: str  # "over_capacity", "unpublished", "unreadable"
    message: str
    node: str | None = None
    card: str | None = None
    claim: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node": self.node,
            "card": self.card,
            "claim": self.claim,
            "message": self.message,
        }


@dataclass
class DraReport:
    cards: list[DraCard]
    problems: list[DraFinding]
    claims: int
    """Allocated claims holding at least one of the driver's cards (on the nodes shown)."""

    @property
    def nodes(self) -> list[str]:
        return sorted({card.node for card in self.cards})

    @property
    def capacities(self) -> list[str]:
        names = {name for card in self.cards for name in card.capacity}
        names |= {name for card in self.cards for s in card.shares for name in s.consumed}
        return sorted(names, key=capacity_order)


def capacity_order(name: str) -> tuple[int, str]:
    return (CAPACITY_ORDER.index(name), name) if name in CAPACITY_ORDER else (99, name)


def format_capacity(name: str, value: int) -> str:
    """Memory in binary units (`4Gi`), the counts as integers."""
    return format_quantity(value) if name == MEMORY else str(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _amounts(raw: Any) -> dict[str, int] | None:
    """`{name: {value: q}}` (a device's capacity) or `{name: q}` (consumedCapacity) as
    integers; None if any amount cannot be read."""
    amounts: dict[str, int] = {}
    for name, entry in _mapping(raw).items():
        value = entry.get("value") if isinstance(entry, Mapping) else entry
        try:
            amounts[str(name)] = parse_quantity(value)
        except QuantityError:
            return None
    return amounts


def _card_number(name: str) -> tuple[int, str]:
    digits = name.removeprefix("card")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def _current_slices(slices: Iterable[Mapping[str, Any]], driver: str) -> list[Mapping[str, Any]]:
    """The driver's slices of each pool's newest generation."""
    newest: dict[str, int] = {}
    mine = []
    for obj in slices:
        spec = _mapping(obj.get("spec"))
        if spec.get("driver") != driver:
            continue
        pool = _mapping(spec.get("pool"))
        generation = pool.get("generation")
        generation = generation if isinstance(generation, int) else 0
        name = str(pool.get("name") or "")
        newest[name] = max(newest.get(name, generation), generation)
        mine.append((name, generation, obj))
    return [obj for name, generation, obj in mine if generation == newest[name]]


def _published_cards(
    slices: Iterable[Mapping[str, Any]], driver: str
) -> tuple[dict[tuple[str, str], DraCard], dict[str, str], list[DraFinding]]:
    """The cards the current slices publish, by (pool, card); each pool's node; and the
    problems reading them."""
    cards: dict[tuple[str, str], DraCard] = {}
    node_of_pool: dict[str, str] = {}
    problems: list[DraFinding] = []
    for obj in _current_slices(slices, driver):
        spec = _mapping(obj.get("spec"))
        pool = str(_mapping(spec.get("pool")).get("name") or "")
        node = str(spec.get("nodeName") or pool)
        node_of_pool[pool] = node
        for device in _list(spec.get("devices")):
            device = _mapping(device)
            name = str(device.get("name") or "")
            capacity = _amounts(device.get("capacity"))
            if capacity is None:
                problems.append(
                    DraFinding(
                        "unreadable",
                        f"{node}/{name}: a capacity of the slice cannot be read",
                        node,
                        name,
                    )
                )
                capacity = {}
            taints = tuple(
                f"{_mapping(t).get('value') or _mapping(t).get('key')}:{_mapping(t).get('effect')}"
                for t in _list(device.get("taints"))
            )
            shareable = device.get("allowMultipleAllocations") is True
            cards[(pool, name)] = DraCard(node, pool, name, True, capacity, [], shareable, taints)
    return cards, node_of_pool, problems


def dra_report(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    only_node: str | None = None,
    driver: str = DRIVER,
) -> DraReport:
    """Per card of `driver`: its capacity, what the allocated claims consume of it, what is
    free, and the claims and pods on it; with the problems found."""
    cards, node_of_pool, problems = _published_cards(slices, driver)

    counted = 0
    for claim in claims:
        metadata = _mapping(claim.get("metadata"))
        namespace = str(metadata.get("namespace") or "")
        claim_name = f"{namespace}/{metadata.get('name')}"
        status = _mapping(claim.get("status"))
        pods = tuple(
            sorted(
                f"{namespace}/{_mapping(ref).get('name')}"
                for ref in _list(status.get("reservedFor"))
                if _mapping(ref).get("resource") == "pods"
            )
        )
        devices = _mapping(_mapping(status.get("allocation")).get("devices"))
        held = False
        for result in _list(devices.get("results")):
            result = _mapping(result)
            if result.get("driver") != driver:
                continue
            pool = str(result.get("pool") or "")
            name = str(result.get("device") or "")
            node = node_of_pool.get(pool, pool)
            if only_node is not None and node != only_node:
                continue
            held = True
            card = cards.get((pool, name))
            if card is None:
                card = cards[(pool, name)] = DraCard(node, pool, name, False)
                problems.append(
                    DraFinding(
                        "unpublished",
                        f"{node}/{name}: held by claim {claim_name}, but no current "
                        f"slice of pool {pool} publishes it",
                        node,
                        name,
                        claim_name,
                    )
                )
            consumed = _amounts(result.get("consumedCapacity"))
            if consumed is None:
                problems.append(
                    DraFinding(
                        "unreadable",
                        f"{node}/{name}: claim {claim_name}'s consumedCapacity cannot be read",
                        node,
                        name,
                        claim_name,
                    )
                )
                consumed = {}
            share_id = result.get("shareID")
            admin = result.get("adminAccess") is True
            if not share_id and not consumed and not admin:
                # Allocated without a share: the card is the claim's alone.
                consumed = dict(card.capacity)
            card.shares.append(
                DraShare(
                    claim_name,
                    str(result.get("request") or ""),
                    pods,
                    str(share_id) if share_id else None,
                    consumed,
                    admin,
                )
            )
        counted += held

    shown = [c for c in cards.values() if only_node is None or c.node == only_node]
    shown.sort(key=lambda c: (c.node, c.pool, _card_number(c.name)))
    for card in shown:
        over = card.over_capacity
        if over and card.published:
            consumed = card.consumed
            amounts = ", ".join(
                f"{n} {format_capacity(n, consumed[n])} of "
                f"{format_capacity(n, card.capacity.get(n, 0))}"
                for n in sorted(over, key=capacity_order)
            )
            problems.append(
                DraFinding(
                    "over_capacity",
                    f"{card.node}/{card.name}: claims consume more than the card has ({amounts}): "
                    + ", ".join(card.claims),
                    card.node,
                    card.name,
                )
            )
    problems.sort(key=lambda f: (f.node or "", _card_number(f.card or ""), f.kind, f.message))
    return DraReport(shown, problems, counted)


def render_dra_table(report: DraReport) -> list[str]:
    """The table's lines: per card, consumed/capacity and free of each capacity, then the
    claims (with their pods)."""
    if not report.cards:
        return []
    capacities = report.capacities
    rows = [
        [
            "DRA NODE",
            "CARD",
            "STATUS",
            *(f"{n} used/cap" for n in capacities),
            *(f"{n} free" for n in capacities),
            "CLAIMS (PODS)",
        ]
    ]
    for card in report.cards:
        consumed, free = card.consumed, card.free
        status = "unpublished" if not card.published else ("over" if card.over_capacity else "ok")
        if card.taints:
            status += f" tainted {','.join(card.taints)}"
        if card.published and not card.shareable:
            status += " whole"
        cells = [card.node, card.name, status]
        for n in capacities:
            have = n in card.capacity
            cap = format_capacity(n, card.capacity[n]) if have else "-"
            cells.append(f"{format_capacity(n, consumed.get(n, 0))}/{cap}")
        cells += [format_capacity(n, free[n]) if n in free else "-" for n in capacities]
        holders = []
        for share in sorted(card.shares, key=lambda s: (s.claim, s.request)):
            admin = " admin" if share.admin else ""
            holders.append(f"{share.claim}{admin} ({', '.join(share.pods) or 'no pod'})")
        cells.append(", ".join(holders))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]
    lines.append(
        f"DRA total: {len(report.nodes)} node(s), {len(report.cards)} card(s) of {DRIVER}, "
        f"{report.claims} claim(s)"
    )
    return lines


def dra_json(report: DraReport) -> dict[str, Any]:
    return {
        "driver": DRIVER,
        "cards": [
            {
                "node": card.node,
                "pool": card.pool,
                "name": card.name,
                "published": card.published,
                "shareable": card.shareable,
                "taints": list(card.taints),
                "over_capacity": card.over_capacity,
                "capacity": card.capacity,
                "consumed": card.consumed,
                "free": card.free,
                "claims": [
                    {
                        "claim": s.claim,
                        "request": s.request,
                        "pods": list(s.pods),
                        "share_id": s.share_id,
                        "consumed": dict(s.consumed),
                        "admin": s.admin,
                    }
                    for s in sorted(card.shares, key=lambda s: (s.claim, s.request))
                ],
            }
            for card in report.cards
        ],
        "claims": report.claims,
        "problems": [f.as_json() for f in report.problems],
    }


def over_committed(report: DraReport) -> Sequence[str]:
    """The messages of cards over capacity: the benchmark's and tests' check."""
    return [f.message for f in report.problems if f.kind == "over_capacity"]
