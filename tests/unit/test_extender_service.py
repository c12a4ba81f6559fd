"""gas.serving.service.Extender called directly, without HTTP: the four verbs over the
built-in demo cluster and a real ledger.

The demo cluster (`gas/data/demo-cluster.yaml`): demo-1card (one card, 4 i915 shares and
8Gi), demo-2cards (two cards of 4 shares and 8Gi; card0 holds 6Gi for the running pod
`video-encoder`, UID demo-running-0), demo-4cards (four cards of 4 shares and 16Gi) and
demo-cpu-only (no GPU).
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from gas.cluster.demo import DemoCluster, load_demo_file
from gas.cluster.leader import ElectionConfig, Elector, LeaderGatedCluster, LeaseRecord
from gas.core.allocator import Policy
from gas.core.ledger import Ledger
from gas.core.ledger_views import State
from gas.core.model import ANNOTATION_CARDS, I915
from gas.core.preemption import Victim
from gas.serving import wire
from gas.serving.service import Extender, Options, Reply
from gas.serving.wire import BindingArgs, ExtenderArgs, PreemptionArgs
from tests.support.leases import Clock, FakeStore
from tests.support.scheduler import listed_scores

MEM = "gpu.intel.com/memory.max"
NODES = ["demo-1card", "demo-2cards", "demo-4cards", "demo-cpu-only"]
RUNNING = "demo-running-0"  # video-encoder, 6Gi on card0 of demo-2cards


def pod(
    name: str,
    memory: str = "1Gi",
    i915: str = "1",
    *,
    uid: str | None = None,
    gpu_init_container: bool = False,
) -> dict[str, Any]:
    resources = {"limits": {I915: i915, MEM: memory}, "requests": {I915: i915, MEM: memory}}
    spec: dict[str, Any] = {"containers": [{"name": "app", "resources": resources}]}
    if gpu_init_container:
        spec["initContainers"] = [{"name": "init", "resources": copy.deepcopy(resources)}]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"},
        "spec": spec,
    }


class Demo:
    """The service over a started demo cluster, its ledger and the cluster's Events."""

    def __init__(
        self, data: dict[str, Any] | None = None, options: Options | None = None, start: bool = True
    ) -> None:
        self.ledger = Ledger(policy=(options or Options()).policy)
        self.cluster = DemoCluster(self.ledger, data or load_demo_file(None))
        if start:
            self.cluster.start()
        self.extender = Extender(self.ledger, self.cluster, options)

    def events(self, reason: str) -> list[dict[str, str]]:
        return [e for e in self.cluster.events if e["reason"] == reason]

    def state(self, uid: str) -> State | None:
        entry = self.ledger.holdings().get(uid)
        return None if entry is None else entry[1]


def names_args(p: dict[str, Any], names: list[str] = NODES) -> ExtenderArgs:
    return ExtenderArgs(p, p["metadata"]["uid"], names, None)


def bind_args(p: dict[str, Any], node: str) -> BindingArgs:
    meta = p["metadata"]
    return BindingArgs(meta["name"], meta["namespace"], meta["uid"], node)


@pytest.fixture
def demo() -> Demo:
    return Demo()


# ---------------------------------------------------------------- filter


def test_filter_passes_the_nodes_with_room_and_says_why_the_others_fail(demo: Demo) -> None:
    big = pod("big", memory="10Gi")
    reply = demo.extender.filter(names_args(big))

    assert reply.body["NodeNames"] == ["demo-4cards"]
    assert reply.body["Nodes"] is None
    assert set(reply.body["FailedNodes"]) | set(reply.body["FailedAndUnresolvableNodes"]) == {
        "demo-1card",
        "demo-2cards",
        "demo-cpu-only",
    }
    assert reply.body["Error"] == ""
    outcome = reply.outcome
    assert outcome.label == "fit"
    assert sum(outcome.rejections.values()) == 3
    assert outcome.decision is not None
    assert outcome.decision["decision"] == "filter"
    assert outcome.decision["pod"] == "default/big"
    assert outcome.decision["uid"] == "uid-big"
    assert (outcome.decision["nodes"], outcome.decision["passed"]) == (4, 1)
    assert outcome.decision["passed_nodes"] == ["demo-4cards"]
    # Filter reserves nothing.
    assert demo.state("uid-big") is None
    assert not demo.events("NoGPUFit")


def test_filter_with_no_fit_warns_the_pod_once(demo: Demo) -> None:
    huge = pod("huge", memory="20Gi")
    first = demo.extender.filter(names_args(huge))
    again = demo.extender.filter(names_args(huge))

    assert first.body["NodeNames"] == again.body["NodeNames"] == []
    assert first.outcome.label == again.outcome.label == "no_fit"
    assert sum(first.outcome.rejections.values()) == 4
    (event,) = demo.events("NoGPUFit")  # the retry repeats the same warning: not sent again
    assert event["pod"] == "default/huge" and event["type"] == "Warning"
    assert "no node has GPU cards for this pod" in event["message"]


def test_filter_refuses_an_unreadable_pod_on_every_node_as_unresolvable(demo: Demo) -> None:
    reply = demo.extender.filter(names_args(pod("init", gpu_init_container=True)))

    assert reply.body["NodeNames"] == []
    assert set(reply.body["FailedAndUnresolvableNodes"]) == set(NODES)
    assert reply.body["FailedNodes"] == {}
    assert reply.outcome.label == "no_fit"
    (reason,) = reply.outcome.rejections
    assert "init" in reason.lower()


def test_filter_with_node_objects_returns_those_that_pass(demo: Demo) -> None:
    objects = [copy.deepcopy(n) for n in load_demo_file(None)["nodes"]]
    big = pod("big", memory="10Gi")
    args = ExtenderArgs(big, "uid-big", [n["metadata"]["name"] for n in objects], objects)
    reply = demo.extender.filter(args)

    assert reply.body["NodeNames"] == ["demo-4cards"]
    assert [n["metadata"]["name"] for n in reply.body["Nodes"]["items"]] == ["demo-4cards"]
    assert reply.body["Nodes"]["items"][0] is objects[2]


def test_verbs_answer_not_synced_before_the_cluster_is() -> None:
    cold = Demo(start=False)
    objects = load_demo_file(None)["nodes"]
    p = pod("early")
    args = ExtenderArgs(p, "uid-early", [n["metadata"]["name"] for n in objects], objects)
    replies = [
        cold.extender.filter(args),
        cold.extender.prioritize(args),
        cold.extender.preempt(PreemptionArgs(p, "uid-early", 0, {"demo-1card": []}, {})),
        cold.extender.bind(bind_args(p, "demo-1card")),
    ]

    assert [r.outcome.label for r in replies] == ["not_synced"] * 4
    assert all(r.outcome.decision is None for r in replies)
    # Filter lists no node as passed or failed, and gives every node object back.
    assert replies[0].body["NodeNames"] == [] and replies[0].body["FailedNodes"] == {}
    assert replies[0].body["Nodes"]["items"] == objects
    assert replies[0].body["Error"] == "gas is not synced"
    for reply in replies[1:]:
        assert reply.body == {"Error": "gas is not synced with the cluster yet"}
    assert cold.ledger.holdings() == {} and cold.cluster.events == []


def test_a_synced_replica_that_does_not_lead_says_so_not_that_it_is_not_synced() -> None:
    ledger = Ledger()
    demo = DemoCluster(ledger, load_demo_file(None))
    demo.start()
    store = FakeStore()
    store.lease = LeaseRecord(holder="gas-b", duration_seconds=15, renew_time="t0")
    elector = Elector(store, ElectionConfig(identity="gas-a"), clock=Clock())
    extender = Extender(ledger, LeaderGatedCluster(demo, elector))
    p = pod("waiting")
    args = names_args(p)
    before = [
        extender.filter(args).body["Error"],
        extender.prioritize(args).body["Error"],
        extender.bind(bind_args(p, "demo-1card")).body["Error"],
    ]
    assert (
        before
        == [
            "gas is synced but this replica does not answer the scheduler now: "
            "this replica has not acquired the Lease yet"
        ]
        * 3
    )
    assert not elector.step()  # reads the Lease: gas-b holds it
    replies = [
        extender.filter(args),
        extender.prioritize(args),
        extender.preempt(PreemptionArgs(p, "uid-waiting", 0, {"demo-1card": []}, {})),
        extender.bind(bind_args(p, "demo-1card")),
    ]
    assert [r.outcome.label for r in replies] == ["inactive"] * 4
    assert [r.body["Error"] for r in replies] == [
        "gas is synced but this replica does not answer the scheduler now: "
        "replica gas-b holds the Lease"
    ] * 4
    assert replies[0].body["NodeNames"] == [] and replies[0].body["FailedNodes"] == {}
    assert "uid-waiting" not in ledger.holdings()


# ---------------------------------------------------------------- bind


def test_bind_after_filter_reserves_writes_and_commits() -> None:
    demo = Demo(options=Options(bind_events=True))
    p = pod("fresh", memory="10Gi")  # not in the cluster: known only from the filter call
    demo.extender.filter(names_args(p))
    reply = demo.extender.bind(bind_args(p, "demo-4cards"))

    assert reply.body == {"Error": ""}
    assert reply.outcome.label == "bound"
    assert reply.outcome.rejections == {}
    bound = demo.cluster.get_pod("default", "fresh")
    assert bound is not None and bound["spec"]["nodeName"] == "demo-4cards"
    cards = bound["metadata"]["annotations"][ANNOTATION_CARDS]
    assert cards == "card0"
    assert demo.state("uid-fresh") is State.BOUND
    decision = reply.outcome.decision
    assert decision is not None
    assert decision["decision"] == "bind" and decision["result"] == "bound"
    assert (decision["node"], decision["cards"]) == ("demo-4cards", cards)
    (event,) = demo.events("GPUsAllocated")
    assert event["message"] == "gas gave cards card0 on demo-4cards"


def test_a_bind_posts_no_success_event_by_default(demo: Demo) -> None:
    p = pod("quiet", memory="10Gi")
    demo.extender.filter(names_args(p))
    assert demo.extender.bind(bind_args(p, "demo-4cards")).outcome.label == "bound"
    assert demo.state("uid-quiet") is State.BOUND
    assert demo.cluster.events == []


def test_bind_of_a_pod_gas_never_saw_reads_it_from_the_cluster() -> None:
    data = load_demo_file(None)
    data["pods"].append(pod("waiting"))
    stored = Demo(data)
    reply = stored.extender.bind(bind_args(pod("waiting"), "demo-1card"))

    assert reply.outcome.label == "bound"
    assert stored.state("uid-waiting") is State.BOUND


def test_bind_of_an_unknown_pod_fails_without_holding_cards(demo: Demo) -> None:
    reply = demo.extender.bind(bind_args(pod("ghost"), "demo-1card"))

    assert reply.outcome.label == "no_pod"
    assert reply.body == {"Error": "pod default/ghost does not exist"}
    assert demo.state("uid-ghost") is None
    decision = reply.outcome.decision
    assert decision is not None and decision["result"] == "error"
    assert decision["error"] == "pod default/ghost does not exist"
    (event,) = demo.events("GPUBindFailed")
    assert event["message"] == "gas could not bind to demo-1card: pod default/ghost does not exist"


def test_bind_refuses_a_pod_whose_uid_changed(demo: Demo) -> None:
    reply = demo.extender.bind(
        BindingArgs("video-encoder", "default", "another-uid", "demo-4cards")
    )

    assert reply.outcome.label == "no_pod"
    assert reply.body["Error"] == f"pod default/video-encoder has UID {RUNNING}, not another-uid"
    assert demo.state("another-uid") is None


def test_bind_rechecks_the_node_and_counts_the_rejection(demo: Demo) -> None:
    p = pod("big", memory="10Gi")
    demo.extender.filter(names_args(p))
    reply = demo.extender.bind(bind_args(p, "demo-2cards"))

    assert reply.outcome.label == "no_fit"
    (reason,) = reply.outcome.rejections
    assert reply.outcome.rejections[reason] == 1
    assert reply.body["Error"] == f"{reason} (node demo-2cards)"
    assert demo.state("uid-big") is None
    assert demo.cluster.get_pod("default", "big") is None


def test_bind_refused_by_the_cluster_gives_the_cards_back() -> None:
    # Bound by someone else (no gas annotation, so not in the ledger) after gas's filter.
    data = load_demo_file(None)
    taken = pod("taken")
    taken["spec"]["nodeName"] = "demo-1card"
    data["pods"].append(taken)
    other = Demo(data)
    before = other.ledger.usage("demo-4cards")
    reply = other.extender.bind(bind_args(pod("taken"), "demo-4cards"))

    assert reply.outcome.label == "api_refused"
    assert reply.body["Error"].startswith("the API server refused the binding: ")
    assert other.state("uid-taken") is None
    assert other.ledger.usage("demo-4cards") == before


def test_bind_of_a_pod_pushed_out_of_the_pod_memory_reads_the_cluster() -> None:
    small = Demo(options=Options(pod_memory_size=1))
    first, second = pod("first"), pod("second")
    small.extender.filter(names_args(first))
    small.extender.filter(names_args(second))  # pushes `first` out of the pod memory

    assert small.extender.bind(bind_args(first, "demo-1card")).outcome.label == "no_pod"
    assert small.extender.bind(bind_args(second, "demo-1card")).outcome.label == "bound"


def test_a_scoring_policy_bound_without_a_prioritize_warns() -> None:
    """kube-scheduler asks for scores whenever two or more nodes are left after the
    filters; with no prioritize verb registered it never does, and a binpack or spread
    pod lands where kube-scheduler's own scores put it. gas says so at the bind."""
    binpack = Demo(options=Options(policy=Policy(placement="binpack")))
    lone = pod("lone")
    passed = binpack.extender.filter(names_args(lone)).body["NodeNames"]
    assert len(passed) >= 2
    reply = binpack.extender.bind(bind_args(lone, passed[0]))
    assert (reply.outcome.label, reply.outcome.unscored) == ("bound", "binpack")
    (event,) = binpack.events("GPUPolicyNotScored")
    assert event["type"] == "Warning" and event["pod"] == "default/lone"
    assert "binpack" in event["message"] and "prioritize" in event["message"]

    # A prioritize after the filter: scored, no warning.
    heard = pod("heard")
    passed = binpack.extender.filter(names_args(heard)).body["NodeNames"]
    binpack.extender.prioritize(names_args(heard, passed))
    assert binpack.extender.bind(bind_args(heard, passed[0])).outcome.unscored == ""

    # A filter that leaves one node: kube-scheduler rightly asks for no scores.
    single = pod("single")
    assert binpack.extender.filter(names_args(single, ["demo-1card"])).body["NodeNames"]
    assert binpack.extender.bind(bind_args(single, "demo-1card")).outcome.unscored == ""

    # A later filter of the pod wants its own prioritize: the earlier one does not count.
    again = pod("again")
    passed = binpack.extender.filter(names_args(again)).body["NodeNames"]
    binpack.extender.prioritize(names_args(again, passed))
    passed = binpack.extender.filter(names_args(again)).body["NodeNames"]
    assert binpack.extender.bind(bind_args(again, passed[0])).outcome.unscored == "binpack"
    assert len(binpack.events("GPUPolicyNotScored")) == 2


def test_first_fit_and_pod_policies_warn_only_where_nodes_are_scored(demo: Demo) -> None:
    plain = pod("plain")
    passed = demo.extender.filter(names_args(plain)).body["NodeNames"]
    assert demo.extender.bind(bind_args(plain, passed[0])).outcome.unscored == ""
    spread = pod("spread-me")
    spread["metadata"]["annotations"] = {"gas-policy": "spread"}
    passed = demo.extender.filter(names_args(spread)).body["NodeNames"]
    assert demo.extender.bind(bind_args(spread, passed[0])).outcome.unscored == "spread"
    assert [e["pod"] for e in demo.events("GPUPolicyNotScored")] == ["default/spread-me"]


# ---------------------------------------------------------------- prioritize


def scores_of(reply: Reply, names: list[str]) -> dict[str, int]:
    """A prioritize's HostPriorityList, written, as kube-scheduler reads it."""
    return listed_scores(orjson.loads(wire.encode(reply.body)), names)


def test_prioritize_scores_fitting_nodes_under_binpack() -> None:
    binpack = Demo(options=Options(policy=Policy(placement="binpack")))
    reply = binpack.extender.prioritize(names_args(pod("small")))

    scores = scores_of(reply, NODES)
    assert scores["demo-cpu-only"] == 0
    # The fullest node that fits first: demo-2cards already holds a pod.
    assert scores["demo-2cards"] > max(scores["demo-1card"], scores["demo-4cards"])
    assert reply.outcome.label == "fit"
    assert reply.outcome.decision is not None
    assert reply.outcome.decision["scores"] == scores
    assert binpack.ledger.holdings().keys() == {RUNNING}


def test_prioritize_gives_zero_everywhere_under_first_fit_and_to_no_fit(demo: Demo) -> None:
    fits = demo.extender.prioritize(names_args(pod("small")))
    huge = demo.extender.prioritize(names_args(pod("huge", memory="20Gi")))

    assert wire.encode(fits.body) == wire.encode(huge.body) == b"[]"
    assert (fits.outcome.label, huge.outcome.label) == ("fit", "no_fit")


def test_prioritize_by_names_under_first_fit_answers_as_node_by_node(demo: Demo) -> None:
    # By names, first fit finds whether any node fits from the arrays' judgement; with the
    # node objects given, node by node. Same body, decision and outcome, whatever fits.
    objects = {n["metadata"]["name"]: n for n in load_demo_file(None)["nodes"]}
    bound = pod("bound", memory="8Gi")
    demo.extender.filter(names_args(bound, ["demo-1card"]))
    assert demo.extender.bind(bind_args(bound, "demo-1card")).outcome.label == "bound"
    cases = [
        (pod("small"), NODES),
        (pod("huge", memory="20Gi"), NODES),
        (pod("two", memory="16Gi", i915="2"), NODES),
        (pod("small-on-full", memory="4Gi"), ["demo-1card", "demo-cpu-only"]),
        (pod("unknown"), ["no-such-node", "demo-cpu-only"]),
        (pod("bound", memory="8Gi"), ["demo-1card", "demo-4cards"]),
    ]
    labels = []
    for p, names in cases:
        by_names = demo.extender.prioritize(names_args(p, names))
        known = [objects[name] for name in names if name in objects]
        by_nodes = demo.extender.prioritize(
            ExtenderArgs(p, p["metadata"]["uid"], [o["metadata"]["name"] for o in known], known)
        )
        if len(known) == len(names):
            assert scores_of(by_names, names) == scores_of(by_nodes, names)
            assert by_names.outcome.decision == by_nodes.outcome.decision
        assert by_names.outcome.label == by_nodes.outcome.label, p["metadata"]["name"]
        labels.append(by_names.outcome.label)
    assert labels == ["fit", "no_fit", "fit", "no_fit", "no_fit", "fit"]


# ---------------------------------------------------------------- preempt


def test_preempt_keeps_victims_that_free_cards_and_drops_nodes_nothing_frees(
    demo: Demo,
) -> None:
    # Two whole cards of 8Gi: only demo-2cards with video-encoder gone, or demo-4cards.
    p = pod("two", memory="16Gi", i915="2")
    proposals = {
        "demo-2cards": [Victim(RUNNING), Victim("cpu-pod")],
        "demo-1card": [Victim("cpu-pod-2")],
    }
    args = PreemptionArgs(p, "uid-two", 10, proposals, {"demo-2cards": 5, "demo-1card": 0})
    reply = demo.extender.preempt(args)

    victims = reply.body["NodeNameToMetaVictims"]
    assert list(victims) == ["demo-2cards"]
    assert victims["demo-2cards"]["Pods"] == [{"UID": RUNNING}, {"UID": "cpu-pod"}]
    # The scheduler's count of budget violations, at most one per proposed victim kept.
    assert victims["demo-2cards"]["NumPDBViolations"] == 2
    outcome = reply.outcome
    assert outcome.label == "fit"
    assert sum(outcome.verdicts.values()) == 2 and outcome.verdicts["dropped"] == 1
    assert outcome.decision is not None
    assert outcome.decision["kept"] == 1
    assert outcome.decision["victims"] == {"demo-2cards": [RUNNING, "cpu-pod"]}
    assert sum(outcome.decision["dropped"].values()) == 1
    # Preempt reserves nothing.
    assert demo.state("uid-two") is None


def test_preempt_of_an_unreadable_pod_drops_every_node(demo: Demo) -> None:
    p = pod("init", gpu_init_container=True)
    args = PreemptionArgs(p, "uid-init", 0, {"demo-2cards": [Victim(RUNNING)]}, {})
    reply = demo.extender.preempt(args)

    assert reply.body == {"NodeNameToMetaVictims": {}}
    assert reply.outcome.label == "no_fit"
    assert dict(reply.outcome.verdicts) == {"dropped": 1}
