"""What a filter answers of the nodes it was asked about: which pass, and why the others
do not.

`judge` reads it off an answer per node (`Ledger.check_names`); `FreeBook.judge` finds the
same without making an answer per node, for the pods and nodes its arrays decide.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter
from typing import NamedTuple

from gas.core.allocator import Rejection
from gas.core.model import Allocation


class Judgement(NamedTuple):
    """The names that pass; the reason for each other name, split into those that idle
    cards would not change (unresolvable) and the others (failed); and how many names
    each reason was given for. Each in the order of the names asked about."""

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


def judge_refusals(
    names: Sequence[str],
    passing: list[bool],
    refused: list[bool],
    refusals: list[str],
    counts: dict[str, int],
) -> Judgement:
    """The judgement of `names` where the `passing` ones pass and each `refused` one is
    refused, not unresolvable, for the reason next in `refusals`; `counts` counts those
    reasons."""
    passed = list(compress(names, passing))
    failed = dict(zip(compress(names, refused), refusals, strict=True))
    return Judgement(passed, failed, {}, counts)


_REASON = attrgetter("reason")
_UNRESOLVABLE = attrgetter("unresolvable")
