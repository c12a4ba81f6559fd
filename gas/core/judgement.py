"""What a filter answers of the nodes it was asked about: which pass, and why the others
do not.

`judge` reads it off an answer per node (`Ledger.check_names`); `FreeBook.judge` finds the
same without making an answer per node, for the pods and nodes its arrays decide.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from gas.core.allocator import CARDS_HELD, NOT_ENOUGH_CARDS, NOT_ENOUGH_OF, Rejection
from gas.core.model import Allocation


class Judgement(NamedTuple):
    """The names that pass; the reason for each other name, split into those that idle
    cards would not change (unresolvable) and the others (failed); and how many names
    each reason was given for. The names in the order they were asked about; the counts
    in no set order."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    counts: dict[str, int]

    def copy(self) -> Judgement:
        return Judgement(
            list(self.passed), dict(self.failed), dict(self.unresolvable), dict(self.counts)
        )


def judge(names: Sequence[str], answers: Sequence[Allocation | Rejection]) -> Judgement:
    """The judgement of `names` from the answer for each. A filter judges thousands of
    nodes: every step is a C-level pass over them rather than a Python loop."""
    refused = list(map(isinstance, answers, repeat(Rejection)))
    passed = list(compress(names, map(operator.not_, refused)))
    rejections = list(compress(answers, refused))
    refused_names = list(compress(names, refused))
    reasons: list[str] = list(map(_REASON, rejections))
    if any(map(_UNRESOLVABLE, rejections)):
        final = list(map(_UNRESOLVABLE, rejections))
        # Two zips rather than one list of pairs: zip reuses its tuple as dict() consumes
        # it, where a list would hold thousands of tuples for the garbage collector.
        pairs = zip(refused_names, reasons, strict=True)
        failed = dict(compress(pairs, map(operator.not_, final)))
        unresolvable = dict(compress(zip(refused_names, reasons, strict=True), final))
    else:  # the usual case: a pass over the refusals less
        failed, unresolvable = dict(zip(refused_names, reasons, strict=True)), {}
    return Judgement(passed, failed, unresolvable, Counter(reasons))


def judge_verdicts(
    names: Sequence[str],
    verdicts: npt.NDArray[np.int64],
    rejections: Sequence[Rejection],
    texts: npt.NDArray[np.object_] | None = None,
) -> Judgement:
    """The judgement of `names` from a verdict for each: -1 when it passes, else the index
    of its rejection in `rejections` (whose reasons `texts` holds, when given)."""
    refused = verdicts >= 0
    which = verdicts[refused]
    passed = list(compress(names, (~refused).tolist()))
    if texts is None:
        texts = np.array([r.reason for r in rejections], object)
    reasons = texts[which].tolist()
    counts: dict[str, int] = {}
    tally = np.bincount(which, minlength=len(rejections)).tolist()
    for rejection, count in zip(rejections, tally, strict=True):
        if count:
            counts[rejection.reason] = counts.get(rejection.reason, 0) + count
    refused_names = list(compress(names, refused.tolist()))
    if not any(r.unresolvable for r in rejections):
        return Judgement(passed, dict(zip(refused_names, reasons, strict=True)), {}, counts)
    lasting_rows = np.array([r.unresolvable for r in rejections], np.bool_)[which]
    few = lasting_rows.nonzero()[0].tolist()
    if len(few) * _FEW_LASTING <= len(refused_names):
        # Often a node or two with a lasting problem among thousands refused for want of
        # room: those moved across rather than the refusals split in two passes. A name
        # asked twice has one answer, so one reason in one of the two.
        failed = dict(zip(refused_names, reasons, strict=True))
        unresolvable = {}
        for index in few:
            name = refused_names[index]
            failed.pop(name, None)
            unresolvable[name] = reasons[index]
        return Judgement(passed, failed, unresolvable, counts)
    lasting = lasting_rows.tolist()
    pairs = zip(refused_names, reasons, strict=True)
    failed = dict(compress(pairs, map(operator.not_, lasting)))
    unresolvable = dict(compress(zip(refused_names, reasons, strict=True), lasting))
    return Judgement(passed, failed, unresolvable, counts)


class Verdicts(NamedTuple):
    """What the arrays find of the names asked: a verdict for each (as `judge_verdicts`
    reads them), the rejections they index and their reasons (when at hand), and the
    positions of the names they leave, whose verdicts their answers give."""

    verdicts: npt.NDArray[np.int64]
    rejections: Sequence[Rejection]
    texts: npt.NDArray[np.object_] | None
    left: list[int]


def judge_merged(
    names: Sequence[str], part: Verdicts, answers: Sequence[Allocation | Rejection]
) -> Judgement:
    """The judgement of `names` from `part` and the answers for its left positions, in
    their order: as `judge` of an answer for every name."""
    if not part.left:
        return judge_verdicts(names, part.verdicts, part.rejections, part.texts)
    verdicts = part.verdicts.copy()
    rejections = list(part.rejections)
    for position, answer in zip(part.left, answers, strict=True):
        if isinstance(answer, Rejection):
            verdicts[position] = len(rejections)
            rejections.append(answer)
        else:
            verdicts[position] = -1
    return judge_verdicts(names, verdicts, rejections)


class Shortages(NamedTuple):
    """What can keep the cards a pod asks for out, in sorted order (each resource it asks
    for, "blocked" for blocked cards); the rejection naming each, after the one for none
    in particular, as `allocator._shortage` words them; and their reasons."""

    names: list[str]
    rejections: list[Rejection]
    texts: npt.NDArray[np.object_]


@functools.lru_cache(maxsize=256)
def shortages(resources: tuple[str, ...]) -> Shortages:
    """The `Shortages` of a pod asking for `resources`."""
    names = sorted(["blocked", *resources])
    named = [
        Rejection(CARDS_HELD if name == "blocked" else NOT_ENOUGH_OF.format(name), False)
        for name in names
    ]
    rejections = [_NOT_ENOUGH, *named]
    return Shortages(names, rejections, np.array([r.reason for r in rejections], object))


_NOT_ENOUGH = Rejection(NOT_ENOUGH_CARDS, False)
_FEW_LASTING = 16
"""Lasting refusals at most one in this many of all: moved one by one (`judge_verdicts`)."""
_REASON = attrgetter("reason")
_UNRESOLVABLE = attrgetter("unresolvable")
