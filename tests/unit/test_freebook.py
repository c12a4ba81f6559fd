"""The arrays decide as the general search: same pass or fail, same cards, same reasons.

`FreeBook.decide` answers plain first-fit pods for many nodes at once from arrays of free
capacity kept up to date through every change of the books; wherever it answers, it must
answer exactly what `place(..., shortcut=False)` answers on the node's current book, and it
may leave only nodes it cannot decide to `place`.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gas.core.allocator import NODE_BLOCKED, Placement, Policy, Rejection, place
from gas.core.cardmasks import pack
from gas.core.freebook import MAX_SLOTS, FreeBook
from gas.core.holdings import PodObservation, observe_pod
from gas.core.judgement import judge
from gas.core.ledger import Ledger
from gas.core.model import (
    ANNOTATION_ALLOW,
    ANNOTATION_DENY,
    ANNOTATION_POLICY,
    I915,
    Allocation,
    NodeGpu,
    PodRequest,
    pod_request,
)
from tests.unit.test_fast_paths import (
    MEMORY,
    MILLICORES,
    holding_on,
    nodes,
    policies,
    reference,
    requests_for,
)

Usage = dict[str, dict[str, int]]


@dataclass
class Book:
    """A node's book as the ledger keeps it: the sum of its holdings."""

    usage: Usage = field(default_factory=dict)
    blocked: dict[str, int] = field(default_factory=dict)
    blocking: int = 0


@dataclass(frozen=True)
class Hold:
    """What one pod holds on one node."""

    usage: Mapping[str, Mapping[str, int]]
    blocked: frozenset[str] = frozenset()
    blocks_node: bool = False


class Model:
    """Nodes and books, with a `FreeBook` told of every change as the ledger tells it."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.free = FreeBook(policy)
        self.nodes: dict[str, NodeGpu] = {}
        self.books: dict[str, Book] = {}
        self.judged = 0  # calls of `compare` that `FreeBook.judge` answered

    def view(self, name: str) -> tuple[Usage, dict[str, int], int]:
        book = self.books.get(name, Book())
        return book.usage, book.blocked, book.blocking

    def set_node(self, node: NodeGpu) -> None:
        self.nodes[node.name] = node
        self.free.set_node(node, self.view(node.name))

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.free.remove_node(name)

    def relist(self) -> None:
        self.free.replace_nodes(self.nodes.values(), {name: self.view(name) for name in self.books})

    def relist_pods(self) -> None:
        self.free.replace_books({name: self.view(name) for name in self.books})

    def apply(self, node: str, hold: Hold, sign: int) -> None:
        book = self.books.setdefault(node, Book())
        for card, resources in hold.usage.items():
            used = book.usage.setdefault(card, {})
            for res, amount in resources.items():
                used[res] = used.get(res, 0) + sign * amount
                if not used[res]:
                    del used[res]
            self.free.set_usage(node, card, used, resources)
            if not used:
                del book.usage[card]
        for card in hold.blocked:
            book.blocked[card] = book.blocked.get(card, 0) + sign
            self.free.set_blocked(node, card, book.blocked[card])
        if hold.blocks_node:
            book.blocking += sign
            self.free.set_blocking(node, book.blocking)

    def reference(self, request: PodRequest, name: str) -> Allocation | Rejection:
        node = self.nodes[name]
        usage, blocked, blocking = self.view(name)
        result = place(
            node,
            usage,
            request,
            blocked=frozenset(c for c, n in blocked.items() if n > 0),
            node_blocked=blocking > 0,
            policy=self.policy,
            shortcut=False,
        )
        return result.cards if isinstance(result, Placement) else result

    def compare(self, request: PodRequest, names: list[str]) -> tuple[int, int]:
        """Decide `names` and check every answer; how many were decided and left."""
        ask = self.free.ask(request)
        if ask is None:
            return 0, 0
        answers, left = self.free.decide(ask, names)
        assert len(answers) == len(names)
        for index, (name, answer) in enumerate(zip(names, answers, strict=True)):
            if answer is None:
                assert index in left
                continue
            assert index not in left
            assert answer == self.reference(request, name), name
        for index in left:
            # Only nodes the arrays cannot decide: unknown, irregular, or too few usable.
            node = self.nodes.get(names[index])
            assert node is None or plain_node_left(node, request), names[index]
        judged = self.free.judge(ask, names)
        if judged is not None:
            # Given only where the usage decides every name: what a filter makes of the
            # general search's answers.
            assert not left
            assert judged == judge(names, [self.reference(request, name) for name in names])
            self.judged += 1
        return len(names) - len(left), len(left)


def assert_blocked_counts_derived(free: FreeBook) -> None:
    """The blocked cards a `FreeBook` counts per row, kept for speed, are what the rest of
    its state says: on every regular row, its usable cards less its open ones."""
    regular = free._regular.nonzero()[0]
    derived = free._nslots[regular] - np.bitwise_count(free._open[regular])
    assert free._nblocked[regular].tolist() == derived.tolist()


def plain_node_left(node: NodeGpu, request: PodRequest) -> bool:
    """Whether `decide` may leave `node` to `place` for `request`."""
    usable = [c for c in node.cards if c not in node.disabled]
    gpus = max(need.gpus for need in request.containers)
    return (
        node.problem is not None
        or len(set(node.cards)) != len(node.cards)
        or len(usable) > MAX_SLOTS
        or len(usable) < gpus
    )


def plain_request(
    gpus: int, limits: dict[str, int], annotations: dict[str, str] | None = None
) -> PodRequest:
    merged = {I915: str(gpus), **{res: str(amount) for res, amount in limits.items()}}
    pod: dict[str, Any] = {
        "metadata": {"annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": merged}}]},
    }
    return pod_request(pod)


# ---------------------------------------------------------------- masks


@given(st.lists(st.lists(st.booleans(), min_size=64, max_size=64), min_size=1, max_size=20))
def test_pack_sets_bit_i_for_column_i(rows: list[list[bool]]) -> None:
    for width in (8, 16, 24, 64):
        cards = np.array([row[:width] for row in rows], np.bool_)
        expected = [sum(1 << i for i, on in enumerate(row[:width]) if on) for row in rows]
        assert pack(cards).tolist() == expected


def test_pack_knows_every_byte() -> None:
    cards = np.array([[n >> i & 1 for i in range(8)] for n in range(256)], np.bool_)
    assert pack(cards).tolist() == list(range(256))


# ---------------------------------------------------------------- which pods


def test_ask_takes_only_plain_first_fit_pods() -> None:
    free = FreeBook(Policy(allowlist=True, denylist=True))
    assert free.ask(plain_request(2, {MEMORY: 4})) is not None
    assert free.ask(plain_request(1, {MEMORY: 4}, {ANNOTATION_ALLOW: "card1"})) is None
    assert free.ask(plain_request(1, {MEMORY: 4}, {ANNOTATION_DENY: "card1"})) is None
    assert free.ask(plain_request(1, {MEMORY: 4}, {ANNOTATION_POLICY: "binpack"})) is None
    assert free.ask(plain_request(1, {"gpu.intel.com/tiles": 1})) is None
    # gas-allow and gas-deny change nothing while their features are off.
    lax = FreeBook(Policy())
    assert lax.ask(plain_request(1, {MEMORY: 4}, {ANNOTATION_DENY: "card1"})) is not None
    assert lax.ask(plain_request(1, {MEMORY: 4}, {ANNOTATION_ALLOW: ""})) is not None
    # With a balanced resource no pod takes plain first fit.
    assert FreeBook(Policy(balanced_resource="i915")).ask(plain_request(1, {})) is None


# ---------------------------------------------------------------- exactness

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = ("n0", "n1", "n2", "n3")


@st.composite
def holds(draw: st.DrawFn, cards: tuple[str, ...]) -> Hold:
    resources = st.sampled_from([I915, MEMORY, MILLICORES, "gpu.intel.com/tiles"])
    per_card = st.dictionaries(resources, st.integers(0, 5), max_size=3)
    usage = draw(st.dictionaries(st.sampled_from([*cards, "card42"]), per_card, max_size=3))
    blocked = (
        frozenset(draw(st.sets(st.sampled_from(cards), max_size=2)))
        if draw(st.sampled_from([False] * 6 + [True]))
        else frozenset()
    )
    return Hold(usage, blocked, draw(st.sampled_from([False] * 15 + [True])))


operations = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "check",
                "check",
                "hold",
                "hold",
                "hold",
                "release",
                "set_node",
                "remove_node",
                "relist",
                "relist_pods",
            ]
        ),
        st.sampled_from(NAMES),
        st.integers(0, 7),
    ),
    min_size=1,
    max_size=40,
)


@EXAMPLES
@given(data=st.data())
def test_decide_matches_the_search_through_changes(data: st.DataObject) -> None:
    policy = data.draw(policies)
    model = Model(policy)
    pool = {
        name: [data.draw(nodes(name, plain=data.draw(st.booleans()))) for _ in range(2)]
        for name in NAMES
    }
    for name in NAMES:
        model.set_node(pool[name][0])
    all_cards = tuple(sorted({c for p in pool.values() for n in p for c in n.cards}))
    requests = [data.draw(requests_for(all_cards)) for _ in range(3)]
    requests += [
        plain_request(data.draw(st.integers(1, 3)), {MEMORY: data.draw(st.integers(0, 12))})
    ]
    held: dict[int, tuple[str, Hold]] = {}
    for op, name, which in data.draw(operations):
        if op == "check":
            names = [*NAMES, "unknown", NAMES[which % len(NAMES)]]
            known = [n for n in NAMES if n in model.nodes]
            for request in requests:
                model.compare(request, names)
                if known:  # every name known, one twice: judged when all are regular
                    model.compare(request, [*known, known[which % len(known)]])
        elif op == "hold":
            if which in held:
                model.apply(*held.pop(which), -1)
            cards = model.nodes[name].cards if name in model.nodes else pool[name][0].cards
            hold = data.draw(holds(cards))
            held[which] = (name, hold)
            model.apply(name, hold, +1)
        elif op == "release" and which in held:
            model.apply(*held.pop(which), -1)
        elif op == "set_node":
            model.set_node(pool[name][which % 2])
        elif op == "remove_node":
            model.remove_node(name)
        elif op == "relist":
            model.relist()
        elif op == "relist_pods":
            model.relist_pods()
        assert_blocked_counts_derived(model.free)
    for request in requests:
        model.compare(request, [*NAMES])


def test_decide_over_many_busy_nodes() -> None:
    """Seeded random clusters, decided at once, where every kind of answer occurs: cards
    found, each resource short, cards blocked, nodes blocked, too few cards."""
    rng = random.Random(11)
    outcomes: collections.Counter[str] = collections.Counter()
    decided = left = judged = 0
    for _ in range(40):
        policy = Policy(denylist=rng.random() < 0.5)
        model = Model(policy)
        for index in range(rng.randint(1, 60)):
            count = rng.choice([1, 2, 4, 8, 8, 12])
            cards = tuple(f"card{n}" for n in sorted(rng.sample(range(16), count)))
            capacity = {I915: rng.choice([1, 2, 4, 8]), MEMORY: rng.choice([4, 8, 16])}
            if rng.random() < 0.3:
                capacity[MILLICORES] = rng.choice([100, 1000])
            model.set_node(
                NodeGpu(
                    f"node-{index}",
                    cards,
                    capacity,
                    disabled=frozenset(rng.sample(cards, 1)) if rng.random() < 0.1 else frozenset(),
                    preferred=rng.choice(cards) if rng.random() < 0.2 else None,
                    problem="gpu: broken" if rng.random() < 0.02 else None,
                )
            )
        names = list(model.nodes)
        for _ in range(rng.randint(0, 400)):
            name = rng.choice(names)
            node = model.nodes[name]
            card = rng.choice(node.cards)
            usage = {
                card: {res: rng.randint(0, max(1, cap // 2)) for res, cap in node.capacity.items()}
            }
            blocked = frozenset({rng.choice(node.cards)}) if rng.random() < 0.02 else frozenset()
            model.apply(name, Hold(usage, blocked, rng.random() < 0.005), +1)
        assert_blocked_counts_derived(model.free)
        if rng.random() < 0.3:
            model.relist()
        elif rng.random() < 0.3:
            model.relist_pods()
        assert_blocked_counts_derived(model.free)
        for _ in range(10):
            gpus = rng.choice([1, 1, 2, 3, 4, 9])
            limits = {MEMORY: gpus * rng.randint(0, 9)}
            if rng.random() < 0.3:
                limits[MILLICORES] = gpus * rng.choice([0, 100, 300])
            request = plain_request(gpus, limits)
            ask = model.free.ask(request)
            assert ask is not None
            got, scalar = model.compare(request, [*names, "gone"])
            decided += got
            left += scalar
            model.compare(request, names)
            judged += model.judged
            model.judged = 0
            answers, _ = model.free.decide(ask, names)
            for answer in answers:
                outcomes[answer.reason if isinstance(answer, Rejection) else "fit"] += 1
    assert decided > 10 * left
    assert judged > 100
    assert outcomes["fit"] > 1000
    assert outcomes["gpu: not enough free gpu.intel.com/memory.max on the node's cards"] > 100
    assert outcomes["gpu: not enough free gpu.intel.com/i915 on the node's cards"] > 100
    assert outcomes["gpu: not enough free gpu.intel.com/millicores on the node's cards"] > 10
    assert outcomes["gpu: node has no gpu.intel.com/millicores per card"] > 10
    assert outcomes["gpu: node has a pod with an unreadable gas-container-cards annotation"] > 0
    assert (
        outcomes["gpu: cards are held by a pod with an unreadable gas-container-cards annotation"]
        > 0
    )
    assert any(r.startswith("gpu: container asks for 9 cards, node has") for r in outcomes)


def test_wide_nodes_take_the_same_cards() -> None:
    """Nodes with more usable cards than a key holds beside its layout (33 to 64): the
    chosen cards are numbered per filter instead, and answer as the search does."""
    rng = random.Random(5)
    model = Model(Policy())
    for index in range(30):
        count = rng.choice([4, 33, 40, 64])
        cards = tuple(f"card{n}" for n in range(count))
        model.set_node(NodeGpu(f"node-{index}", cards, {I915: 2 * count, MEMORY: 16 * count}))
    names = list(model.nodes)
    for _ in range(300):
        name = rng.choice(names)
        card = rng.choice(model.nodes[name].cards)
        model.apply(name, Hold({card: {MEMORY: rng.randint(1, 16)}}), +1)
    fits = 0
    for gpus in (1, 2, 3, 5, 8, 33):
        for memory in (1, 6, 12):
            request = plain_request(gpus, {MEMORY: gpus * memory})
            assert model.compare(request, names) == (len(names), 0)
            ask = model.free.ask(request)
            assert ask is not None
            answers, _ = model.free.decide(ask, names)
            fits += sum(not isinstance(answer, Rejection) for answer in answers)
    assert fits > 100
    # Judged without an answer per node, nodes with too few cards (unresolvable) as well.
    assert model.judged == 18


def test_kept_answers_are_for_the_names_asked() -> None:
    """The last answers of `decide` and of `judge` are given again only for the names
    they were made for, whichever of the two looked names up last."""
    model = Model(Policy())
    model.set_node(NodeGpu("a", ("card0",), {I915: 1, MEMORY: 8}))
    model.set_node(NodeGpu("b", ("card0",), {I915: 1, MEMORY: 4}))
    ask = model.free.ask(plain_request(1, {MEMORY: 6}))
    assert ask is not None
    fits = (("card0",),)
    short = Rejection(
        "gpu: container needs more gpu.intel.com/memory.max per card than a card has", True
    )
    for _ in range(2):
        assert model.free.decide(ask, ["a", "b"]) == ([fits, short], [])
        assert model.free.judge(ask, ["a"]) == judge(["a"], [fits])
        assert model.free.decide(ask, ["a"]) == ([fits], [])
        assert model.free.judge(ask, ["a", "b"]) == judge(["a", "b"], [fits, short])
        assert model.free.judge(ask, ["a", "gone"]) is None  # a name the arrays do not know
        assert model.free.decide(ask, ["b"]) == ([short], [])


def test_huge_quantities_compare_exactly() -> None:
    """Usage beyond capacity, and capacities near 2**63, neither overflow nor round."""
    top = 2**63 - 1
    model = Model(Policy())
    model.set_node(NodeGpu("n", ("card0", "card1"), {I915: 1, MEMORY: top}))
    model.apply("n", Hold({"card0": {MEMORY: top}}), +1)
    model.apply("n", Hold({"card0": {MEMORY: top}}), +1)  # twice capacity: over-counted
    model.apply("n", Hold({"card1": {MEMORY: 1}}), +1)
    for rebuild in (lambda: None, model.relist, model.relist_pods):
        rebuild()
        for amount, expected in ((top - 1, (("card1",),)), (top, None), (0, (("card1",),))):
            request = plain_request(1, {MEMORY: amount})
            model.compare(request, ["n"])
            answer = model.free.decide(model.free.ask(request), ["n"])[0][0]  # type: ignore[arg-type]
            if expected is None:
                assert isinstance(answer, Rejection)
            else:
                assert answer == expected


def test_preferred_and_disabled_cards_keep_the_search_order() -> None:
    model = Model(Policy())
    model.set_node(
        NodeGpu(
            "n",
            ("card0", "card1", "card2", "card3"),
            {I915: 2, MEMORY: 8},
            disabled=frozenset({"card1"}),
            preferred="card3",
        )
    )
    request = plain_request(2, {MEMORY: 8})
    ask = model.free.ask(request)
    assert ask is not None
    assert model.free.decide(ask, ["n"])[0] == [(("card3", "card0"),)]
    model.apply("n", Hold({"card0": {MEMORY: 5}}), +1)
    assert model.free.decide(ask, ["n"])[0] == [(("card3", "card2"),)]
    model.compare(request, ["n"])


def test_too_few_usable_cards_are_left_to_place() -> None:
    model = Model(Policy())
    model.set_node(NodeGpu("n", ("card0", "card1"), {I915: 2}, disabled=frozenset({"card1"})))
    ask = model.free.ask(plain_request(2, {}))
    assert ask is not None
    assert model.free.decide(ask, ["n", "m"]) == ([None, None], [0, 1])


# ---------------------------------------------------------------- in the ledger

LEDGER_NODES = ("n0", "n1", "n2", "n3", "n4")

ledger_operations = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "check",
                "check",
                "check",
                "reserve",
                "reserve",
                "commit",
                "commit_unknown",
                "cancel",
                "observe",
                "forget",
                "unreadable",
                "unreadable",
                "set_node",
                "remove_node",
                "replace_nodes",
                "relist",
            ]
        ),
        st.sampled_from(LEDGER_NODES),
        st.integers(0, 7),  # which pod
        st.integers(0, 4),  # which request
    ),
    min_size=10,
    max_size=60,
)

# Mostly policies under which plain pods take the arrays (no balanced resource, first fit).
ledger_policies = st.one_of(
    st.builds(Policy, allowlist=st.booleans(), denylist=st.booleans()),
    st.builds(Policy, allowlist=st.booleans(), denylist=st.booleans()),
    policies,
)


@st.composite
def plain_requests(draw: st.DrawFn) -> PodRequest:
    gpus = draw(st.sampled_from([1, 1, 2, 3]))
    limits = {MEMORY: gpus * draw(st.integers(0, 5))}
    if draw(st.booleans()):
        limits[MILLICORES] = gpus * draw(st.integers(0, 4))
    return plain_request(gpus, limits)


def fresh_copy(ledger: Ledger) -> FreeBook:
    """The arrays built anew from the ledger's nodes and books."""
    free = FreeBook(ledger._policy)
    free.replace_nodes(ledger._nodes.values(), ledger._book_views())
    return free


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_ledger_check_decides_as_the_search(data: st.DataObject) -> None:
    """Through any sequence of ledger changes, `check` of plain pods (decided by the
    arrays) answers as the general search on the ledger's state, and the arrays equal
    arrays built afresh from the books."""
    ledger = Ledger(policy=data.draw(ledger_policies))
    pool = {
        name: [
            data.draw(nodes(name, plain=data.draw(st.sampled_from([True, True, False]))))
            for _ in range(2)
        ]
        for name in LEDGER_NODES
    }
    ledger.replace_nodes(p[0] for p in pool.values())
    requests = [data.draw(plain_requests()) for _ in range(4)]
    requests.append(data.draw(requests_for(tuple(f"card{n}" for n in range(12)))))
    names = [*LEDGER_NODES, "unknown"]
    for op, name, pod, which in data.draw(ledger_operations):
        uid = f"pod-{pod}"
        request = requests[which]
        node = ledger.node(name) or pool[name][0]
        if op == "check":
            event("blocked" if any(b.blocked for b in ledger._books.values()) else "none")
            event("decided" if ledger._free.ask(request) else "left")
            for asker in (None, uid):
                expected = {n: reference(ledger, request, n, asker) for n in names}
                assert ledger.check(request, names, asker) == expected
                given_nodes: list[NodeGpu | str] = [ledger.node(n) or n for n in names]
                assert ledger.check(request, given_nodes, asker) == expected
                for asked in (names, LEDGER_NODES):
                    judged = ledger.judge_names(request, list(asked), asker)
                    answers = [reference(ledger, request, n, asker) for n in asked]
                    assert judged == judge(list(asked), cast(list[Allocation | Rejection], answers))
                    assert ledger.fits_any(request, list(asked), asker) == bool(judged.passed)
        elif op == "reserve":
            ledger.reserve_placement(uid, "ns", uid, request, name)
        elif op in ("commit", "commit_unknown"):
            ledger.commit(uid, landed=op == "commit")
        elif op == "cancel":
            ledger.cancel(uid)
        elif op == "observe":
            holding = holding_on(node, request, uid)
            if holding is not None:
                ledger.observe(PodObservation(uid, "ns", uid, False, holding))
        elif op == "forget":
            ledger.forget(uid)
        elif op == "unreadable":
            annotation = "?" if which == 0 else f"{node.cards[which % len(node.cards)]},junk"
            pod_object = {
                "metadata": {
                    "uid": uid,
                    "name": uid,
                    "namespace": "ns",
                    "annotations": {"gas-container-cards": annotation},
                },
                "spec": {"nodeName": name, "containers": [{"name": "c"}]},
            }
            observation = observe_pod(pod_object)
            assert observation is not None
            ledger.observe(observation)
        elif op == "set_node":
            ledger.set_node(pool[name][which % 2])
        elif op == "remove_node":
            ledger.remove_node(name)
        elif op == "replace_nodes":
            ledger.replace_nodes(pool[n][which % 2] for n in LEDGER_NODES if n != name)
        elif op == "relist":
            bound = [
                PodObservation(u, h.namespace, h.name, False, h)
                for u, (h, _) in ledger.holdings().items()
                if which and h.allocation
            ]
            ledger.replace_pods(bound, 0.0)
    fresh = fresh_copy(ledger)
    for request in requests:
        ask = ledger._free.ask(request)
        if ask is not None:
            assert ledger._free.decide(ask, names) == fresh.decide(ask, names)
        for asker in (None, "pod-0"):
            assert ledger.check(request, names, asker) == {
                n: reference(ledger, request, n, asker) for n in names
            }


def test_answers_follow_every_change() -> None:
    """The same question about the same nodes gets a new answer after each kind of change
    (the arrays keep their last answers while nothing changes)."""
    model = Model(Policy())
    node = NodeGpu("n", ("card0", "card1"), {I915: 2, MEMORY: 8})
    model.set_node(node)
    request = plain_request(1, {MEMORY: 6})
    ask = model.free.ask(request)
    assert ask is not None
    first = (("card0",),)
    second = (("card1",),)
    full = Rejection("gpu: not enough free gpu.intel.com/memory.max on the node's cards", False)

    def answer() -> object:
        model.compare(request, ["n"])
        return model.free.decide(ask, ["n"])[0][0]

    assert answer() == first
    model.apply("n", Hold({"card0": {MEMORY: 4}}), +1)
    assert answer() == second
    model.apply("n", Hold({"card0": {MEMORY: 4}}), -1)
    assert answer() == first
    model.apply("n", Hold({}, frozenset({"card0"})), +1)
    assert answer() == second
    model.apply("n", Hold({}, frozenset({"card0"})), -1)
    assert answer() == first
    model.apply("n", Hold({}, blocks_node=True), +1)
    assert answer() == Rejection(NODE_BLOCKED, False)
    model.apply("n", Hold({}, blocks_node=True), -1)
    assert answer() == first
    model.set_node(NodeGpu("n", ("card0", "card1"), {I915: 2, MEMORY: 8}, preferred="card1"))
    assert answer() == second
    model.remove_node("n")
    assert model.free.decide(ask, ["n"]) == ([None], [0])
    model.set_node(node)
    assert answer() == first
    model.books["n"] = Book({"card0": {MEMORY: 8}, "card1": {MEMORY: 8}})
    model.relist_pods()
    assert answer() == full
    model.books.clear()
    model.relist()
    assert answer() == first
