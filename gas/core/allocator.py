"""Card choice: which cards of one node each container of a pod gets, or why none fit.

Pure functions of (node capacity, node usage, pod request): no I/O, no locks, no clock.

The search is first fit in numeric card order, as GAS does, so wherever GAS finds cards gas
finds the same ones. Where first fit fails on a multi-container pod, a bounded backtracking
search tries the other card choices, so a node is only dropped when no set of cards fits
(or the search budget runs out, which only an absurd pod can cause).

Most pods have one container asking for cards and use plain first fit: they take a
shortcut (`_first_fit`) that finds the same cards, or the same reason, without setting up
the general search, and with a node `Summary` most pods that do not fit are refused without
looking at each card. `place(..., shortcut=False)` is the search alone, which the
shortcut is tested against.

A rejection says whether waiting can help: `unresolvable` means the pod would not fit on
this node even with every card idle, so preemption is pointless there.

Placement policies (`Policy.placement`, overridden per pod by the `gas-policy` annotation)
change the card order inside a node; `gas.core.scoring` ranks the nodes themselves:

- `first-fit` (default, as GAS): numeric card order (`--balancedResource` and the node's
  preferred card as GAS has them).
- `binpack`: the fitting card with the least free capacity of the pod's dominant resource
  first (ties: the first-fit order), so whole cards stay free for big pods.
- `spread`: the fitting card with the most free capacity of it first.

The dominant resource (`dominant_resource`) is the one the pod's per-card need takes the
largest fraction of a card's capacity of (ties: resource name order). With a policy other
than first-fit, `--balancedResource` is not used. Xe-linked pods keep the link order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations

from gas.core.model import (
    ANNOTATION_ALLOW,
    ANNOTATION_DENY,
    BINPACK,
    FIRST_FIT,
    RESOURCE_PREFIX,
    SPREAD,
    TILES,
    Allocation,
    ContainerNeed,
    NodeGpu,
    PodRequest,
    TileAllocation,
    TileUsage,
    Usage,
)

SEARCH_BUDGET = 20_000
"""Card combinations tried per pod and node before giving up."""

_NO_USAGE: Mapping[str, int] = {}  # an idle card's usage (never written to)


@dataclass(frozen=True)
class Rejection:
    reason: str
    unresolvable: bool


@dataclass(frozen=True)
class Policy:
    """Cluster-wide switches from the command line (GAS's flags)."""

    allowlist: bool = False
    denylist: bool = False
    balanced_resource: str = ""
    """`--balancedResource`: cards with the least of this resource in use come first."""
    placement: str = FIRST_FIT
    """`--policy`: first-fit, binpack or spread; a pod's `gas-policy` annotation wins."""

    def placement_for(self, request: PodRequest) -> str:
        """The placement policy that applies to `request`."""
        return request.policy or self.placement

    @property
    def balanced(self) -> str:
        name = self.balanced_resource
        if not name or name.startswith(RESOURCE_PREFIX):
            return name
        return RESOURCE_PREFIX + name


@dataclass(frozen=True)
class Placement:
    """Cards per container and, for containers that ask for tiles, the tiles per card."""

    cards: Allocation
    tiles: TileAllocation


NODE_BLOCKED = "gpu: node has a pod with an unreadable gas-container-cards annotation"


@dataclass(frozen=True, slots=True)
class Summary:
    """Where one node stands, for the first-fit shortcut to refuse most pods without
    looking at each card. Over the node's cards not disabled by its labels (`cards`):
    how many are `blocked`, and over the others (`open`), the least usage of each
    resource the node has capacity of. Made by `summarize`."""

    cards: int
    open: int
    blocked: int
    least_used: Mapping[str, int]


def summarize(node: NodeGpu, usage: Usage, blocked: frozenset[str] = frozenset()) -> Summary:
    """The summary of `node` with `usage` and `blocked` cards, for `place`."""
    usable = [card for card in node.cards if card not in node.disabled]
    open_cards = [card for card in usable if card not in blocked]
    least = {
        res: min((usage.get(card, {}).get(res, 0) for card in open_cards), default=0)
        for res in node.capacity
    }
    return Summary(len(usable), len(open_cards), len(usable) - len(open_cards), least)


def place(
    node: NodeGpu,
    usage: Usage,
    request: PodRequest,
    *,
    blocked: frozenset[str] = frozenset(),
    node_blocked: bool = False,
    order: Sequence[str] | None = None,
    tiles_used: TileUsage | None = None,
    policy: Policy | None = None,
    summary: Summary | None = None,
    shortcut: bool = True,
    idle_fit: Callable[[], bool] | None = None,
) -> Placement | Rejection:
    """Cards and tiles per container for `request` on `node`, or the reason it does not fit.

    `blocked` cards count as full (an annotation naming them could not be read);
    `node_blocked` makes every card full. `order` overrides the numeric card order.
    `tiles_used` names the tile indices other pods hold on each card. `summary`, when
    given, is `summarize(node, usage, blocked)`: callers fitting many pods to one state of
    a node compute it once, and most pods that do not fit are then refused without
    looking at each card. `shortcut=False` runs the general search alone: the reference
    the first-fit shortcut is tested against (same answers, same reasons). `idle_fit`,
    when given, answers what `fits_idle(node, request, policy)` would (without `order`): callers
    fitting a pod shape to many nodes of one kind remember it per kind (it does not
    depend on usage), as the search that decides it costs as much as the fit.
    """
    policy = policy or Policy()
    if node.problem is not None:
        return Rejection(node.problem, unresolvable=True)
    problem = _request_problem(node, request, policy)
    if problem is not None:
        return Rejection(problem, unresolvable=True)
    static = _static_check(node, request)
    if static is not None:
        return static
    if not request.needs_gpu:
        return Placement(
            tuple(() for _ in request.containers), tuple(() for _ in request.containers)
        )
    if node_blocked:
        return Rejection(NODE_BLOCKED, unresolvable=False)
    sets = _search_sets(node, request, policy, order)
    widest = max((len(s) for s in sets), default=0)
    most = max(need.gpus for need in request.containers)
    if most > widest:
        return Rejection(_too_few_usable(node, request, most, widest), unresolvable=True)
    single = lone_need(request, policy) if shortcut and len(sets) == 1 else None
    if single is not None:
        return _first_fit(node, usage, request, single, sets[0], blocked, summary)
    tiles_used = tiles_used or {}
    busy = _busy_tiles(node, tiles_used)
    adjusted = _with_tile_usage(node, usage, tiles_used)
    mode = policy.placement_for(request)
    balanced = policy.balanced if mode == FIRST_FIT else ""
    dominant = dominant_resource(node, request) if mode in (BINPACK, SPREAD) else None
    fill = (dominant, mode == BINPACK) if dominant is not None else None
    for cards in sets:
        found = _Search(node, adjusted, request, cards, blocked, busy, balanced, fill).run()
        if found is not None:
            tiles = _assign_tiles(node, request, found, busy)
            if tiles is not None:
                return Placement(found[0], tiles)
    if not (idle_fit() if idle_fit is not None else _fits_idle(node, request, sets, balanced)):
        return Rejection(DOES_NOT_FIT_IDLE, unresolvable=True)
    usable = tuple(dict.fromkeys(c for s in sets for c in s))
    return Rejection(_shortage(node, adjusted, request, blocked, usable), unresolvable=False)


def fits_idle(node: NodeGpu, request: PodRequest, policy: Policy | None = None) -> bool:
    """Whether the search finds cards for `request` on `node` with every card idle and
    none blocked: what `place` asks of a pod it cannot place now, to tell whether waiting
    can help. A function of the node's description (not its name or usage), the pod and
    the policy, so a caller may remember it per kind of node and pod shape."""
    policy = policy or Policy()
    balanced = policy.balanced if policy.placement_for(request) == FIRST_FIT else ""
    return _fits_idle(node, request, _search_sets(node, request, policy, None), balanced)


def _fits_idle(
    node: NodeGpu, request: PodRequest, sets: Sequence[tuple[str, ...]], balanced: str
) -> bool:
    idle_busy = _busy_tiles(node, {})
    idle = _with_tile_usage(node, {}, {})
    return any(
        _Search(node, idle, request, cards, frozenset(), idle_busy, balanced).run() is not None
        for cards in sets
    )


def dominant_resource(node: NodeGpu, request: PodRequest) -> str | None:
    """The resource whose per-card need takes the largest fraction of a card's capacity,
    over every container of the pod that asks for cards (ties: resource name order)."""
    best: tuple[Fraction, str] | None = None
    for need in request.containers:
        if need.gpus <= 0:
            continue
        for res, amount in sorted(need.per_card().items()):
            capacity = node.capacity.get(res, 0)
            if amount <= 0 or capacity <= 0:
                continue
            share = Fraction(amount, capacity)
            if best is None or share > best[0]:
                best = (share, res)
    return None if best is None else best[1]


def _request_problem(node: NodeGpu, request: PodRequest, policy: Policy) -> str | None:
    """Annotation and topology problems: they hold whatever the usage."""
    problem = annotation_problem(request, policy)
    if problem is not None:
        return problem
    if request.xelink and request.needs_gpu:
        if node.xe_link_problem is not None:
            return node.xe_link_problem
        if not node.xe_links:
            return "gpu: pod asks for Xe-linked GPUs, node has no gpu.intel.com/xe-links label"
    if request.single_numa and request.needs_gpu and node.numa_problem is not None:
        return node.numa_problem
    return None


def annotation_problem(request: PodRequest, policy: Policy) -> str | None:
    """The first (by annotation name) of the pod's annotation problems that counts under
    `policy`: those of gas-allow and gas-deny only while their feature is on."""
    problems = request.problems
    if not problems:  # most pods: no sort to set up (asked for every pod and node)
        return None
    for key, problem in sorted(problems.items()):
        if key == ANNOTATION_ALLOW and not policy.allowlist:
            continue
        if key == ANNOTATION_DENY and not policy.denylist:
            continue
        return problem
    return None


def _search_sets(
    node: NodeGpu, request: PodRequest, policy: Policy, order: Sequence[str] | None
) -> list[tuple[str, ...]]:
    """The card orders to search, each a set all the pod's cards must come from."""
    usable = card_order(node, policy, order)
    allow, deny = card_lists(request, policy)
    if allow is not None or deny:
        usable = tuple(c for c in usable if (allow is None or c in allow) and c not in deny)
    if request.single_numa and node.numa_groups:
        # The whole pod in one NUMA group (GAS decides per container), groups in label order.
        return [tuple(c for c in usable if c in group) for group in node.numa_groups]
    return [usable]


def card_order(
    node: NodeGpu, policy: Policy, order: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The node's cards a pod may use, in the order first fit tries them, before the pod's
    own card lists (`card_lists`) and NUMA groups narrow them: `order` (else the node's
    numeric order), the preferred card first unless a resource is balanced, disabled cards
    left out."""
    cards = node.cards
    if order is not None:
        # Only the node's own cards, each once, whatever the caller's order names.
        own = set(node.cards)
        cards = tuple(c for c in dict.fromkeys(order) if c in own)
    if node.preferred is not None and node.preferred in cards and not policy.balanced:
        # Moved, not swapped as GAS does: the other cards keep their order.
        cards = (node.preferred, *(c for c in cards if c != node.preferred))
    disabled = node.disabled
    return tuple([c for c in cards if c not in disabled]) if disabled else cards


def card_lists(request: PodRequest, policy: Policy) -> tuple[frozenset[str] | None, frozenset[str]]:
    """The pod's gas-allow list (None: every card) and gas-deny list, as they count under
    `policy` (each only while its feature is on)."""
    allow = request.allow if policy.allowlist else None
    deny = request.deny if policy.denylist else frozenset()
    return allow, deny


def lone_need(request: PodRequest, policy: Policy) -> int | None:
    """The index of the pod's only container asking for cards, when the search over one
    card order reduces to plain first fit: no tiles to choose, no Xe links, no card order
    that moves with usage. Most pods are like this, and `_first_fit` finds their cards (or
    the reason) without the general search's set-up."""
    if request.xelink or policy.balanced:
        return None
    if policy.placement_for(request) != FIRST_FIT:
        return None
    found = None
    for index, need in enumerate(request.containers):
        if need.gpus > 0:
            if found is not None or TILES in need.requests:
                return None
            found = index
    return found


def _first_fit(
    node: NodeGpu,
    usage: Usage,
    request: PodRequest,
    index: int,
    cards: tuple[str, ...],
    blocked: frozenset[str],
    summary: Summary | None,
) -> Placement | Rejection:
    """What `_Search` finds for a pod whose only card-asking container is `index`: its
    first `gpus` fitting cards in `cards` order. The caller has checked that the node has
    enough usable cards and that a card has room for the per-card need, so the pod fits
    on the idle node and a miss is a shortage."""
    need = request.containers[index]
    capacity = node.capacity
    # A card fits when its usage of each resource is at most this (usage + need <= capacity).
    limits = [(res, capacity.get(res, 0) - amount) for res, amount in need.per_card().items()]
    wanted = need.gpus
    if summary is not None and summary.cards == len(cards):
        # `cards` are all the node's usable cards (a subset of them, as many): when no
        # open card has room for some resource, `_shortage` would count every open card
        # short of it, which no other resource can beat.
        counts = dict.fromkeys(
            (res for res, limit in limits if summary.least_used[res] > limit), summary.open
        )
        if counts or not summary.open:
            if summary.blocked:
                counts["blocked"] = summary.blocked
            return Rejection(_worst_shortage(counts, request), unresolvable=False)
    chosen: list[str] = []
    for card in cards:
        if card in blocked:
            continue
        used = usage.get(card)
        if used is None or all(used.get(res, 0) <= limit for res, limit in limits):
            chosen.append(card)
            if len(chosen) == wanted:
                picked = tuple(chosen)
                containers = range(len(request.containers))
                return Placement(
                    tuple(picked if i == index else () for i in containers),
                    tuple(() for _ in containers),
                )
    return Rejection(_shortage(node, usage, request, blocked, cards), unresolvable=False)


def _too_few_usable(node: NodeGpu, request: PodRequest, most: int, widest: int) -> str:
    why = []
    if node.disabled & set(node.cards):
        why.append("disabled by node labels")
    if request.allow is not None or request.deny:
        why.append("excluded by gas-allow or gas-deny")
    if request.single_numa and node.numa_groups:
        why.append("outside a single NUMA group")
    detail = f" (the others are {' or '.join(why)})" if why else ""
    return f"gpu: container asks for {most} cards, only {widest} usable{detail}"


def _busy_tiles(node: NodeGpu, tiles_used: TileUsage) -> dict[str, frozenset[int]]:
    """Tiles no new pod may take: in use, disabled or descheduled (all below capacity)."""
    capacity = node.tiles_per_card
    busy = {}
    for card in set(tiles_used) | set(node.unavailable_tiles):
        taken = tiles_used.get(card, frozenset()) | node.unavailable_tiles.get(card, frozenset())
        busy[card] = frozenset(t for t in taken if t < capacity)
    return busy


def _with_tile_usage(node: NodeGpu, usage: Usage, tiles_used: TileUsage) -> Usage:
    """Usage where a card's tiles count is at least its tiles taken by index, plus its
    unavailable tiles not in use, so a fit on the tiles count guarantees free indices."""
    capacity = node.tiles_per_card
    if capacity <= 0:
        return usage
    adjusted: dict[str, Mapping[str, int]] = dict(usage)
    for card in set(tiles_used) | set(node.unavailable_tiles):
        used = frozenset(t for t in tiles_used.get(card, frozenset()) if t < capacity)
        off = node.unavailable_tiles.get(card, frozenset()) - used
        counted = usage.get(card, {}).get(TILES, 0)
        value = max(counted, len(used)) + len(off)
        if value != counted:
            adjusted[card] = {**usage.get(card, {}), TILES: value}
    return adjusted


# Reasons, word for word the same wherever they are found (the arrays of
# gas/core/freebook.py and gas/core/judgement.py give these too).
TOO_FEW_CARDS = "gpu: container asks for {} cards, node has {}"
NO_RESOURCE = "gpu: node has no {} per card"
CARD_TOO_SMALL = "gpu: container needs more {} per card than a card has"
NOT_ENOUGH_CARDS = "gpu: not enough free cards for every container of the pod"
NOT_ENOUGH_OF = "gpu: not enough free {} on the node's cards"
CARDS_HELD = "gpu: cards are held by a pod with an unreadable gas-container-cards annotation"
DOES_NOT_FIT_IDLE = "gpu: pod does not fit on this node even with all its cards idle"


def _static_check(node: NodeGpu, request: PodRequest) -> Rejection | None:
    """Reasons that hold whatever the usage: missing resources, too few cards."""
    for need in request.containers:
        if need.gpus == 0:
            continue
        if need.gpus > len(node.cards):
            return Rejection(TOO_FEW_CARDS.format(need.gpus, len(node.cards)), unresolvable=True)
        for res, amount in need.per_card().items():
            capacity = node.capacity.get(res, 0)
            if capacity <= 0:
                return Rejection(NO_RESOURCE.format(res), unresolvable=True)
            if amount > capacity:
                return Rejection(CARD_TOO_SMALL.format(res), unresolvable=True)
    return None


Found = tuple[Allocation, tuple[tuple[int, ...], ...]]
"""Cards per container, and for Xe-linked containers the linked tile on each card."""


class _Search:
    """Backtracking over the pod's containers in order: each tries its card choices
    (`options`) in turn with the containers before it in place, until the last one is
    placed. Every choice tried spends one of `SEARCH_BUDGET` steps; when they run out the
    search gives up as if nothing fit.

    All cards come from `cards`, in that order unless `balanced` (`--balancedResource`)
    or `fill` ((resource, fullest first): the binpack or spread order) sorts them. `busy`
    tiles are those no new pod may take (see `_busy_tiles`)."""

    def __init__(
        self,
        node: NodeGpu,
        usage: Usage,
        request: PodRequest,
        cards: Sequence[str],
        blocked: frozenset[str],
        busy: Mapping[str, frozenset[int]],
        balanced: str = "",
        fill: tuple[str, bool] | None = None,
    ) -> None:
        self.node = node
        self.usage = usage
        self.request = request
        self.cards = cards
        self.blocked = blocked
        self.busy = busy
        self.balanced = balanced
        self.fill = fill
        capacity = node.capacity
        # Per container, each resource's most usage a card may have for it to fit
        # (usage + need <= capacity): what `fits` compares against.
        self.limits = [
            [(res, capacity.get(res, 0) - amount) for res, amount in need.per_card().items()]
            for need in request.containers
        ]
        self.group = set(request.same_gpu)
        self.rank = {card: index for index, card in enumerate(cards)}
        self.steps_left = SEARCH_BUDGET
        # What the containers placed so far hold: the usage of the cards they were given
        # (with theirs added), the tiles the Xe-linked ones took, each one's cards and
        # linked tiles.
        self.working: dict[str, dict[str, int]] = {}
        self.taken: dict[str, set[int]] = {}
        self.chosen: list[tuple[str, ...]] = []
        self.chosen_tiles: list[tuple[int, ...]] = []

    def run(self) -> Found | None:
        """Cards for every container (and linked tiles), or None when none fit."""
        if not self.place_from(0):
            return None
        return tuple(self.chosen), tuple(self.chosen_tiles)

    def place_from(self, index: int) -> bool:
        """Place container `index` and those after it, on top of those before it."""
        needs = self.request.containers
        if index == len(needs):
            return True
        need = needs[index]
        per_card = need.per_card()
        for picked, tiles in self.options(index, need):
            if not self.spend():
                return False
            self.push(picked, tiles, per_card)
            if self.place_from(index + 1):
                return True
            self.pop(picked, tiles, per_card)
        return False

    def spend(self) -> bool:
        """Take one step of the budget; False once it is spent."""
        self.steps_left -= 1
        return self.steps_left >= 0

    def push(
        self, picked: tuple[str, ...], tiles: tuple[int, ...], per_card: Mapping[str, int]
    ) -> None:
        """Place the next container on `picked` (and linked `tiles`)."""
        self.add_usage(picked, per_card, +1)
        self.take_tiles(picked, tiles, +1)
        self.chosen.append(picked)
        self.chosen_tiles.append(tiles)

    def pop(
        self, picked: tuple[str, ...], tiles: tuple[int, ...], per_card: Mapping[str, int]
    ) -> None:
        """Undo the `push` of the last container placed."""
        self.chosen.pop()
        self.chosen_tiles.pop()
        self.take_tiles(picked, tiles, -1)
        self.add_usage(picked, per_card, -1)

    def options(
        self, index: int, need: ContainerNeed
    ) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
        """The card choices for container `index`, in the order they are tried, with the
        linked tile on each card for Xe-linked pods. Lazy: each is checked against the
        usage as it stands when it is reached (later containers are undone by then)."""
        if need.gpus == 0:
            yield (), ()
            return
        limits = self.limits[index]
        if need.name in self.group:
            shared = self.same_gpu_card(index)
            if shared is not None:
                if self.fits(shared, limits):
                    yield (shared,), ()
                return
        if self.request.xelink:
            for combo in combinations(self.linked_pairs(limits), need.gpus // 2):
                picked = tuple(card for a, _, b, _ in combo for card in (a, b))
                if len(set(picked)) == len(picked):
                    yield picked, tuple(tile for _, at, _, bt in combo for tile in (at, bt))
            return
        blocked = self.blocked
        eligible = (c for c in self.card_order() if c not in blocked and self.fits(c, limits))
        if need.gpus == 1:
            # Lazily: first fit usually stops at the first free card.
            yield from (((card,), ()) for card in eligible)
        else:
            yield from ((combo, ()) for combo in combinations(list(eligible), need.gpus))

    def used(self, card: str, res: str) -> int:
        """How much of `res` is in use on `card`, the containers placed so far included."""
        own = self.working.get(card)
        if own is not None and res in own:
            return own[res]
        return self.usage.get(card, {}).get(res, 0)

    def fits(self, card: str, limits: Sequence[tuple[str, int]]) -> bool:
        """Whether `card` has room for a container whose `limits` (see `self.limits`) are
        these on top of its usage (`used`, inlined: this is the search's innermost step)."""
        before = self.usage.get(card, _NO_USAGE)
        own = self.working.get(card)
        for res, limit in limits:
            if (own[res] if own is not None and res in own else before.get(res, 0)) > limit:
                return False
        return True

    def add_usage(self, picked: tuple[str, ...], per_card: Mapping[str, int], sign: int) -> None:
        """Add (`sign` +1) or take back (-1) a container's `per_card` need on `picked`."""
        for card in picked:
            own = self.working.setdefault(card, {})
            for res, amount in per_card.items():
                own[res] = self.used(card, res) + sign * amount

    def take_tiles(self, picked: tuple[str, ...], tiles: tuple[int, ...], sign: int) -> None:
        """Take (`sign` +1) or give back (-1) the linked `tiles` on `picked`."""
        for card, tile in zip(picked, tiles, strict=False):
            if sign > 0:
                self.taken.setdefault(card, set()).add(tile)
            else:
                self.taken[card].discard(tile)

    def card_order(self) -> Sequence[str]:
        """The cards in the order the next container tries them."""
        rank = self.rank
        if self.fill is not None:
            res, fullest = self.fill
            # Capacity is the same on every card of a node: least free = most used.
            return sorted(
                self.cards,
                key=lambda c: (-self.used(c, res) if fullest else self.used(c, res), rank[c]),
            )
        balanced = self.balanced
        if not balanced:
            return self.cards
        # Re-sorted before each container, as usage moves: spreads the pod's containers.
        return sorted(self.cards, key=lambda c: (self.used(c, balanced), rank[c]))

    def same_gpu_card(self, index: int) -> str | None:
        """The card of the first container before `index` in the `gas-same-gpu` group."""
        needs = self.request.containers
        for earlier in range(index):
            if needs[earlier].name in self.group:
                return self.chosen[earlier][0]
        return None

    def tile_free(self, card: str, tile: int) -> bool:
        return (
            tile < self.node.tiles_per_card
            and tile not in self.busy.get(card, ())
            and tile not in self.taken.get(card, ())
        )

    def linked_pairs(self, limits: Sequence[tuple[str, int]]) -> list[tuple[str, int, str, int]]:
        """The Xe links whose two cards both fit `limits` and whose two tiles are free,
        each as (card, tile, card, tile) with the earlier card first, in card order."""
        rank = self.rank
        pairs = set()
        for (a, a_tile), (b, b_tile) in self.node.xe_links:
            # A link joins both ends: partners are found from either side (GAS only
            # follows links left to right).
            if a == b or a not in rank or b not in rank:
                continue
            if rank[b] < rank[a]:
                a, a_tile, b, b_tile = b, b_tile, a, a_tile
            if a in self.blocked or b in self.blocked:
                continue
            if (
                self.tile_free(a, a_tile)
                and self.tile_free(b, b_tile)
                and self.fits(a, limits)
                and self.fits(b, limits)
            ):
                pairs.add((a, a_tile, b, b_tile))
        return sorted(pairs, key=lambda p: (rank[p[0]], p[1], rank[p[2]], p[3]))


def _assign_tiles(
    node: NodeGpu, request: PodRequest, found: Found, busy: Mapping[str, frozenset[int]]
) -> TileAllocation | None:
    """Tile indices for each container that asks for tiles: the linked ones for Xe-link
    pods, else the preferred free tiles first, then the lowest free ones."""
    allocation, linked = found
    taken = {card: set(tiles) for card, tiles in busy.items()}
    for cards, tiles in zip(allocation, linked, strict=True):
        for card, tile in zip(cards, tiles, strict=False):
            taken.setdefault(card, set()).add(tile)
    result: list[tuple[tuple[str, tuple[int, ...]], ...]] = []
    for need, cards, tiles in zip(request.containers, allocation, linked, strict=True):
        if need.requests.get(TILES, 0) <= 0 or not cards:
            result.append(())
            continue
        if tiles:
            result.append(tuple((card, (tile,)) for card, tile in zip(cards, tiles, strict=True)))
            continue
        count = need.per_card(len(cards)).get(TILES, 0)
        entries = []
        for card in cards:
            busy_here = taken.setdefault(card, set())
            free = [t for t in range(node.tiles_per_card) if t not in busy_here]
            preferred = [t for t in node.preferred_tiles.get(card, ()) if t in free]
            picked = (preferred + [t for t in free if t not in preferred])[:count]
            if len(picked) < count:
                return None
            busy_here.update(picked)
            entries.append((card, tuple(sorted(picked))))
        result.append(tuple(entries))
    return tuple(result)


def _shortage(
    node: NodeGpu,
    usage: Usage,
    request: PodRequest,
    blocked: frozenset[str],
    usable: Sequence[str],
) -> str:
    """A short, stable reason naming the resource that keeps the most cards out."""
    counts: dict[str, int] = {}
    capacity = node.capacity
    # Counted per resource over the open cards' usage rows (the order counted in does
    # not matter: `_worst_shortage` breaks ties by name).
    rows = [usage.get(card, _NO_USAGE) for card in usable if card not in blocked]
    held = len(usable) - len(rows)
    for need in request.containers:
        if need.gpus == 0:
            continue
        if held:
            counts["blocked"] = counts.get("blocked", 0) + held
        for res, amount in need.per_card().items():
            limit = capacity.get(res, 0) - amount  # short: usage + amount > capacity
            short = sum([1 for row in rows if row.get(res, 0) > limit])
            if short:
                counts[res] = counts.get(res, 0) + short
    return _worst_shortage(counts, request)


def _worst_shortage(counts: Mapping[str, int], request: PodRequest) -> str:
    """The reason for the resource (or "blocked") that keeps the most cards out."""
    if not counts:
        if request.xelink:
            return "gpu: not enough free Xe-linked card pairs"
        return NOT_ENOUGH_CARDS
    worst = max(sorted(counts), key=lambda res: counts[res])
    if worst == "blocked":
        return CARDS_HELD
    return NOT_ENOUGH_OF.format(worst)
