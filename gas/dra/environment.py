"""What each prepared device tells the containers that get it: the Level Zero tile mask
and the share variables (`gas.core.shares`). No I/O.

The kubelet hands a container the CDI devices of every claim it names, and the runtime
applies each device's environment in turn, so a variable two devices set ends with the
last one's value. gas therefore thinks per container and writes per device:

- **The mask.** Level Zero numbers the tiles of every card a container sees (flat
  hierarchy: cards in number order, tile t of a card after cards of n tiles in all is
  n+t), and `ZE_AFFINITY_MASK` keeps the ones named. A container needs one exactly when
  some card it sees is only partly its own: its claims hold some of the card's tiles and
  none holds the whole card (an administrator's access sees the whole card). The mask is
  counted over every card the container sees, whatever claim gives it, and carried by the
  devices that hold part of a card, so that a container's whole-card claims stay free to
  be shared with containers of other views. A device seen by containers that need
  different masks, or a container that would get two masks, has no right answer: that is
  an error naming them, and the claims are not prepared.
- **The shares.** Each device carries the variables of its own card: the sum, over the
  container's claims, of what they consume on that card. Containers that get the same
  device but hold different shares of its card (one of them holds a second claim on the
  card) cannot both be told right; the device then carries no share variables, and that
  is reported.
- **Administrators' access** (`adminAccess`, a monitoring pod's) gets the device nodes
  only: no mask, no share.

A device no container of the known pods sees (a request no container names, or a claim
prepared without a reserving pod) is planned as if its claim were all one container saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gas.core.model import card_number
from gas.core.shares import Share, share_environment
from gas.dra.consumers import Consumer

AFFINITY = "ZE_AFFINITY_MASK"


@dataclass(frozen=True)
class Held:
    """One allocation result as prepared: the card, the tiles chosen for it (empty: none
    of its own, the whole card is shared), and what it consumes."""

    claim: str
    """`namespace/name` of its ResourceClaim."""
    request: str
    card: str
    tiles: tuple[int, ...] = ()
    admin: bool = False
    share: Share = field(default_factory=Share)

    @property
    def device(self) -> tuple[str, str]:
        return (self.claim, self.card)


@dataclass(frozen=True)
class Carried:
    """A device (a claim's card) prepared earlier: its results and the environment its
    spec gives."""

    held: tuple[Held, ...]
    environment: Mapping[str, str]


@dataclass
class Plan:
    """Per device (claim, card) of the claims being prepared, its environment; per claim
    (`namespace/name`) that cannot be prepared, why; and what was left out, for the log."""

    environment: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _whole(held: Iterable[Held], tiles: int) -> bool:
    entries = list(held)
    if any(h.admin or not h.tiles for h in entries):
        return True
    return len({t for h in entries for t in h.tiles}) >= tiles


def mask_of(view: Sequence[Held], tiles_of: Mapping[str, int]) -> str | None:
    """The mask of a container that sees `view`; None when every card it sees is whole."""
    by_card: dict[str, list[Held]] = {}
    for held in view:
        by_card.setdefault(held.card, []).append(held)
    if all(_whole(entries, tiles_of.get(card, 1)) for card, entries in by_card.items()):
        return None
    indices: list[str] = []
    offset = 0
    for card in sorted(by_card, key=card_number):
        count = tiles_of.get(card, 1)
        entries = by_card[card]
        chosen = (
            range(count)
            if _whole(entries, count)
            else sorted({t for h in entries for t in h.tiles})
        )
        indices.extend(str(offset + t) for t in chosen)
        offset += count
    return ",".join(indices)


def shares_of(view: Sequence[Held]) -> dict[str, Share]:
    """Per card, the sum of what the view's results (not administrators') consume."""
    sums: dict[str, Share] = {}
    for held in view:
        if not held.admin:
            sums[held.card] = sums.get(held.card, Share()) + held.share
    return sums


def _sees(consumer: Consumer, held: Held) -> bool:
    return consumer.sees(held.claim, held.request)


def _partial(entries: Sequence[Held], tiles: int) -> bool:
    return not _whole(entries, tiles)


def _describe(consumer: Consumer, mask: str | None) -> str:
    return f"{consumer.label} ({AFFINITY}={mask})" if mask else f"{consumer.label} (no mask)"


def plan(
    pending: Sequence[Held],
    prepared: Sequence[Carried],
    consumers: Sequence[Consumer],
    tiles_of: Mapping[str, int],
) -> Plan:
    """The environment of each device of `pending` (the results being prepared), given the
    devices prepared earlier and the containers of the pods that use them."""
    result = Plan()
    every = list(pending) + [h for c in prepared for h in c.held]
    views = {c: [h for h in every if _sees(c, h)] for c in consumers}
    masks = {c: mask_of(v, tiles_of) for c, v in views.items()}
    shares = {c: shares_of(v) for c, v in views.items()}
    devices: dict[tuple[str, str], list[Held]] = {}
    for held in pending:
        devices.setdefault(held.device, []).append(held)

    for (claim, card), entries in devices.items():
        seeing = [c for c in consumers if any(_sees(c, h) for h in entries)]
        environment: dict[str, str] = {}
        if not all(h.admin for h in entries):
            if seeing:
                wanted_masks = {masks[c] for c in seeing}
                wanted_shares = {shares[c].get(card, Share()) for c in seeing}
            else:  # no known container: as if the claim were all one container saw
                alone = [h for h in pending if h.claim == claim]
                wanted_masks = {mask_of(alone, tiles_of)}
                wanted_shares = {shares_of(alone).get(card, Share())}
            if _partial(entries, tiles_of.get(card, 1)):
                if len(wanted_masks) > 1:
                    who = ", ".join(_describe(c, masks[c]) for c in seeing)
                    result.errors.setdefault(
                        claim,
                        f"claim {claim} gives tiles of {card} to containers that see different "
                        f"cards, and no one {AFFINITY} is right for all of them: {who}",
                    )
                    continue
                (mask,) = wanted_masks
                if mask is not None:
                    environment[AFFINITY] = mask
            if len(wanted_shares) == 1:
                (share,) = wanted_shares
                environment.update(share_environment(card, share))
            else:
                names = ", ".join(c.label for c in seeing)
                result.warnings.append(
                    f"claim {claim}: no share variables for {card}, whose containers hold "
                    f"different shares of it ({names})"
                )
        result.environment[(claim, card)] = environment

    carried_by = {h.device: c.environment for c in prepared for h in c.held}
    for consumer in consumers:
        got: dict[tuple[str, str], Mapping[str, str]] = {}
        for held in views[consumer]:
            if held.device in result.environment:
                got[held.device] = result.environment[held.device]
            elif held.device in carried_by:
                got[held.device] = carried_by[held.device]
        carried = {env[AFFINITY] for env in got.values() if AFFINITY in env}
        wanted = masks[consumer]
        if carried == ({wanted} if wanted is not None else set()):
            continue
        given = ", ".join(sorted(carried)) or "none"
        cards = ", ".join(sorted({h.card for h in views[consumer]}, key=card_number))
        reason = (
            f"{consumer.label} sees {cards} and needs "
            f"{AFFINITY}={wanted if wanted is not None else '(none)'}, but the claims it "
            f"names give it {given}: a claim prepared earlier for other containers fixed it"
        )
        for claim, _ in {h.device for h in views[consumer] if h.device in result.environment}:
            result.errors.setdefault(claim, reason)
    for claim in result.errors:
        for device in [d for d in result.environment if d[0] == claim]:
            del result.environment[device]
    return result
