"""Each card's real use, by container, from one scan of the node's processes: no I/O.

A DRM client belongs to the card whose PCI address its `drm-pdev` names, and to the
container of the processes that hold it. A client is one however many fds and processes
reach it (a dup'd fd, a forked worker): it counts once, for the first of its processes by
pid; a client held by processes of two containers (an fd passed over a socket) counts for
the first, and the scan says so. Processes in no pod are counted together, as `other`.

A container's device memory is the sum of its distinct clients' `device_memory` (the
card's local memory, an integrated card's system memory); None when the kernel reports no
memory for them. Its engines are its clients' engine times summed per class, except
xe's `total` (its GPU clock, read by each client at about the same instant), which is
the latest reading, not a sum: summed it would count the elapsed time once per client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gas.host.cards import Card
from gas.host.fdinfo import DrmClient, Engine, utilization
from gas.host.proc import ProcScan

ClientKey = tuple[str, str]


@dataclass(frozen=True)
class ContainerUse:
    pod_uid: str
    container_id: str
    """Both "" for the processes in no pod (`CardUse.other`)."""
    pids: tuple[int, ...]
    memory: int | None
    """Device memory bytes on this card; None: not reported by this kernel."""
    engines: Mapping[str, Engine]
    """Per engine class, over its distinct clients: busy summed, capacity kept, xe's
    total (a clock) the latest."""
    complete: bool
    clients: Mapping[ClientKey, Mapping[str, Engine]] = field(default_factory=dict)
    """Each distinct client's engines: what `engine_utilization` compares between two
    readings, client by client, so a client that came or went between them does not
    skew the others."""


@dataclass(frozen=True)
class CardUse:
    card: str
    pci_address: str
    containers: tuple[ContainerUse, ...]
    """Pod containers, by (pod UID, container id)."""
    other: ContainerUse | None
    """The processes in no pod, together; None when there are none."""
    memory_reported: bool
    """False: some client on the card reports no memory (an older kernel)."""


@dataclass(frozen=True)
class Usage:
    cards: tuple[CardUse, ...]
    """Every card given, by number, used or not."""
    notes: tuple[str, ...]
    complete: bool
    whole: bool = True
    """Every process's fds were read: a card's total (pods' and others') is what it holds.
    False: some could not be (permission denied), and no card's total is known."""


Owner = tuple[str, str]
_NO_POD: Owner = ("", "")


@dataclass
class _Entry:
    """One owner's clients on one card, as they are gathered."""

    pids: set[int] = field(default_factory=set)
    clients: dict[ClientKey, DrmClient] = field(default_factory=dict)
    complete: bool = True

    def use(self, owner: Owner, memory_reported: bool) -> ContainerUse:
        clients = list(self.clients.values())
        amounts = [client.device_memory() for client in clients]
        known = [amount for amount in amounts if amount is not None]
        memory: int | None = sum(known)
        if (clients and not known) or (not clients and not memory_reported):
            memory = None
        return ContainerUse(
            owner[0],
            owner[1],
            tuple(sorted(self.pids)),
            memory,
            sum_engines(client.engines for client in clients),
            self.complete,
            {key: client.engines for key, client in self.clients.items()},
        )


def sum_engines(readings: Iterable[Mapping[str, Engine]]) -> dict[str, Engine]:
    """Engine readings of several clients of one card, per class."""
    found: dict[str, Engine] = {}
    for engines in readings:
        for name, engine in engines.items():
            before = found.get(name)
            if before is None:
                found[name] = engine
                continue
            totals = [t for t in (before.total, engine.total) if t is not None]
            found[name] = Engine(
                before.busy + engine.busy,
                max(totals) if totals else None,
                max(before.capacity, engine.capacity),
            )
    return found


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def attribute(scan: ProcScan, cards: Sequence[Card]) -> Usage:
    """The scan's clients, by card and by container."""
    by_address = {card.pci_address.lower(): card for card in cards if card.pci_address}
    entries: dict[str, dict[Owner, _Entry]] = {card.name: {} for card in cards}
    first_owner: dict[tuple[str, ClientKey], Owner] = {}
    unmatched: dict[tuple[str, str], set[ClientKey]] = {}
    shared: set[tuple[str, ClientKey]] = set()
    for process in sorted(scan.processes, key=lambda p: p.pid):
        owner = (process.owner.pod_uid, process.owner.container_id) if process.owner else _NO_POD
        for index, client in enumerate(process.clients):
            # A client without an id is one per fd: keyed by where it was found.
            key = client.key if client.client_id else (client.pdev, f"pid {process.pid} #{index}")
            card = by_address.get(client.pdev.lower())
            if card is None:
                unmatched.setdefault((client.pdev, client.driver), set()).add(key)
                continue
            entry = entries[card.name].setdefault(owner, _Entry())
            entry.pids.add(process.pid)
            entry.complete = entry.complete and process.complete
            first = first_owner.setdefault((card.name, key), owner)
            if first != owner:
                shared.add((card.name, key))
            elif key not in entry.clients:
                entry.clients[key] = client
    notes = list(scan.notes)
    used = []
    for card in sorted(cards, key=lambda card: card.number):
        owners = entries[card.name]
        reported = all(c.reports_memory for e in owners.values() for c in e.clients.values())
        if not reported:
            notes.append(f"{card.name}: memory use not reported by this kernel")
        other = owners.pop(_NO_POD, None)
        used.append(
            CardUse(
                card.name,
                card.pci_address,
                tuple(owners[owner].use(owner, reported) for owner in sorted(owners)),
                other.use(_NO_POD, reported) if other is not None else None,
                reported,
            )
        )
    for (pdev, driver), keys in sorted(unmatched.items()):
        notes.append(
            f"{_plural(len(keys), 'DRM client', 'DRM clients')} of driver {driver} on "
            f"{pdev or 'no PCI device (no drm-pdev)'}, which is none of the cards read: not "
            "shown"
        )
    if shared:
        notes.append(
            f"{_plural(len(shared), 'DRM client is', 'DRM clients are')} held by processes of "
            "two containers: each counted for the first of its processes"
        )
    complete = (
        scan.readable
        and scan.complete
        and all(e.complete for owners in entries.values() for e in owners.values())
    )
    return Usage(tuple(used), tuple(notes), complete, scan.readable and not scan.unlisted)


def _uses(found: Usage) -> Iterable[tuple[str, ContainerUse]]:
    for card in found.cards:
        for use in card.containers:
            yield card.card, use
        if card.other is not None:
            yield card.card, card.other


def engine_utilization(
    before: Usage, after: Usage, seconds: float
) -> dict[tuple[str, str, str], dict[str, float]]:
    """(card, pod UID, container id) -> engine class -> the share of the class's engines
    its clients kept busy between the two readings `seconds` apart (0 to 1). A client
    compared with its own earlier reading; one new since counts all its busy time when
    that is in nanoseconds (it was all spent since), and is left out when in xe's cycles
    (its start on the GPU clock is not known)."""
    earlier: dict[tuple[str, ClientKey], Mapping[str, Engine]] = {}
    for card, use in _uses(before):
        for key, engines in use.clients.items():
            earlier[(card, key)] = engines
    found: dict[tuple[str, str, str], dict[str, float]] = {}
    for card, use in _uses(after):
        shares: dict[str, float] = {}
        for key, engines in use.clients.items():
            old = earlier.get((card, key), {})
            for name, engine in engines.items():
                base = old.get(name)
                if base is None:
                    if engine.total is not None:
                        continue
                    base = Engine(0, None, engine.capacity)
                share = utilization(base, engine, seconds)
                if share is not None:
                    shares[name] = shares.get(name, 0.0) + share
        found[(card, use.pod_uid, use.container_id)] = {
            name: min(1.0, share) for name, share in sorted(shares.items())
        }
    return found
