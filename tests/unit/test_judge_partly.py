"""A filter the arrays can mostly decide: they judge the nodes they can, and only the
nodes they leave (unknown names, nodes not regular, too few usable cards) are fitted one
by one; the judgement is still exactly that of an answer per node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gas.core.allocator import Placement, Policy, Rejection
from gas.core.answers import Answer, Answers
from gas.core.freebook import FreeBook
from gas.core.holdings import PodHolding
from gas.core.judgement import Verdicts, judge, judge_merged, judge_verdicts
from gas.core.ledger import Ledger
from gas.core.model import I915, Allocation, NodeGpu, PodRequest
from tests.unit.test_fast_paths import MEMORY, MILLICORES, nodes, reference
from tests.unit.test_freebook import plain_request, plain_requests

ODD_KINDS = ("problem", "duplicate", "wide", "few")


def odd_node(name: str, kind: str, memory: int = 8) -> NodeGpu:
    """A node the arrays do not decide, or do not decide for a pod of two cards."""
    capacity = {I915: 4, MEMORY: memory, MILLICORES: 4}
    cards = ("card0", "card1", "card2", "card3")
    if kind == "problem":
        return NodeGpu(name, cards, capacity, problem="gpu: node labels are broken")
    if kind == "duplicate":
        return NodeGpu(name, ("card0", "card1", "card0"), capacity)
    if kind == "wide":
        return NodeGpu(name, tuple(f"card{n}" for n in range(65)), capacity)
    # One usable card: left to `place` for a pod of two or more.
    return NodeGpu(name, cards, capacity, disabled=frozenset(cards[1:]))


def answers_of(ledger: Ledger, request: PodRequest, names: list[str]) -> list[object]:
    return [reference(ledger, request, name, None) for name in names]


def assert_judged_as_each(ledger: Ledger, request: PodRequest, names: list[str]) -> None:
    judged = ledger.judge_names(request, names)
    answers = cast(list[Allocation | Rejection], answers_of(ledger, request, names))
    assert judged == judge(names, answers)
    assert judged == judge(names, ledger.check_names(request, names))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mixed_names_judged_as_each_node(data: st.DataObject) -> None:
    """Unknown names and irregular nodes among ordinary ones, with pods held and
    released: the judgement equals that of the general search's answer for every name,
    asked again (the kept judgement) and after changes."""
    ledger = Ledger(policy=data.draw(st.sampled_from([Policy(), Policy(allowlist=True)])))
    plain = [data.draw(nodes(f"p{n}", plain=True)) for n in range(data.draw(st.integers(0, 6)))]
    kinds = data.draw(st.lists(st.sampled_from(ODD_KINDS), max_size=4))
    odd = [odd_node(f"o{n}", kind, data.draw(st.integers(0, 8))) for n, kind in enumerate(kinds)]
    ledger.replace_nodes([*plain, *odd])
    known = [node.name for node in (*plain, *odd)]
    unknown = data.draw(st.lists(st.sampled_from(["gone", "later"]), max_size=2))
    names: list[str] = data.draw(st.permutations([*known, *unknown]))
    twice = data.draw(st.booleans())
    if names and twice:
        names = [*names, names[0]]  # a name asked twice
    requests = [data.draw(plain_requests()) for _ in range(3)]
    requests.append(plain_request(2, {MEMORY: 2}))
    for step in range(data.draw(st.integers(1, 8))):
        request = data.draw(st.sampled_from(requests))
        assert_judged_as_each(ledger, request, list(names))
        assert_judged_as_each(ledger, request, list(names))  # the same names again
        if not known:
            continue
        target = data.draw(st.sampled_from(known))
        uid = f"pod-{step}"
        action = data.draw(st.sampled_from(["bind", "bind", "release", "replace"]))
        if action == "bind":
            if not isinstance(ledger.reserve_placement(uid, "ns", uid, request, target), Rejection):
                ledger.commit(uid)
        elif action == "release":
            ledger.forget(f"pod-{data.draw(st.integers(0, step))}")
        else:
            kind = data.draw(st.sampled_from(ODD_KINDS))
            ledger.set_node(odd_node(target, kind, data.draw(st.integers(0, 8))))


def test_only_the_left_nodes_are_fitted_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One node with a problem, one with duplicate cards, one of too many cards, one with
    too few usable cards, and a name gas does not know: only those are fitted node by
    node; the other nodes are judged by the arrays."""
    ledger = Ledger()
    plain = [NodeGpu(f"n{i}", ("card0", "card1"), {I915: 4, MEMORY: 8}) for i in range(40)]
    odd = [odd_node(f"odd-{kind}", kind) for kind in ODD_KINDS]
    ledger.replace_nodes([*plain[:20], *odd, *plain[20:]])
    names = [*(n.name for n in plain[:20]), "gone", *(n.name for n in odd)]
    names += [n.name for n in plain[20:]]
    left = ["gone", *(n.name for n in odd)]
    fitted: list[list[str]] = []
    placed: list[str] = []
    check_names, place = ledger._check_names, ledger._place

    def counting_check_names(
        request: PodRequest, asked: Sequence[str], own: PodHolding | None, answers: Answers
    ) -> list[Allocation | Rejection]:
        fitted.append(list(asked))
        return check_names(request, asked, own, answers)

    def counting_place(
        node: NodeGpu, request: PodRequest, own: PodHolding | None, answers: Answers | None = None
    ) -> Placement | Rejection:
        placed.append(node.name)
        return place(node, request, own, answers)

    monkeypatch.setattr(ledger, "_check_names", counting_check_names)
    monkeypatch.setattr(ledger, "_place", counting_place)
    request = plain_request(2, {MEMORY: 4})
    for _ in range(2):
        assert_judged_as_each(ledger, request, names)
    # Each judgement fitted the left names alone (the second from the answers kept), and
    # each `check_names` for the comparison fitted them again.
    assert fitted == [left] * 4
    assert sorted(placed) == sorted(n.name for n in odd)  # once each: the answers are kept
    judged = ledger.judge_names(request, names)
    # Duplicate card names and many cards do not stop `place`; the others refuse.
    expected = [*(n.name for n in plain[:20]), "odd-duplicate", "odd-wide"]
    assert judged.passed == expected + [n.name for n in plain[20:]]
    assert set(judged.unresolvable) | set(judged.failed) == {"gone", "odd-problem", "odd-few"}


def test_a_left_node_that_changes_changes_the_judgement() -> None:
    """The judgement kept for the same names and pod follows the nodes the arrays leave."""
    ledger = Ledger()
    ledger.replace_nodes(
        [NodeGpu("a", ("card0",), {I915: 1, MEMORY: 8}), odd_node("odd", "problem")]
    )
    request = plain_request(1, {MEMORY: 4})
    names = ["a", "odd"]
    assert ledger.judge_names(request, names).unresolvable == {"odd": "gpu: node labels are broken"}
    ledger.set_node(NodeGpu("odd", ("card0",), {I915: 1, MEMORY: 8}, problem="gpu: other"))
    assert ledger.judge_names(request, names).unresolvable == {"odd": "gpu: other"}
    ledger.set_node(odd_node("odd", "duplicate"))
    assert_judged_as_each(ledger, request, names)
    assert ledger.judge_names(request, names).passed == ["a", "odd"]


@settings(max_examples=200, deadline=None)
@given(
    table=st.lists(
        st.builds(Rejection, st.sampled_from(["short", "held", "broken", "gone"]), st.booleans()),
        min_size=1,
        max_size=5,
    ),
    picks=st.lists(st.integers(-3, 8), max_size=20),
    copies=st.integers(0, 30),
    lasting=st.integers(0, 4),
    repeat=st.booleans(),
)
def test_verdicts_judged_as_answers(
    table: list[Rejection], picks: list[int], copies: int, lasting: int, repeat: bool
) -> None:
    """`judge_verdicts` and `judge_merged` give what `judge` gives of the same answers,
    whether lasting refusals are few among many (moved one by one) or not."""
    rejections = [*table, Rejection("gpu: node labels are broken", True)]
    # Mostly refusals, and up to four for a lasting node problem.
    verdicts = [p % len(table) if p >= 0 else -1 for p in picks] * copies
    verdicts[:lasting] = [len(table)] * min(lasting, len(verdicts))
    names = [f"n{i}" for i in range(len(verdicts))]
    if repeat and names:  # a name asked twice has one verdict
        names.append(names[-1])
        verdicts.append(verdicts[-1])
    answers: list[Allocation | Rejection] = [
        (("card0",),) if v < 0 else rejections[v] for v in verdicts
    ]
    expected = judge(names, answers)
    array = np.array(verdicts, np.int64)
    assert judge_verdicts(names, array, rejections) == expected
    left = [i for i in range(len(names)) if i % 3 == 0]
    marked = np.where(np.isin(np.arange(len(names)), left), -2, array)
    part = Verdicts(marked, rejections, None, left)
    assert judge_merged(names, part, [answers[i] for i in left]) == expected


def test_kept_judgement_follows_the_left_answers() -> None:
    """`FreeBook.judge` gives its last judgement again for the same names and ask with
    nothing changed in the arrays only when the left names' answers are the same too (the
    arrays do not follow the nodes they leave); without `fit`, None when any is left."""
    free = FreeBook(Policy())
    free.set_node(NodeGpu("a", ("card0",), {I915: 1, MEMORY: 8}), ({}, {}, 0))
    ask = free.ask(plain_request(1, {MEMORY: 4}))
    assert ask is not None
    names = ["gone", "a", "later"]
    fits = (("card0",),)
    given_names: list[list[str]] = []
    for answer in (Rejection("gpu: node is not known to gas", False), fits, fits):

        def fit(left: list[str], answer: Allocation | Rejection = answer) -> list[Answer]:
            given_names.append(left)
            return [answer] * len(left)

        assert free.judge(ask, names, fit) == judge(names, [answer, fits, answer])
    assert given_names == [["gone", "later"]] * 3
    assert free.judge(ask, names) is None
    assert free.judge(ask, ["a"]) == judge(["a"], [fits])
