"""The fast paths answer exactly as the slow ones: same cards, same reasons.

- `place` takes a first-fit shortcut for pods with one card-asking container; it must
  agree with the general search (`shortcut=False`) on every node, usage and request.
- The ledger keeps `place`'s answers per node and pod shape until the node or its book
  changes; through any sequence of changes, `Ledger.check` must agree with the general
  search run on the ledger's current state.
- The idle check (does the pod fit the node with every card idle) is remembered per kind
  of node and pod shape; it must be what the check finds on each node of the kind, and
  a node object changed under the same name must not be answered from its old kind.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gas.core.allocator import (
    DOES_NOT_FIT_IDLE,
    Placement,
    Policy,
    Rejection,
    fits_idle,
    place,
    summarize,
)
from gas.core.answers import AnswerCache, request_shape
from gas.core.holdings import PodHolding, PodObservation, observe_pod
from gas.core.ledger import Ledger
from gas.core.model import (
    ANNOTATION_ALLOW,
    ANNOTATION_DENY,
    ANNOTATION_POLICY,
    ANNOTATION_SAME_GPU,
    ANNOTATION_SINGLE_NUMA,
    ANNOTATION_XELINK,
    I915,
    TILES,
    ContainerNeed,
    NodeGpu,
    PodRequest,
    SpecError,
    allocation_usage,
    format_cards,
    pod_request,
)

MEMORY = "gpu.intel.com/memory.max"
MILLICORES = "gpu.intel.com/millicores"
RESOURCES = (I915, MEMORY, MILLICORES, TILES)
SHORT = {I915: "i915", MEMORY: "memory.max", MILLICORES: "millicores", TILES: "tiles"}

EXAMPLES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# For a test whose every example is a sequence of many steps (each step a case of its own).
STEP_EXAMPLES = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def search_alone(
    node: NodeGpu, usage: Mapping[str, Mapping[str, int]], request: PodRequest, **options: Any
) -> Placement | Rejection:
    """The general search without the first-fit shortcut: the reference."""
    return place(node, usage, request, shortcut=False, **options)


# ---------------------------------------------------------------- strategies


def rarely(draw: Callable[[st.SearchStrategy[bool]], bool]) -> bool:
    return draw(st.sampled_from([False] * 9 + [True]))


@st.composite
def nodes(draw: st.DrawFn, name: str = "n", plain: bool = False) -> NodeGpu:
    """A node of 1 to 6 cards with small capacities (so usage often collides with them)
    and, unless `plain`, any of the policy and topology fields."""
    numbers = sorted(draw(st.sets(st.integers(0, 11), min_size=1, max_size=6)))
    cards = tuple(f"card{n}" for n in numbers)
    # Mostly the usual resources with room; sometimes one missing or of zero capacity.
    resources = [I915, MEMORY, *draw(st.lists(st.sampled_from(RESOURCES[2:]), unique=True))]
    if not plain and rarely(draw):
        resources.remove(draw(st.sampled_from(resources)))
    capacity = {res: draw(st.integers(0 if res == TILES else 2, 8)) for res in resources}
    if not plain and rarely(draw):
        capacity[draw(st.sampled_from(resources))] = 0
    if plain:
        return NodeGpu(name, cards, capacity, preferred=draw(st.sampled_from([None, *cards])))
    tiles = capacity.get(TILES, 0)
    some_cards = st.sets(st.sampled_from(cards))
    tile_sets = st.dictionaries(
        st.sampled_from(cards), st.frozensets(st.integers(0, max(0, tiles - 1)), max_size=2)
    )
    links: list[tuple[tuple[str, int], tuple[str, int]]] = []
    if draw(st.booleans()):
        for _ in range(draw(st.integers(0, 4))):
            a, b = draw(st.sampled_from(cards)), draw(st.sampled_from(cards))
            links.append(((a, draw(st.integers(0, 2))), (b, draw(st.integers(0, 2)))))
    numa: tuple[tuple[str, ...], ...] = ()
    if draw(st.booleans()):
        split = draw(st.integers(0, len(cards)))
        numa = tuple(g for g in (cards[:split], cards[split:]) if g)
    return NodeGpu(
        name=name,
        cards=cards,
        capacity=capacity,
        problem=draw(st.sampled_from([None] * 30 + ["gpu: node labels are broken"])),
        disabled=frozenset(draw(some_cards)) if rarely(draw) else frozenset(),
        preferred=draw(st.sampled_from([None, None, *cards])),
        unavailable_tiles={c: t for c, t in draw(tile_sets).items() if t} if tiles else {},
        preferred_tiles={c: tuple(sorted(t)) for c, t in draw(tile_sets).items() if t and tiles},
        xe_links=tuple(links),
        xe_link_problem=draw(st.sampled_from([None] * 8 + ["gpu: xe-links label is bad"])),
        numa_groups=numa,
        numa_problem=draw(st.sampled_from([None] * 8 + ["gpu: numa label is bad"])),
    )


@st.composite
def pods(draw: st.DrawFn, cards: tuple[str, ...] = ("card0", "card1", "card2")) -> dict[str, Any]:
    """A pod JSON object: 1 to 3 containers, any resources in any order, any of the GAS
    feature annotations (valid or not)."""
    containers: list[dict[str, Any]] = []
    for index in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        # Any resources in any order; tiles less often, as they take the general search.
        choices = RESOURCES if rarely(draw) else RESOURCES[:3]
        resources = draw(st.permutations(choices))[: draw(st.integers(0, len(choices)))]
        limits = {res: str(draw(st.integers(0, 8))) for res in resources}
        if not rarely(draw):
            limits[I915] = str(draw(st.sampled_from([1, 1, 2, 3, 0] if index else [1, 1, 2])))
        containers.append({"name": f"c{index}", "resources": {"limits": limits}})
    annotations: dict[str, str] = {}
    names = st.sets(st.sampled_from([*cards, "card9"]), max_size=3)
    if rarely(draw):
        annotations[ANNOTATION_ALLOW] = ",".join(sorted(draw(names)))
    if rarely(draw):
        annotations[ANNOTATION_DENY] = ",".join(sorted(draw(names)))
    if rarely(draw):
        annotations[ANNOTATION_SAME_GPU] = ",".join(c["name"] for c in containers)
    if rarely(draw):
        annotations[ANNOTATION_XELINK] = "true"
    if rarely(draw):
        annotations[ANNOTATION_SINGLE_NUMA] = "true"
    if rarely(draw):
        annotations[ANNOTATION_POLICY] = draw(st.sampled_from(["binpack", "spread", "odd"]))
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations},
        "spec": {"containers": containers},
    }


def requests_for(cards: tuple[str, ...]) -> st.SearchStrategy[PodRequest]:
    def read(pod: dict[str, Any]) -> PodRequest | None:
        try:
            return pod_request(pod)
        except SpecError:
            return None

    return pods(cards).map(read).filter(lambda r: r is not None)  # type: ignore[return-value]


policies = st.builds(
    Policy,
    allowlist=st.booleans(),
    denylist=st.booleans(),
    balanced_resource=st.sampled_from(["", "", "i915", "tiles", "gpu.intel.com/memory.max"]),
    placement=st.sampled_from(["first-fit", "first-fit", "binpack", "spread"]),
)


def usages(cards: tuple[str, ...]) -> st.SearchStrategy[dict[str, dict[str, int]]]:
    per_card = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 7), max_size=4)
    return st.dictionaries(st.sampled_from(cards), per_card)


# ---------------------------------------------------------------- the allocator


@EXAMPLES
@given(data=st.data())
def test_shortcut_places_as_the_search(data: st.DataObject) -> None:
    node = data.draw(nodes())
    request = data.draw(requests_for(node.cards))
    usage = data.draw(usages(node.cards))
    kwargs: dict[str, Any] = {
        "blocked": frozenset(data.draw(st.sets(st.sampled_from(node.cards), max_size=2))),
        "node_blocked": rarely(data.draw),
        "tiles_used": data.draw(
            st.dictionaries(st.sampled_from(node.cards), st.frozensets(st.integers(0, 3)))
        ),
        "policy": data.draw(policies),
    }
    if data.draw(st.booleans()):
        kwargs["order"] = data.draw(st.permutations([*node.cards, "card99"]))
    expected = search_alone(node, usage, request, **kwargs)
    assert place(node, usage, request, **kwargs) == expected
    summary = summarize(node, usage, kwargs["blocked"])
    assert place(node, usage, request, summary=summary, **kwargs) == expected


@EXAMPLES
@given(data=st.data())
def test_shortcut_on_plain_pods(data: st.DataObject) -> None:
    """Most pods take the shortcut: one container asking for cards and memory."""
    node = data.draw(nodes(plain=True))
    gpus = data.draw(st.sampled_from([1, 1, 2, 3]))
    limits = {I915: str(gpus), MEMORY: str(gpus * data.draw(st.integers(0, 8)))}
    if data.draw(st.booleans()):
        limits = dict(reversed(limits.items()))
    pod = {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}
    request = pod_request(pod)
    usage = data.draw(usages(node.cards))
    blocked = frozenset(data.draw(st.sets(st.sampled_from(node.cards), max_size=2)))
    policy = Policy(allowlist=data.draw(st.booleans()))
    fast = place(node, usage, request, blocked=blocked, policy=policy)
    assert fast == search_alone(node, usage, request, blocked=blocked, policy=policy)
    summary = summarize(node, usage, blocked)
    assert place(node, usage, request, blocked=blocked, policy=policy, summary=summary) == fast


def test_shortcut_over_many_busy_nodes() -> None:
    """Seeded random nodes filled by earlier pods, where the shortcut both finds cards and
    refuses them (hypothesis above favours the edges; this covers the busy middle)."""
    rng = random.Random(7)
    outcomes: collections.Counter[str] = collections.Counter()
    for _ in range(3000):
        cards = tuple(f"card{n}" for n in sorted(rng.sample(range(12), rng.randint(1, 8))))
        capacity = {I915: rng.choice([1, 2, 4, 8]), MEMORY: rng.choice([4, 8, 16])}
        if rng.random() < 0.3:
            capacity[MILLICORES] = rng.choice([100, 1000])
        node = NodeGpu(
            "n",
            cards,
            capacity,
            disabled=frozenset(rng.sample(cards, 1)) if rng.random() < 0.1 else frozenset(),
            preferred=rng.choice(cards) if rng.random() < 0.2 else None,
        )
        usage = {
            card: {
                res: rng.randint(0, cap + (cap // 4 if rng.random() < 0.05 else 0))
                for res, cap in capacity.items()
                if rng.random() < 0.8
            }
            for card in cards
            if rng.random() < 0.7
        }
        gpus = rng.choice([1, 1, 1, 2, 3])
        limits = {
            res: str(gpus * rng.randint(0, cap // 2 if rng.random() < 0.8 else cap))
            for res, cap in capacity.items()
            if res == I915 or rng.random() < 0.7
        }
        limits[I915] = str(gpus)
        order = list(limits.items())
        rng.shuffle(order)
        annotations = {}
        if rng.random() < 0.2:
            annotations[ANNOTATION_DENY] = rng.choice(cards)
        containers = [{"name": "c", "resources": {"limits": dict(order)}}]
        if rng.random() < 0.2:
            containers.insert(rng.randint(0, 1), {"name": "side", "resources": {}})
        request = pod_request(
            {"metadata": {"annotations": annotations}, "spec": {"containers": containers}}
        )
        blocked = frozenset(c for c in cards if rng.random() < 0.05)
        policy = Policy(denylist=rng.random() < 0.5)
        fast = place(node, usage, request, blocked=blocked, policy=policy)
        assert fast == search_alone(node, usage, request, blocked=blocked, policy=policy)
        summary = summarize(node, usage, blocked)
        with_summary = place(node, usage, request, blocked=blocked, policy=policy, summary=summary)
        assert with_summary == fast
        outcomes[fast.reason.split(" on ")[0] if isinstance(fast, Rejection) else "fit"] += 1
    assert outcomes["fit"] > 1000
    assert outcomes["gpu: not enough free gpu.intel.com/memory.max"] > 50
    assert outcomes["gpu: not enough free gpu.intel.com/i915"] > 50


def test_shortcut_reason_names_the_scarcest_resource() -> None:
    node = NodeGpu("n", ("card0", "card1", "card2"), {I915: 4, MEMORY: 8})
    usage = {"card0": {MEMORY: 6}, "card1": {MEMORY: 7, I915: 4}, "card2": {I915: 4}}
    request = pod_request(
        {"spec": {"containers": [{"name": "c", "resources": {"limits": {I915: "1", MEMORY: "4"}}}]}}
    )
    result = place(node, usage, request, blocked=frozenset({"card2"}))
    assert result == Rejection(
        "gpu: not enough free gpu.intel.com/memory.max on the node's cards", False
    )
    assert result == search_alone(node, usage, request, blocked=frozenset({"card2"}))


# ---------------------------------------------------------------- the ledger's answers

NODE_NAMES = ("n0", "n1", "n2")


def holding_on(node: NodeGpu, request: PodRequest, uid: str) -> PodHolding | None:
    """A holding as a relist would show it: the pod placed on the idle node."""
    result = search_alone(node, {}, request)
    if isinstance(result, Rejection) or not any(result.cards):
        return None
    usage = allocation_usage(request, result.cards)
    return PodHolding(uid, "ns", uid, node.name, result.cards, usage, tiles=result.tiles)


def reference(ledger: Ledger, request: PodRequest, name: str, uid: str | None) -> object:
    """The general search on the ledger's current state, as `check` reports it."""
    node = ledger._nodes.get(name)
    if node is None:
        return Rejection("gpu: node is not known to gas", False)
    book = ledger._books.get(name)
    own = ledger._own_pending(uid)
    mine = own if own is not None and own.node == name else None
    if book is None:
        result = search_alone(node, {}, request, policy=ledger._policy)
    else:
        usage: dict[str, dict[str, int]] = {c: dict(r) for c, r in book.usage.items()}
        if mine is not None:
            for card, resources in mine.usage.items():
                for res, amount in resources.items():
                    usage.setdefault(card, {})[res] = usage.get(card, {}).get(res, 0) - amount
        result = search_alone(
            node,
            usage,
            request,
            blocked=frozenset(c for c, n in book.blocked.items() if n > 0),
            node_blocked=book.blocking_pods > 0,
            tiles_used=book.tiles_used(mine),
            policy=ledger._policy,
        )
    return result.cards if isinstance(result, Placement) else result


operations = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "check",
                "check",
                "check",
                "reserve",
                "commit",
                "cancel",
                "observe",
                "confirm",
                "forget",
                "unreadable",
                "set_node",
                "remove_node",
                "relist",
            ]
        ),
        st.sampled_from(NODE_NAMES),
        st.integers(0, 5),  # which pod
        st.integers(0, 3),  # which request
    ),
    min_size=1,
    max_size=40,
)


@STEP_EXAMPLES
@given(data=st.data())
def test_ledger_answers_match_the_search(data: st.DataObject) -> None:
    policy = data.draw(policies)
    ledger = Ledger(policy=policy)
    node_pool = {name: [data.draw(nodes(name)) for _ in range(2)] for name in NODE_NAMES}
    ledger.replace_nodes(pool[0] for pool in node_pool.values())
    all_cards = tuple(sorted({c for pool in node_pool.values() for n in pool for c in n.cards}))
    requests = [data.draw(requests_for(all_cards)) for _ in range(4)]
    for op, name, pod, which in data.draw(operations):
        uid = f"pod-{pod}"
        request = requests[which]
        node = ledger.node(name) or node_pool[name][0]
        if op == "check":
            names = [*NODE_NAMES, "unknown"]
            for asker in (None, uid):
                got = ledger.check(request, names, asker)
                assert got == {n: reference(ledger, request, n, asker) for n in names}
            given_node = node_pool[name][pod % 2]
            got = ledger.check(request, [given_node], uid)
            ledger._nodes[name], saved = given_node, ledger._nodes.get(name)
            try:
                expected = reference(ledger, request, name, uid)
            finally:
                if saved is None:
                    del ledger._nodes[name]
                else:
                    ledger._nodes[name] = saved
            assert got == {name: expected}
        elif op == "reserve":
            ledger.reserve_placement(uid, "ns", uid, request, name)
        elif op == "commit":
            ledger.commit(uid)
        elif op == "cancel":
            ledger.cancel(uid)
        elif op == "observe":
            holding = holding_on(node, request, uid)
            if holding is not None:
                ledger.observe(PodObservation(uid, "ns", uid, False, holding))
        elif op == "confirm":
            # The watch shows the pod bound as gas counts it: its own bind's event, with
            # the pod's priority (`which`), which gas's reservation did not know.
            held = ledger.holdings().get(uid)
            if held is not None:
                seen = dataclasses.replace(held[0], priority=which)
                ledger.observe(PodObservation(uid, "ns", uid, False, seen))
                assert ledger.holdings()[uid][0].priority == which
        elif op == "unreadable":
            observation = observe_pod(
                {
                    "metadata": {
                        "uid": uid,
                        "name": uid,
                        "namespace": "ns",
                        "annotations": {"gas-container-cards": "card0,junk" if which else "?"},
                    },
                    "spec": {"nodeName": name, "containers": [{"name": "c"}]},
                }
            )
            assert observation is not None
            ledger.observe(observation)
        elif op == "forget":
            ledger.forget(uid)
        elif op == "set_node":
            ledger.set_node(node_pool[name][which % 2])
        elif op == "remove_node":
            ledger.remove_node(name)
        elif op == "relist":
            bound = [
                PodObservation(u, h.namespace, h.name, False, h)
                for u, (h, _) in ledger.holdings().items()
                if which and h.allocation
            ]
            ledger.replace_pods(bound, 0.0)


def test_answers_follow_a_bind() -> None:
    """A kept answer is dropped when a bind changes the node."""
    node = NodeGpu("n", ("card0",), {I915: 2, MEMORY: 8})
    ledger = Ledger()
    ledger.set_node(node)
    limits = {I915: "1", MEMORY: "5"}
    pod = {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}
    request = pod_request(pod)
    assert ledger.check(request, ["n"]) == {"n": (("card0",),)}
    placement = ledger.reserve_placement("a", "ns", "a", request, "n")
    assert format_cards(placement.cards) == "card0"  # type: ignore[union-attr]
    assert ledger.check(request, ["n"]) == {
        "n": Rejection("gpu: not enough free gpu.intel.com/memory.max on the node's cards", False)
    }
    ledger.cancel("a")
    assert ledger.check(request, ["n"]) == {"n": (("card0",),)}


# ---------------------------------------------------------------- the idle check remembered


@dataclasses.dataclass
class StandInBook:
    """A node's book as the answer cache reads it."""

    usage: Mapping[str, Mapping[str, int]]
    blocked: Mapping[str, int]
    blocking_pods: int = 0
    used_tiles: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)

    def tiles_used(self) -> Mapping[str, frozenset[int]]:
        return self.used_tiles


@STEP_EXAMPLES
@given(data=st.data())
def test_idle_answer_remembered_per_kind(data: st.DataObject) -> None:
    """Nodes of a few kinds, each kind under several names (and as equal but distinct
    objects), fitted pods of a few shapes in any order with any usage: every answer is
    the search's own, and every idle answer kept is what the check finds on each node of
    its kind."""
    policy = data.draw(policies)
    base = data.draw(nodes())
    kinds = [base]
    for _ in range(data.draw(st.integers(0, 3))):
        # A kind differing from the first in one field (names of other cards harm not).
        field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(base)][1:]))
        kinds.append(dataclasses.replace(base, **{field: getattr(data.draw(nodes()), field)}))
    fleet = [
        dataclasses.replace(kind, name=f"k{k}-{copy}", capacity=dict(kind.capacity))
        for k, kind in enumerate(kinds)
        for copy in range(3)
    ]
    all_cards = tuple(sorted({c for n in fleet for c in n.cards}))
    requests = data.draw(st.lists(requests_for(all_cards), min_size=1, max_size=3))
    cache = AnswerCache(policy)
    # The loop's strategies made once: a strategy is validated whenever one is first drawn,
    # which made this test spend most of its time building them again.
    any_node, any_request = st.sampled_from(fleet), st.sampled_from(requests)
    per_node = {
        node.name: (usages(node.cards), st.sets(st.sampled_from(node.cards), max_size=1))
        for node in fleet
    }
    for _ in range(data.draw(st.integers(1, 24))):
        node = data.draw(any_node)
        request = data.draw(any_request)
        node_usages, node_blocked = per_node[node.name]
        usage = data.draw(node_usages)
        blocked = frozenset(data.draw(node_blocked))
        book = StandInBook(usage, dict.fromkeys(blocked, 1))
        cache.invalidate(node.name)  # its book is a new one, as after a bind
        answers = cache.answers(request_shape(request))
        got = cache.place(node, book, request, answers)
        expected = search_alone(node, usage, request, blocked=blocked, policy=policy)
        assert got == expected
        for other in fleet:
            fits = answers.idle.get(cache.kind(other))
            if fits is not None:
                assert fits == fits_idle(other, request, policy)


def test_request_shape_tells_apart_requests_that_differ_in_any_field() -> None:
    """Answers are shared between requests of one shape: each field must be in it."""
    # request_shape copies these by name: a field added to PodRequest must be added there.
    assert tuple(f.name for f in dataclasses.fields(PodRequest)) == (
        "containers",
        "allow",
        "deny",
        "same_gpu",
        "xelink",
        "single_numa",
        "problems",
        "policy",
    )
    base = PodRequest(
        (ContainerNeed("a", 1, {I915: 1, MEMORY: 4}), ContainerNeed("b", 1, {I915: 1})),
        same_gpu=("a",),
    )
    variants = [
        dataclasses.replace(base, containers=base.containers[::-1]),
        dataclasses.replace(base, containers=(ContainerNeed("a", 1, {MEMORY: 4, I915: 1}),)),
        dataclasses.replace(base, allow=frozenset({"card0"})),
        dataclasses.replace(base, deny=frozenset({"card1"})),
        dataclasses.replace(base, same_gpu=("a", "b")),
        dataclasses.replace(base, xelink=True),
        dataclasses.replace(base, single_numa=True),
        dataclasses.replace(base, problems={"gas-allow": "bad"}),
        dataclasses.replace(base, policy="binpack"),
    ]
    shapes = [request_shape(r) for r in [base, *variants]]
    assert len(set(shapes)) == len(shapes)
    # Container names outside a same-GPU group do not count; equal requests are equal.
    renamed = dataclasses.replace(
        base, containers=(base.containers[0], ContainerNeed("z", 1, {I915: 1}))
    )
    assert request_shape(renamed) == request_shape(base)
    assert request_shape(dataclasses.replace(base)) == request_shape(base)


def test_idle_answer_shared_by_nodes_of_one_kind() -> None:
    """A filter over many nodes of one kind runs the idle check once for them all."""
    fleet = [NodeGpu(f"n{i}", ("card0", "card1"), {I915: 1, MEMORY: 8}) for i in range(5)]
    ledger = Ledger()
    ledger.replace_nodes(fleet)
    # Three containers of one card each on two single-share cards: not even idle.
    three = [{"name": f"c{i}", "resources": {"limits": {I915: "1"}}} for i in range(3)]
    request = pod_request({"spec": {"containers": three}})
    got = ledger.check(request, [n.name for n in fleet])
    assert set(got.values()) == {Rejection(DOES_NOT_FIT_IDLE, unresolvable=True)}
    answers = ledger._cache.answers(request_shape(request))
    assert answers.idle == {ledger._cache.kind(fleet[0]): False}


def test_idle_answer_not_kept_past_a_changed_node() -> None:
    """The node changes under its name (a card gains shares): the pod that did not fit
    it even idle now fits it idle, and waiting for the card held now can help."""
    node = NodeGpu("n", ("card0",), {I915: 1, MEMORY: 8})
    ledger = Ledger()
    ledger.set_node(node)
    two = [{"name": f"c{i}", "resources": {"limits": {I915: "1"}}} for i in range(2)]
    request = pod_request({"spec": {"containers": two}})
    assert ledger.check(request, ["n"]) == {"n": Rejection(DOES_NOT_FIT_IDLE, True)}
    ledger.set_node(dataclasses.replace(node, capacity={I915: 2, MEMORY: 8}))
    one = [{"name": "c", "resources": {"limits": {I915: "1"}}}]
    held = ledger.reserve_placement("a", "ns", "a", pod_request({"spec": {"containers": one}}), "n")
    assert isinstance(held, Placement)
    assert ledger.check(request, ["n"]) == {
        "n": Rejection("gpu: not enough free cards for every container of the pod", False)
    }
    ledger.cancel("a")
    assert ledger.check(request, ["n"]) == {"n": (("card0",), ("card0",))}
    ledger.set_node(node)  # back as it was: not even idle again
    assert ledger.check(request, ["n"]) == {"n": Rejection(DOES_NOT_FIT_IDLE, True)}
