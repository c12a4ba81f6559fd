"""The ledger's answer cache: what `place` answered for each pod shape on each node, kept
until the node's book changes.

kube-scheduler asks about every node for every pod, pods mostly come in a few shapes, and
a bind changes one node. So an answer is kept until its node changes: the ledger calls
`AnswerCache.invalidate` for a node whenever that node's book changes (and `clear` when it
rebuilds every book), and an answer computed for another node object than the current one
is not used. A filter then computes afresh only the nodes that changed since the last pod
of its shape, and finds the others with a few C-level passes over the names.

What does not move with usage is kept longer: whether a pod shape fits a node with every
card idle (`allocator.fits_idle`, asked of each node a pod does not fit) is kept per pod
shape and kind of node, nodes whose descriptions are equal but for their names being of
one kind, so a filter over many nodes of a kind asks it once.

A kept answer is exactly what the search would answer now; `tests/unit/test_fast_paths.py`
checks that through any sequence of ledger changes. Not thread-safe: the ledger uses it
under its lock.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import compress, repeat
from typing import Protocol

from gas.core.allocator import (
    Placement,
    Policy,
    Rejection,
    Summary,
    fits_idle,
    place,
    summarize,
)
from gas.core.model import Allocation, NodeGpu, PodRequest, TileUsage, Usage

Answer = Allocation | Rejection

SHAPES_KEPT = 16
"""Pod shapes whose answers are kept (the most recently asked)."""
SHAPES_KNOWN = 10_000
"""Request shapes numbered at once (see `AnswerCache.answers`)."""
KINDS_KNOWN = 10_000
"""Node descriptions numbered at once (see `AnswerCache.kind`)."""
IDLE_KEPT = 4_096
"""Idle answers kept per pod shape (one per kind of node; nodes are mostly of a few)."""


class Book(Protocol):
    """What the cache reads of the sum of the holdings on one node (the ledger's book)."""

    @property
    def usage(self) -> Usage: ...

    @property
    def blocked(self) -> Mapping[str, int]: ...

    @property
    def blocking_pods(self) -> int: ...

    def tiles_used(self) -> TileUsage: ...


_NO_ENTRY = (object(), None)  # its node is no node's: never current
_NODE_OF = operator.itemgetter(0)
_ANSWER_OF = operator.itemgetter(1)


class Answers:
    """The answers for one pod shape: by node name, the node object each answer was
    computed for and the answer (no node object: the node was not known)."""

    __slots__ = ("entries", "idle")

    def __init__(self) -> None:
        self.entries: dict[str, tuple[NodeGpu | None, Answer]] = {}
        # By kind of node (`AnswerCache.kind`): whether the shape fits the node idle.
        self.idle: dict[int, bool] = {}

    def kept(
        self, names: Sequence[str], current: Sequence[NodeGpu | None]
    ) -> tuple[list[Answer | None], list[int]]:
        """The answers kept for `names`, whose current node objects are `current`, and
        the indices of those to compute afresh: none kept, or kept for another node
        object (their place in the answers holds None or an outdated answer)."""
        entries = list(map(self.entries.get, names, repeat(_NO_ENTRY)))
        stale = map(operator.is_not, current, map(_NODE_OF, entries))
        return list(map(_ANSWER_OF, entries)), list(compress(range(len(names)), stale))

    def get(self, node: NodeGpu) -> Answer | None:
        """The answer kept for `node`. A node object from a request equal to the one the
        answer was computed for (nodes change rarely) is as good as the same."""
        entry = self.entries.get(node.name)
        if entry is not None and (entry[0] is node or entry[0] == node):
            return entry[1]
        return None

    def keep(self, name: str, node: NodeGpu | None, answer: Answer, known: int) -> None:
        """Keep `answer` for node `name` as `node` is; `known` is how many nodes the ledger
        knows: twice as many entries, and the surplus is names of nodes long gone."""
        if len(self.entries) > 2 * known + 1000:
            self.entries.clear()
        self.entries[name] = (node, answer)


class _Derived:
    """What `place` is given about one node in one state of its book, computed once for
    all the pod shapes fitted to that state. The summary only once a second pod is: it
    costs more than one fit saves by it, and a bind's fit is often the only one before the
    bind changes the state."""

    __slots__ = ("blocked", "fits", "node", "summary", "tiles_used")

    def __init__(self, node: NodeGpu, book: Book) -> None:
        self.node = node
        self.blocked = frozenset(c for c, n in book.blocked.items() if n > 0)
        self.tiles_used = book.tiles_used()
        self.summary: Summary | None = None
        self.fits = 0


class AnswerCache:
    """The answers per pod shape and what they were derived from, for one ledger (so one
    placement policy)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._answers: dict[int, Answers] = {}  # by shape number, least recent first
        self._derived: dict[str, _Derived] = {}  # by node name
        self._shape_numbers: dict[Hashable, int] = {}
        self._shape_counter = itertools.count()
        self._kinds: dict[str, tuple[NodeGpu, int]] = {}  # by node name
        self._kind_numbers: dict[Hashable, int] = {}
        self._kind_counter = itertools.count()

    def answers(self, shape: Hashable) -> Answers:
        """The answers kept for pods of `shape` (a `request_shape`), now the most recent.

        Shapes are numbered: equal numbers get equal answers on equal node states, and a
        number is hashed in no time, unlike the shape."""
        number = self._shape_numbers.get(shape)
        if number is None:
            if len(self._shape_numbers) >= SHAPES_KNOWN:
                # Numbers are never reused, so answers kept under old ones just go unused.
                self._shape_numbers.clear()
            number = self._shape_numbers[shape] = next(self._shape_counter)
        answers = self._answers.pop(number, None)
        if answers is None:
            answers = Answers()
            while len(self._answers) >= SHAPES_KEPT:
                del self._answers[next(iter(self._answers))]
        self._answers[number] = answers
        return answers

    def kind(self, node: NodeGpu) -> int:
        """The number of `node`'s kind: equal for nodes whose descriptions are equal but
        for their names, so `place` answers alike on them with equal usage (and the idle
        check, which usage does not move, alike). Found once per node object."""
        known = self._kinds.get(node.name)
        if known is not None and known[0] is node:
            return known[1]
        description = node_description(node)
        number = self._kind_numbers.get(description)
        if number is None:
            if len(self._kind_numbers) >= KINDS_KNOWN:
                # Numbers are never reused: idle answers kept under old ones go unused.
                self._kind_numbers.clear()
            number = self._kind_numbers[description] = next(self._kind_counter)
        if len(self._kinds) >= 2 * KINDS_KNOWN:
            self._kinds.clear()  # mostly names of nodes long gone
        self._kinds[node.name] = (node, number)
        return number

    def place(
        self,
        node: NodeGpu,
        book: Book | None,
        request: PodRequest,
        answers: Answers | None = None,
    ) -> Placement | Rejection:
        """`place` for `request` on `node` holding `book` (None: nothing held), with what
        is derived from the book computed once for every pod fitted to its state, and,
        given the `answers` of the request's shape, the idle check remembered there per
        kind of node."""
        idle_fit = None if answers is None else self._idle_fit(node, request, answers)
        if book is None:
            return place(node, {}, request, policy=self.policy, idle_fit=idle_fit)
        derived = self._derived.get(node.name)
        if derived is None or derived.node is not node:
            derived = self._derived[node.name] = _Derived(node, book)
        derived.fits += 1
        if derived.summary is None and derived.fits > 1:
            derived.summary = summarize(node, book.usage, derived.blocked)
        return place(
            node,
            book.usage,
            request,
            blocked=derived.blocked,
            node_blocked=book.blocking_pods > 0,
            tiles_used=derived.tiles_used,
            policy=self.policy,
            summary=derived.summary,
            idle_fit=idle_fit,
        )

    def _idle_fit(self, node: NodeGpu, request: PodRequest, answers: Answers) -> Callable[[], bool]:
        """`fits_idle` of `request` on `node`, looked up when `place` asks for it (most fits
        never do) and remembered for the node's kind under the request's shape."""

        def idle_fit() -> bool:
            kind = self.kind(node)
            fits = answers.idle.get(kind)
            if fits is None:
                if len(answers.idle) >= IDLE_KEPT:
                    answers.idle.clear()
                fits = answers.idle[kind] = fits_idle(node, request, self.policy)
            return fits

        return idle_fit

    def invalidate(self, node: str) -> None:
        """The book of `node` changed: drop every answer and derivation made from it."""
        for answers in self._answers.values():
            answers.entries.pop(node, None)
        self._derived.pop(node, None)

    def clear(self) -> None:
        """Every book was rebuilt: drop everything (kinds depend on no book: kept)."""
        self._answers.clear()
        self._derived.clear()


def node_description(node: NodeGpu) -> Hashable:
    """A hashable copy of everything in `node` but its name, orders kept."""
    return tuple(
        _frozen(getattr(node, f.name)) for f in dataclasses.fields(node) if f.name != "name"
    )


def request_shape(request: PodRequest) -> Hashable:
    """A hashable copy of everything in `request`, orders kept (a reason can name the first
    resource in a container's order). Container names matter only to `gas-same-gpu`. Field
    by field rather than through `dataclasses.fields`: it is found for every prioritize and
    bind, and the generic walk cost several times more (a test in test_fast_paths.py holds
    the fields named here to the dataclass's)."""
    group = request.same_gpu
    containers = tuple(
        (need.name if need.name in group else None, need.gpus, tuple(need.requests.items()))
        for need in request.containers
    )
    rest = (
        request.allow,
        request.deny,
        group,
        request.xelink,
        request.single_numa,
        tuple(request.problems.items()),
        request.policy,
    )
    return containers, rest


def _frozen(value: object) -> Hashable:
    if isinstance(value, Mapping):
        return tuple((key, _frozen(item)) for key, item in value.items())
    if isinstance(value, tuple | list):
        return tuple(_frozen(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return type(value), tuple(_frozen(getattr(value, f.name)) for f in fields)
    try:
        hash(value)
    except TypeError:
        # A value of a kind this does not know (a future field): a key equal to no other,
        # so the answer is computed afresh rather than possibly shared wrongly.
        return object()
    return value
