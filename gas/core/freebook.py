"""Free capacity per card as arrays, and first fit decided for many nodes at once.

kube-scheduler asks about up to thousands of nodes for every pod, and most pods are the
plain kind: one container asking for cards, placed by first fit in the node's card order.
For those, walking the nodes one by one in Python is what makes a filter slow. `FreeBook`
keeps, for every node, the free amount of each resource on each card (capacity minus the
sum of the holdings), which cards are blocked and whether the whole node is, as numpy
arrays updated in place as the book changes, and `FreeBook.decide` answers such a pod for
all the named nodes with a handful of array operations: the same cards and the same
reasons as `allocator.place` (tested against its general search, `shortcut=False`).

Which pods (`FreeBook.ask`): those `place` gives to its first-fit shortcut (one card-asking
container without tiles, first fit, no Xe link, no balanced resource) that also ask for no
single NUMA group, no same GPU, no card list that changes the card order (`gas-allow`,
`gas-deny` with those features on), and carry no annotation problem. Which nodes: those
with a readable node object, distinct card names and at most `MAX_SLOTS` usable cards.
Anything else is left to `place`: `decide` says which nodes it did not answer.

Layout: a node is a row; its usable cards in search order (the preferred card first, then
numeric order; disabled cards left out) are its slots; each resource any node has capacity
of is a column. `free[column, row, slot]` is capacity minus usage clamped to [-1, 2**63 - 1]
(exact for every need from 0 to 2**63 - 1, and never overflowing), meaningful where the
node has capacity of the resource (elsewhere the static check refuses first). Sets of a
node's cards (open, fitting, chosen) are 64-bit masks, bit i for slot i
(`gas.core.cardmasks`): counting and taking the first fitting cards are then a few
operations on one number per node. Pure and not thread-safe: the ledger uses it under its
lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

from gas.core.allocator import (
    CARD_TOO_SMALL,
    NO_RESOURCE,
    NODE_BLOCKED,
    TOO_FEW_CARDS,
    Policy,
    Rejection,
    annotation_problem,
    card_lists,
    card_order,
    lone_need,
)
from gas.core.answers import Answer
from gas.core.cardmasks import BoolArray, MaskArray, lowest, pack, picked
from gas.core.judgement import Judgement, Verdicts, judge_merged, shortages
from gas.core.model import Allocation, NodeGpu, PodRequest, Usage

BookView = tuple[Usage, Mapping[str, int], int]
"""What a node's book holds: usage per card, pods blocking each card, pods blocking it all."""
IntArray = npt.NDArray[np.int64]

MAX_SLOTS = 64
"""Usable cards a node may have for the arrays to decide it (the chosen cards of a node are
one 64-bit mask); nodes with more are left to `place`."""
INT64_MAX = 2**63 - 1
_FREE_FLOOR = -1  # any usage above capacity: no need from 0 up fits


@dataclass(frozen=True, slots=True)
class Ask:
    """A pod `FreeBook.decide` can answer: its card-asking container (`index` of
    `containers`), how many cards it wants and its need on each, in the request's order."""

    index: int
    containers: int
    gpus: int
    needs: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class _Layout:
    """The usable cards of a node in search order; shared by nodes with the same ones."""

    number: int
    cards: tuple[str, ...]
    slots: Mapping[str, int]


def _clamp(value: int) -> int:
    return min(max(value, _FREE_FLOOR), INT64_MAX)


def _slots_for(count: int) -> int:
    """Slots a row has room for: a whole number of 8 (see `pack`), at least 8."""
    return max(8, -(-count // 8) * 8)


class FreeBook:
    """The arrays for one ledger (so one placement policy): see the module docstring."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        # With a balanced resource no pod takes plain first fit: nothing to keep.
        self.enabled = not self.policy.balanced
        self._rows: dict[str, int] = {}
        self._row_layouts: list[_Layout | None] = []
        self._spare: list[int] = []
        self._columns: dict[str, int] = {}
        self._layouts: dict[tuple[str, ...], _Layout] = {}
        self._layout_list: list[_Layout] = []
        # The last names looked up and their rows: kube-scheduler often sends the same.
        self._last_names: list[str] | None = None
        self._last_rows: IntArray = np.zeros(0, np.int64)
        # Between `suspend` and `replace_books`, changes of the books are not followed.
        self._suspended = False
        # Changes so far, and the last answers with the count they were given at: the same
        # question about the same names with nothing changed gets them again.
        self._changes = 0
        self._memo: tuple[Ask, int, IntArray, list[Answer | None], list[int]] | None = None
        self._judged: tuple[Ask, int, IntArray, Verdicts, list[Answer], Judgement] | None = None
        # Changes of the nodes themselves (not their books), and for the last rows looked
        # up, at that count: their fewest usable cards and least capacity per column.
        self._node_changes = 0
        self._least: tuple[IntArray, int, tuple[int, list[int]] | None] | None = None
        # Allocations made so far, by the ask's container (index, count), the slots of a
        # row and the key of the chosen cards (see `_dynamic`): layouts keep their number
        # until every node is replaced.
        self._made: dict[tuple[int, int, int], dict[int, Allocation]] = {}
        self._allocate(0, 0, _slots_for(0))

    # ------------------------------------------------------------ storage

    def _allocate(self, columns: int, rows: int, slots: int) -> None:
        """Fresh, empty arrays: every row left to `place` until filled."""
        self._free: IntArray = np.full((columns, rows, slots), _FREE_FLOOR, np.int64)
        self._cap: IntArray = np.zeros((columns, rows), np.int64)
        self._open: MaskArray = np.zeros(rows, np.uint64)  # usable cards not blocked
        # Usable cards blocked: on a regular row always `_nslots` less the bits of `_open`,
        # kept rather than derived for speed (ranking a shortage then reads one array, not
        # three: a few microseconds a filter); tests check it against the derivation.
        self._nblocked: IntArray = np.zeros(rows, np.int64)
        self._blocking: IntArray = np.zeros(rows, np.int64)  # pods blocking the node
        self._ncards: IntArray = np.zeros(rows, np.int64)
        self._nslots: IntArray = np.zeros(rows, np.int64)  # usable cards
        self._layout: IntArray = np.zeros(rows, np.int64)
        self._regular: BoolArray = np.zeros(rows, np.bool_)

    def _grow(self, columns: int, rows: int, slots: int) -> None:
        """Room for at least `columns` resources, `rows` nodes and `slots` cards a node,
        keeping what is there (rows double, so adding nodes one by one is amortised)."""
        c, r, s = self._free.shape
        if columns <= c and rows <= r and slots <= s:
            return
        kept = (self._free, self._cap, self._open, *self._per_row())
        self._allocate(
            max(c, columns), max(r, rows, 2 * r if rows > r else 0), max(s, _slots_for(slots))
        )
        self._free[:c, :r, :s] = kept[0]
        self._cap[:c, :r] = kept[1]
        self._open[:r] = kept[2]
        for new, old in zip(self._per_row(), kept[3:], strict=True):
            new[:r] = old

    def _per_row(self) -> tuple[npt.NDArray[np.generic], ...]:
        return (
            self._nblocked,
            self._blocking,
            self._ncards,
            self._nslots,
            self._layout,
            self._regular,
        )

    def _layout_of(self, node: NodeGpu) -> _Layout:
        usable = card_order(node, self.policy)
        layout = self._layouts.get(usable)
        if layout is None:
            slots = {card: slot for slot, card in enumerate(usable)}
            layout = self._layouts[usable] = _Layout(len(self._layout_list), usable, slots)
            self._layout_list.append(layout)
        return layout

    def _slot(self, node: str, card: str) -> tuple[int, int] | None:
        """The row of `node` and slot of `card` on it, when the arrays decide the node (and
        follow its book)."""
        row = self._rows.get(node)
        if row is None or self._suspended:
            return None
        layout = self._row_layouts[row]
        slot = None if layout is None else layout.slots.get(card)
        return None if slot is None else (row, slot)

    # ------------------------------------------------------------ nodes and books

    def set_node(self, node: NodeGpu, book: BookView) -> None:
        """Add or replace `node`, whose book holds `book`."""
        self._changes += 1
        self._node_changes += 1
        if not self.enabled:
            return
        row = self._rows.get(node.name)
        if row is None:
            row = self._spare.pop() if self._spare else len(self._row_layouts)
            if row == len(self._row_layouts):
                self._row_layouts.append(None)
            self._rows[node.name] = row
            self._last_names = None
        self._grow(0, row + 1, 0)
        self._fill(row, node, book)

    def remove_node(self, name: str) -> None:
        self._changes += 1
        self._node_changes += 1
        row = self._rows.pop(name, None)
        if row is None:
            return
        self._last_names = None
        self._row_layouts[row] = None
        self._regular[row] = False
        self._spare.append(row)

    def replace_nodes(self, nodes: Iterable[NodeGpu], books: Mapping[str, BookView]) -> None:
        """Every node afresh, with its book from `books` by node name (absent: nothing
        held): after a relist of nodes."""
        self._changes += 1
        self._node_changes += 1
        if not self.enabled:
            return
        fresh = list({node.name: node for node in nodes}.values())  # the last of a name wins
        self._rows = {node.name: row for row, node in enumerate(fresh)}
        self._spare = []
        self._layouts = {}
        self._layout_list = []
        self._made = {}
        self._columns = {}
        self._last_names = None
        layouts = [self._regular_layout(node) for node in fresh]
        self._row_layouts = layouts
        widest = max((len(layout.cards) for layout in layouts if layout), default=0)
        self._allocate(len(self._columns), len(fresh), _slots_for(widest))
        count = len(fresh)
        self._regular[:count] = [layout is not None for layout in layouts]
        self._ncards[:count] = [len(node.cards) for node in fresh]
        self._nslots[:count] = [len(layout.cards) if layout else 0 for layout in layouts]
        self._layout[:count] = [layout.number if layout else 0 for layout in layouts]
        if count and self._columns:
            self._cap[:, :count] = np.array([self._capacity(node) for node in fresh], np.int64).T
        self.replace_books(books)

    def suspend(self) -> None:
        """Every book is about to be rebuilt, then given whole to `replace_books`: until
        then, changes of single books are not worth following."""
        self._changes += 1
        self._suspended = True

    def replace_books(self, books: Mapping[str, BookView]) -> None:
        """Every node's book afresh from `books` by node name (absent: nothing held): after
        a relist of pods. The nodes stay."""
        self._changes += 1
        self._suspended = False
        if not self.enabled:
            return
        slots = np.arange(self._free.shape[2])
        usable = (slots < self._nslots[:, None]) & self._regular[:, None]
        self._free[:] = np.where(usable, self._cap[:, :, None], _FREE_FLOOR)
        self._open[:] = pack(usable)
        self._nblocked[:] = 0
        self._blocking[:] = 0
        _, rows, slots_per_row = self._free.shape
        places: list[int] = []  # index into the flattened `free` of each amount
        amounts: list[int] = []
        # The loop below runs once per card and resource held in the cluster (about
        # 90,000 at 50,000 pods): lookups bound once, each column's offset added directly.
        per_column = rows * slots_per_row
        offset_of = {res: column * per_column for res, column in self._columns.items()}.get
        row_of, layouts = self._rows.get, self._row_layouts
        add_place, add_amount = places.append, amounts.append
        for name, (usage, blocked, blocking) in books.items():
            row = row_of(name)
            layout = None if row is None else layouts[row]
            if row is None or layout is None:
                continue
            if blocking:
                self._blocking[row] = blocking
            slot_of = layout.slots.get
            first = row * slots_per_row
            for card, resources in usage.items():
                slot = slot_of(card)
                if slot is not None:
                    base = first + slot
                    for res, used in resources.items():
                        offset = offset_of(res)
                        if offset is not None:
                            add_place(offset + base)
                            add_amount(used)
            for card, pods in blocked.items():
                self.set_blocked(name, card, pods)
        if not amounts:
            return
        flat = np.array(places, np.int64)
        column_of, rest = np.divmod(flat, per_column)
        capacity = self._cap[column_of, rest // slots_per_row]
        try:
            held: IntArray = np.array(amounts, np.int64)
            exact = bool(held.min() >= 0)
        except OverflowError:
            exact = False
        if exact:
            # Both in [0, 2**63 - 1]: the difference cannot overflow.
            self._free.reshape(-1)[flat] = np.maximum(capacity - held, _FREE_FLOOR)
        else:  # amounts beyond what an array holds: exactly, one by one
            for index, amount, cap in zip(places, amounts, capacity.tolist(), strict=True):
                self._free.reshape(-1)[index] = _clamp(cap - amount)

    def _regular_layout(self, node: NodeGpu) -> _Layout | None:
        """The node's layout when the arrays decide it (its resources then have columns;
        the arrays may need growing), else None."""
        layout = self._layout_of(node)
        if (
            node.problem is not None
            or len(set(node.cards)) != len(node.cards)
            or len(layout.cards) > MAX_SLOTS
        ):
            return None
        for res, amount in node.capacity.items():
            if amount > 0 and res not in self._columns:
                self._columns[res] = len(self._columns)
        return layout

    def _capacity(self, node: NodeGpu) -> list[int]:
        """The node's capacity per column, clamped to what an array holds (`place` reads
        any capacity up to 0 as none)."""
        capacity = [0] * len(self._columns)
        for res, column in self._columns.items():
            capacity[column] = min(max(node.capacity.get(res, 0), 0), INT64_MAX)
        return capacity

    def _fill(self, row: int, node: NodeGpu, book: BookView) -> None:
        usage, blocked, blocking = book
        layout = self._row_layouts[row] = self._regular_layout(node)
        self._regular[row] = layout is not None
        if layout is None:
            return
        cards = layout.cards
        self._grow(len(self._columns), 0, len(cards))
        self._ncards[row] = len(node.cards)
        self._nslots[row] = len(cards)
        self._layout[row] = layout.number
        self._blocking[row] = blocking
        capacity = self._capacity(node)
        self._cap[:, row] = capacity
        free = self._free[:, row, :]
        free[:] = _FREE_FLOOR
        free[:, : len(cards)] = np.array(capacity, np.int64)[:, None]
        for card, resources in usage.items():
            slot = layout.slots.get(card)
            if slot is not None:
                for res, used in resources.items():
                    at = self._columns.get(res)
                    if at is not None:
                        free[at, slot] = _clamp(capacity[at] - used)
        closed = {layout.slots[c] for c, pods in blocked.items() if pods > 0 and c in layout.slots}
        self._open[row] = sum(1 << slot for slot in range(len(cards)) if slot not in closed)
        self._nblocked[row] = len(closed)

    def set_usage(
        self, node: str, card: str, used: Mapping[str, int], changed: Iterable[str]
    ) -> None:
        """The book of `node` now holds `used` on `card`; the resources `changed` moved."""
        self._changes += 1
        place = self._slot(node, card)
        if place is None:
            return  # a card the node does not have, or a node left to `place`
        row, slot = place
        for res in changed:
            column = self._columns.get(res)
            if column is not None:
                capacity = int(self._cap[column, row])
                self._free[column, row, slot] = _clamp(capacity - used.get(res, 0))

    def set_blocked(self, node: str, card: str, pods: int) -> None:
        """`pods` pods whose annotation could not be read now block `card` of `node`."""
        self._changes += 1
        place = self._slot(node, card)
        if place is None:
            return
        row, slot = place
        bit = 1 << slot
        mask = int(self._open[row])
        was_open = bool(mask & bit)
        now_open = pods <= 0
        self._open[row] = mask | bit if now_open else mask & ~bit
        self._nblocked[row] += int(was_open) - int(now_open)

    def set_blocking(self, node: str, pods: int) -> None:
        """`pods` pods whose annotation named no card now block the whole of `node`."""
        self._changes += 1
        row = self._rows.get(node)
        if row is not None and not self._suspended:
            self._blocking[row] = pods

    # ------------------------------------------------------------ deciding

    def ask(self, request: PodRequest) -> Ask | None:
        """What `decide` needs of `request`, or None when `place` must answer it: pods
        `place` gives to its first-fit shortcut on any node (`lone_need`: NUMA groups
        could split the card order), no same-GPU group, no card list that changes the
        node's card order, no annotation problem."""
        policy = self.policy
        if not self.enabled or request.single_numa or request.same_gpu:
            return None
        index = lone_need(request, policy)
        if index is None:
            return None
        allow, deny = card_lists(request, policy)
        if allow is not None or deny or annotation_problem(request, policy) is not None:
            return None
        need = request.containers[index]
        needs = tuple(need.per_card().items())
        if not all(0 <= amount <= INT64_MAX for _, amount in needs):
            return None
        return Ask(index, len(request.containers), need.gpus, needs)

    def decide(self, ask: Ask, names: Sequence[str]) -> tuple[list[Answer | None], list[int]]:
        """The answer for each of `names`, in order, as `place` gives it on the node's
        current book; None for the nodes left to `place` (unknown to the book, not
        regular, or refused for a reason that needs the node object), whose indices come
        second."""
        rows = self._lookup(names)
        memo = self._memo
        if memo is not None and memo[2] is rows and memo[1] == self._changes and memo[0] == ask:
            return list(memo[3]), list(memo[4])
        found: list[Answer | None]
        if self._all_open(ask, rows):
            # The usual case: the usage decides every node, and no per-node bookkeeping
            # of which are decided is needed.
            found = list(self._dynamic(ask, rows))
            left_out: list[int] = []
        else:
            found, left_out = self._decide_each(ask, rows)
        self._memo = (ask, self._changes, rows, found, left_out)
        return list(found), list(left_out)

    def judge(
        self,
        ask: Ask,
        names: Sequence[str],
        fit: Callable[[list[str]], Sequence[Answer]] | None = None,
    ) -> Judgement | None:
        """What a filter answers of `decide`'s answers (`judgement.judge`), found without
        an answer per name where the arrays decide. The names they leave (unknown, not
        regular, or left to `place`) are answered by `fit`, given them in order; without
        `fit`, None when any is left."""
        rows = self._lookup(names)
        memo = self._judged
        kept: list[Answer] | None = None
        judged: Judgement | None = None
        if memo is not None and memo[2] is rows and memo[1] == self._changes and memo[0] == ask:
            part, kept, judged = memo[3], memo[4], memo[5]
        else:
            part = self._judge_part(ask, rows)
        left = part.left
        if left and fit is None:
            return None
        # The left names' answers are not followed by the change count (a node the arrays
        # do not decide may change without it): the judgement kept is given again only
        # for the same answers.
        answers = list(fit([names[i] for i in left])) if left and fit is not None else []
        if judged is None or answers != kept:
            judged = judge_merged(names, part, answers)
            self._judged = (ask, self._changes, rows, part, answers, judged)
        return judged.copy()

    def _judge_part(self, ask: Ask, rows: IntArray) -> Verdicts:
        """The verdict of each row the arrays decide, and which they leave."""
        short = shortages(tuple(res for res, _ in ask.needs))
        if self._all_open(ask, rows):
            # The usual case: the usage decides every row, and refuses none unresolvably.
            verdicts = self._verdicts(ask, rows, short.names, 0)
            return Verdicts(verdicts, short.rejections, short.texts, [])
        decided, where, code, table = self._static_each(ask, rows)
        opened = (code == _OPEN).nonzero()[0]
        if len(opened):
            code[opened] = self._verdicts(ask, rows[where[opened]], short.names, len(table))
        verdicts = np.full(len(rows), -1, np.int64)  # a left row's is given by its answer
        verdicts[where] = code
        left: list[int] = (~decided).nonzero()[0].tolist()
        return Verdicts(verdicts, [*table, *short.rejections], None, left)

    def _verdicts(self, ask: Ask, rows: IntArray, reasons: list[str], base: int) -> IntArray:
        """First fit on `rows` (the static checks passed): -1 for a row that passes, else
        `base` + its `_shortages` index."""
        open_, fits, _, passed = self._fit(ask, rows)
        if np.count_nonzero(passed) == len(rows):
            return np.full(len(rows), -1, np.int64)
        verdicts = self._shortages(ask, rows, open_ & ~fits, reasons)
        if base:
            verdicts += base
        verdicts[passed] = -1
        return verdicts

    def _decide_each(self, ask: Ask, rows: IntArray) -> tuple[list[Answer | None], list[int]]:
        """`decide` where some rows are unknown, not regular, or refused whatever the
        usage."""
        decided, where, code, table = self._static_each(ask, rows)
        out = np.empty(len(rows), object)
        fixed = code >= 0
        out[where[fixed]] = np.fromiter(table, object, len(table))[code[fixed]]
        undecided = (code == _OPEN).nonzero()[0]
        if len(undecided):
            answers = self._dynamic(ask, rows[where[undecided]])
            out[where[undecided]] = np.fromiter(answers, object, len(answers))
        found: list[Answer | None] = out.tolist()
        return found, (~decided).nonzero()[0].tolist()

    def _static_each(
        self, ask: Ask, rows: IntArray
    ) -> tuple[BoolArray, IntArray, IntArray, list[Rejection]]:
        """`_static` on the rows known and regular: which rows the arrays decide (not
        unknown, not regular, not `_LEFT`), the positions `_static` looked at, its codes
        for them and its table."""
        known = (rows >= 0).nonzero()[0]
        decided = np.zeros(len(rows), np.bool_)
        decided[known] = self._regular[rows[known]]
        where = decided.nonzero()[0]
        table: list[Rejection] = []
        code = self._static(ask, rows[where], table)
        decided[where[code == _LEFT]] = False
        return decided, where, code, table

    def _lookup(self, names: Sequence[str]) -> IntArray:
        """The row of each name, -1 for names not known: the same array as last time when
        the names are the same (what the last answers are kept for)."""
        listed = names if isinstance(names, list) else list(names)
        if self._last_names is not None and listed == self._last_names:
            return self._last_rows
        rows = np.fromiter(map(self._rows.get, listed, repeat(-1)), np.int64, len(listed))
        self._last_names, self._last_rows = list(listed), rows
        return rows

    def _all_open(self, ask: Ask, rows: IntArray) -> bool:
        """Whether every row is known and regular and no reason `_static` checks holds for
        any: from the least cards and capacities of the rows, kept while the names and
        the nodes stay the same, and whether any row has a blocking pod."""
        least = self._least
        if least is None or least[0] is not rows or least[1] != self._node_changes:
            least = self._least = (rows, self._node_changes, self._least_of(rows))
        bounds = least[2]
        if bounds is None or bounds[0] < ask.gpus:
            return False
        capacity = bounds[1]
        for res, amount in ask.needs:
            column = self._columns.get(res)
            if column is None or capacity[column] < max(amount, 1):
                return False
        blocking = self._blocking
        return not (np.count_nonzero(blocking) and np.count_nonzero(blocking.take(rows)))

    def _least_of(self, rows: IntArray) -> tuple[int, list[int]] | None:
        """The fewest usable cards and the least capacity per column of `rows`; None
        unless every row is known and regular."""
        if not len(rows) or rows.min() < 0 or not self._regular.take(rows).all():
            return None
        capacity: list[int] = self._cap.take(rows, axis=1).min(axis=1).tolist()
        return int(self._nslots.take(rows).min()), capacity

    def _static(self, ask: Ask, rows: IntArray, table: list[Rejection]) -> IntArray:
        """Reasons that hold whatever the usage, as `place` checks them in order: too few
        cards, a resource without capacity or with too little per card, a blocked node,
        too few usable cards (left to `place`: its reason names why they are unusable).
        The code of each row's answer in `table`, `_OPEN` where the usage decides."""
        code = np.full(len(rows), _OPEN, np.int64)
        gpus = ask.gpus
        ncards = self._ncards.take(rows)
        capacities = []
        trouble = ncards < gpus
        for res, amount in ask.needs:
            column = self._columns.get(res)
            if column is None:
                capacity = np.zeros(len(rows), np.int64)
            else:
                capacity = self._cap[column].take(rows)
            capacities.append((res, amount, capacity))
            trouble |= capacity < max(amount, 1)  # none, or too little
        blocking = self._blocking.take(rows) > 0
        few = self._nslots.take(rows) < gpus
        if not (trouble | blocking | few).any():
            return code  # the usual case: the usage decides every row
        short = ncards < gpus
        if short.any():
            for value in np.unique(ncards[short]).tolist():
                code[short & (ncards == value)] = len(table)
                table.append(Rejection(TOO_FEW_CARDS.format(gpus, value), True))
        for res, amount, capacity in capacities:
            open_ = code == _OPEN
            missing = open_ & (capacity <= 0)
            if missing.any():
                code[missing] = len(table)
                table.append(Rejection(NO_RESOURCE.format(res), True))
            small = open_ & ~missing & (capacity < amount)
            if small.any():
                code[small] = len(table)
                table.append(Rejection(CARD_TOO_SMALL.format(res), True))
        blocking &= code == _OPEN
        if blocking.any():
            code[blocking] = len(table)
            table.append(Rejection(NODE_BLOCKED, unresolvable=False))
        code[(code == _OPEN) & few] = _LEFT
        return code

    def _fit(self, ask: Ask, rows: IntArray) -> tuple[MaskArray, MaskArray, MaskArray, BoolArray]:
        """First fit on `rows` (the static checks passed): each row's open cards, its
        cards with room for each resource of the ask, its cards with room for all, and
        whether they are enough. Each resource's free amounts are compared in one pass
        and packed into a mask of cards per row."""
        count = len(rows)
        open_ = self._open.take(rows)
        needs = ask.needs
        slots = self._free.shape[2]
        if needs:
            room = np.empty((len(needs), count, slots), np.bool_)
            for index, (res, amount) in enumerate(needs):
                free = self._free[self._columns[res]].take(rows, axis=0)
                np.greater_equal(free, amount, out=room[index])
            fits = pack(room)
            fit = np.bitwise_and.reduce(fits) & open_
        else:
            fits = np.zeros((0, count), np.uint64)
            fit = open_
        return open_, fits, fit, (fit != 0) if ask.gpus == 1 else np.bitwise_count(fit) >= ask.gpus

    def _dynamic(self, ask: Ask, rows: IntArray) -> list[Answer]:
        """The answer of first fit on each of `rows` (the static checks passed). Every
        row gets a key: when enough cards fit, the cards it gets (its layout and chosen
        slots), else the negative number of its shortage (-1 - `_shortages`); each
        distinct key's answer is made once."""
        open_, fits, fit, passed = self._fit(ask, rows)
        count = len(rows)
        needs = ask.needs
        slots = self._free.shape[2]
        layouts = self._layout.take(rows)
        chosen = lowest(fit, ask.gpus)
        cards: Callable[[int], tuple[int, int]]  # a key's layout and chosen slots
        if slots <= _KEYED_SLOTS:
            keys = (layouts << slots) | chosen.astype(np.int64)
            cards = functools.partial(_split_key, slots)
            made = self._made.setdefault((ask.index, ask.containers, slots), {})
            if len(made) > _MADE_KEPT:
                made.clear()
        else:
            # Too many slots to share one number with the layout: pairs numbered.
            pairs = list(zip(layouts.tolist(), chosen.tolist(), strict=True))
            numbered = list(dict.fromkeys(pairs))
            number = {pair: index for index, pair in enumerate(numbered)}
            keys = np.fromiter(map(number.__getitem__, pairs), np.int64, count)
            cards = numbered.__getitem__
            made = {}
        rejections: list[Rejection] = []
        if np.count_nonzero(passed) < count:
            reasons, rejections, _ = shortages(tuple(res for res, _ in needs))
            lacking = open_ & ~fits
            keys = np.where(passed, keys, -1 - self._shortages(ask, rows, lacking, reasons))

        def answer(key: int) -> Answer:
            if key < 0:
                return rejections[-1 - key]
            allocation = made.get(key)
            if allocation is None:
                number, taken = cards(key)
                chose = picked(self._layout_list[number].cards, taken)
                allocation = tuple(chose if i == ask.index else () for i in range(ask.containers))
                made[key] = allocation
            return allocation

        return _by_key(keys, -2 - len(needs), answer)

    def _shortages(
        self, ask: Ask, rows: IntArray, lacking: MaskArray, reasons: list[str]
    ) -> IntArray:
        """As `allocator._shortage`: per row, what keeps the most usable cards out, ties
        to the first name in sorted order (`reasons`, "blocked" for blocked cards), as 1
        + its index there; 0 when nothing does. `lacking` holds, per resource of the ask,
        the open cards of each row without room for it."""
        # Row 0 stays 0: argmax, the first of the most, finds it when no other is more.
        ranked = np.zeros((len(reasons) + 1, len(rows)), np.int64)
        ranked[1 + reasons.index("blocked")] = self._nblocked.take(rows)
        where = [1 + reasons.index(res) for res, _ in ask.needs]
        ranked[where] = np.bitwise_count(lacking)
        best: IntArray = ranked.argmax(axis=0)
        return best


def _split_key(slots: int, key: int) -> tuple[int, int]:
    """The layout number and the chosen slots in a key of a row that passes."""
    return key >> slots, key & ((1 << slots) - 1)


def _by_key(keys: IntArray, low: int, answer: Callable[[int], Answer]) -> list[Answer]:
    """`answer(key)` for each of `keys` (none below `low`), made once per distinct key:
    found through a table indexed by key when the keys span little, else by sorting."""
    span = int(keys.max()) - low + 1
    if span <= _SPAN_PER_KEY * len(keys) + _SPAN:
        shifted = keys - low
        present = np.bincount(shifted).nonzero()[0]
        index = np.zeros(span, np.intp)
        index[present] = np.arange(len(present))
        made = np.fromiter((answer(key + low) for key in present.tolist()), object, len(present))
        found: list[Answer] = made[index[shifted]].tolist()
        return found
    distinct, inverse = np.unique(keys, return_inverse=True)
    made = np.fromiter(map(answer, distinct.tolist()), object, len(distinct))
    found = made[inverse.reshape(-1)].tolist()
    return found


_KEYED_SLOTS = 32
"""Slots a row may have for its layout number and chosen cards to share one int64."""
_MADE_KEPT = 100_000
"""Allocations kept per kind of ask (each a few cards of one layout)."""
_SPAN_PER_KEY, _SPAN = 4, 4096
"""How wide a span of keys is looked up through a table rather than sorted."""


_OPEN = -1
"""Code of a row whose answer the usage decides."""
_LEFT = -2
"""Code of a row `decide` leaves to `place`."""
