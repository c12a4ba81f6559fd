"""The extender's verbs over decoded requests: filter, prioritize, preempt and bind.

No HTTP here: each verb takes a record from `gas.serving.wire` and returns a `Reply`, the
JSON-ready body and its `Outcome` (the label counted in metrics, the rejection reasons,
the decision-log record), which the HTTP face turns into a response, metrics and a log
line. A pod that does not fit is never an error: it is a `FailedNodes` entry. `Error`
carries internal failures and refused binds only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from gas.cluster.protocol import BindRejected, BindUncertain, Cluster, ClusterError
from gas.core import preemption, scoring
from gas.core.allocator import Policy, Rejection
from gas.core.judgement import Judgement, judge
from gas.core.ledger import Ledger
from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    ANNOTATION_TS,
    FIRST_FIT,
    NodeGpu,
    SpecError,
    as_list,
    as_mapping,
    format_cards,
    format_tiles,
    node_from_object,
    pod_request,
)
from gas.serving import wire
from gas.serving.wire import BindingArgs, ExtenderArgs, PreemptionArgs

log = logging.getLogger(__name__)

# Outcome labels, as counted in gas_requests{outcome}.
FIT = "fit"
NO_FIT = "no_fit"
BOUND = "bound"
ERROR = "error"
NO_POD = "no_pod"
API_REFUSED = "api_refused"
UNCERTAIN = "uncertain"
NOT_SYNCED = "not_synced"
# Synced, but not the replica that answers: a --leaderElect follower, or a --schedulerLease
# gas whose pod's kube-scheduler does not lead.
INACTIVE = "inactive"

NOT_SYNCED_MESSAGE = "gas is not synced with the cluster yet"


@dataclass(frozen=True)
class Options:
    max_request_bytes: int = wire.DEFAULT_MAX_REQUEST_BYTES
    # How long a pod seen in a filter call is kept for its bind, which names the pod but
    # does not carry it; past this (or on a miss) bind reads the pod from the API server.
    pod_memory_seconds: float = 600.0
    pod_memory_size: int = 20_000
    event_repeat_seconds: float = 300.0
    # A `GPUsAllocated` Event per bind is a second API write per pod, next to
    # kube-scheduler's own `Scheduled`: off unless asked for (--bindEvents). Failure Events
    # are always posted.
    bind_events: bool = False
    # --enableAllowlist, --enableDenylist, --balancedResource: read by the ledger's
    # allocator, so the ledger must be built with this same policy.
    policy: Policy = field(default_factory=Policy)


@dataclass(frozen=True)
class Outcome:
    """What one verb call decided, for metrics and the decision log."""

    label: str
    # The decision-log record (one JSON line on gas.decisions); None when nothing was
    # decided (gas not synced).
    decision: dict[str, Any] | None = None
    # Nodes refused to the pod, by reason (gas_node_rejections).
    rejections: Mapping[str, int] = field(default_factory=dict)
    # Preempt candidate nodes, by verdict (gas_preempt_nodes).
    verdicts: Mapping[str, int] = field(default_factory=dict)
    # A bind's pod whose placement policy scores nodes, placed without gas's scores: the
    # policy (gas_unscored_binds).
    unscored: str = ""


@dataclass(frozen=True)
class Reply:
    body: Any
    outcome: Outcome


class Extender:
    """The four verbs over one ledger and cluster. Thread-safe: the ledger holds its own
    lock, and bind does its API write outside it."""

    def __init__(self, ledger: Ledger, cluster: Cluster, options: Options | None = None) -> None:
        self._options = options or Options()
        self._ledger = ledger
        self._cluster = cluster
        self._memory = PodMemory(self._options.pod_memory_seconds, self._options.pod_memory_size)
        self._notices = EventLimiter(self._options.event_repeat_seconds)

    def synced(self) -> bool:
        return self._cluster.synced()

    def inactive(self) -> str:
        """Why a synced gas refuses the verbs ("" when it is not synced, or has no replicas):
        a --leaderElect follower, or a --schedulerLease gas whose kube-scheduler does not
        lead. Such a replica must not say it is not synced."""
        inactive = getattr(self._cluster, "inactive", None)
        why: str = inactive() if callable(inactive) else ""
        return why

    def _unavailable(self) -> Reply:
        why = self.inactive()
        if why:
            return Reply(wire.error_result(why), Outcome(INACTIVE))
        return Reply(wire.error_result(NOT_SYNCED_MESSAGE), Outcome(NOT_SYNCED))

    def filter(self, args: ExtenderArgs) -> Reply:
        """ExtenderFilterResult: every node given either passes or is listed with a short,
        stable reason. Remembers the pod for its bind; reserves nothing."""
        names, pod = args.names, args.pod
        if not self._cluster.synced():
            why = self.inactive()
            body = wire.filter_result([], {}, {}, args.nodes, why or "gas is not synced")
            return Reply(body, Outcome(INACTIVE if why else NOT_SYNCED))
        judged: Judgement
        try:
            ask = pod_request(pod)
        except SpecError as exc:
            judged = judge(names, [Rejection(str(exc), unresolvable=True)] * len(names))
        else:
            if args.nodes is None:
                judged = self._ledger.judge_names(ask, names, args.uid)
            else:
                candidates = [node_from_object(item) for item in args.nodes]
                results = self._ledger.check(ask, candidates, args.uid)
                judged = judge(names, list(map(results.__getitem__, names)))
            if args.uid is not None:
                self._memory.remember(args.uid, slim_pod(pod), len(judged[0]))
        passed, failed, unresolvable, counts = judged
        reasons = sorted_counts(counts)
        decision = decision_record(
            "filter",
            pod,
            nodes=len(names),
            passed=len(passed),
            reasons=reasons,
            passed_nodes=passed[:20],
        )
        if not passed and names:
            summary = "; ".join(f"{count} x {reason}" for reason, count in reasons.items())
            self._notify(
                pod, "Warning", "NoGPUFit", f"no node has GPU cards for this pod: {summary}"
            )
        kept = None
        if args.nodes is not None:
            passing = set(passed)
            kept = [item for item in args.nodes if wire.node_name(item) in passing]
        body = wire.filter_result(passed, failed, unresolvable, kept, "")
        return Reply(body, Outcome(FIT if passed else NO_FIT, decision, rejections=counts))

    def prioritize(self, args: ExtenderArgs) -> Reply:
        """HostPriorityList for the nodes given: `gas.core.scoring` explains the scores. Nodes
        the pod does not fit on, and pods that cannot be read, get 0. Reserves nothing."""
        if not self._cluster.synced():
            return self._unavailable()
        if args.uid is not None:
            self._memory.scored(args.uid)
        names = args.names
        scores = dict.fromkeys(names, 0)
        fitting = 0
        try:
            ask = pod_request(args.pod)
        except SpecError:
            ask = None
        # First fit scores 0 everywhere, and then only whether any node fits matters (the
        # outcome).
        first_fit = ask is not None and self._options.policy.placement_for(ask) == FIRST_FIT
        if ask is not None and first_fit and args.nodes is None:
            fitting = int(self._ledger.fits_any(ask, names, args.uid))
        elif ask is not None:
            given: dict[str, NodeGpu] = {}
            if args.nodes is not None:
                given = {n.name: n for n in map(node_from_object, args.nodes)}
            candidates: list[NodeGpu | str] = list(given.values()) if given else list(names)
            results = self._ledger.check(ask, candidates, args.uid)
            # First fit scores 0 everywhere: no need to copy each node's usage for it.
            policy = self._options.policy
            scored = not first_fit
            for name in names:
                result = results.get(name)
                node = given.get(name) or self._ledger.node(name)
                if result is None or isinstance(result, Rejection) or node is None:
                    continue
                fitting += 1
                if scored:
                    usage = self._ledger.usage(name)
                    scores[name] = scoring.node_score(node, usage, ask, result, policy)
        shown = dict(islice(scores.items(), 20))
        decision = decision_record("prioritize", args.pod, nodes=len(names), scores=shown)
        body = wire.host_priority_list(scores)
        return Reply(body, Outcome(FIT if fitting else NO_FIT, decision))

    def preempt(self, args: PreemptionArgs) -> Reply:
        """ExtenderPreemptionResult, always in the meta form, for the candidate nodes given
        in either form: `gas.core.preemption` explains which victims are kept, which are
        added and which nodes are dropped. A pod whose GPU asks cannot be read fits
        nowhere. Reserves nothing."""
        if not self._cluster.synced():
            return self._unavailable()
        proposals = args.proposals
        results: dict[str, preemption.Selection | Rejection]
        try:
            ask = pod_request(args.pod)
        except SpecError as exc:
            results = {name: Rejection(str(exc), unresolvable=True) for name in proposals}
        else:
            states = self._ledger.node_states(proposals, args.uid)
            policy = self._options.policy
            results = preemption.select_all(ask, proposals, states, policy, priority=args.priority)
        kept: dict[str, tuple[list[str], int]] = {}
        dropped: dict[str, str] = {}
        spared: dict[str, list[str]] = {}
        added: dict[str, list[str]] = {}
        verdicts: Counter[str] = Counter()
        for name, result in results.items():
            if isinstance(result, Rejection):
                dropped[name] = result.reason
                verdicts["dropped"] += 1
                continue
            verdicts[result.outcome] += 1
            if result.spared:
                spared[name] = list(result.spared)
            if result.added:
                added[name] = list(result.added)
            # gas cannot tell which victims a disruption budget covers, nor count those of
            # the victims it adds: the scheduler's count, which cannot exceed the proposed
            # victims left.
            proposed_left = len(result.victims) - len(result.added)
            count = min(max(args.violations[name], 0), proposed_left)
            kept[name] = (list(result.victims), count)
        decision = decision_record(
            "preempt",
            args.pod,
            nodes=len(proposals),
            kept=len(kept),
            victims={name: uids for name, (uids, _) in list(kept.items())[:20]},
            spared=dict(list(spared.items())[:20]),
            added=dict(list(added.items())[:20]),
            dropped=sorted_counts(Counter(dropped.values())),
        )
        outcome = Outcome(FIT if kept else NO_FIT, decision, verdicts=verdicts)
        return Reply(wire.preemption_result(kept), outcome)

    def bind(self, args: BindingArgs) -> Reply:
        """ExtenderBindingResult: the pod re-checked on current state, its cards reserved
        in the ledger (under its lock), then the Binding written with gas's annotations
        (outside the lock) and the reservation committed; on any failure the reservation
        is released, or kept while the write's outcome is unknown, and `Error` says why."""
        if not self._cluster.synced():
            return self._unavailable()
        pod_ref: Mapping[str, Any] = {
            "metadata": {
                "name": args.pod_name,
                "namespace": args.pod_namespace,
                "uid": args.pod_uid,
            }
        }
        node = args.node
        try:
            cards, unscored = self._bind(args)
        except _BindFailed as failure:
            error = failure.message
            decision = decision_record("bind", pod_ref, node=node, result="error", error=error)
            self._notify(
                pod_ref, "Warning", "GPUBindFailed", f"gas could not bind to {node}: {error}"
            )
            rejections = {failure.rejection: 1} if failure.rejection else {}
            return Reply(
                wire.error_result(error), Outcome(failure.label, decision, rejections=rejections)
            )
        decision = decision_record("bind", pod_ref, node=node, result="bound", cards=cards)
        if self._options.bind_events:
            message = f"gas gave {describe(cards)} on {node}"
            self._notify(pod_ref, "Normal", "GPUsAllocated", message)
        if unscored:
            message = (
                f"placement policy {unscored} chose the cards on {node} but not the node: "
                "kube-scheduler asked gas for no scores after gas's filter passed several "
                "nodes (register gas's prioritize verb in the scheduler's extender "
                "configuration)"
            )
            log.warning("pod %s/%s: %s", args.pod_namespace, args.pod_name, message)
            self._notify(pod_ref, "Warning", "GPUPolicyNotScored", message)
        return Reply(wire.error_result(""), Outcome(BOUND, decision, unscored=unscored))

    def _bind(self, args: BindingArgs) -> tuple[str, str]:
        """The cards given to the pod, bound, and its placement policy when that scores
        nodes and kube-scheduler asked for no scores (else ""); raises `_BindFailed` when
        it is not bound."""
        uid, node = args.pod_uid, args.node
        pod = self._pod_to_bind(args)
        try:
            ask = pod_request(pod)
        except SpecError as exc:
            raise _BindFailed(NO_FIT, str(exc)) from None
        result = self._ledger.reserve_placement(uid, args.pod_namespace, args.pod_name, ask, node)
        if isinstance(result, Rejection):
            raise _BindFailed(NO_FIT, f"{result.reason} (node {node})", result.reason)
        cards = format_cards(result.cards)
        annotations = {ANNOTATION_TS: str(time.time_ns()), ANNOTATION_CARDS: cards}
        if ask.wants_tiles:
            annotations[ANNOTATION_TILES] = format_tiles(result.tiles)
        try:
            self._cluster.bind(pod, node, annotations)
        except BindRejected as exc:
            self._ledger.cancel(uid)
            raise _BindFailed(API_REFUSED, f"the API server refused the binding: {exc}") from None
        except (BindUncertain, Exception) as exc:
            # The write may have landed: keep the cards held until the cluster says.
            self._ledger.commit(uid, landed=False)
            raise _BindFailed(
                UNCERTAIN,
                f"binding outcome unknown, cards stay held until the cluster shows: {exc}",
            ) from None
        self._ledger.commit(uid)
        # kube-scheduler asks for scores whenever two or more nodes are left after the
        # filters: a policy that scores them went unheard when none were asked for.
        mode = self._options.policy.placement_for(ask)
        filtered = self._memory.forget(uid)
        unheard = filtered is not None and not filtered.scored and filtered.passed >= 2
        return cards, mode if mode != FIRST_FIT and unheard else ""

    def _pod_to_bind(self, args: BindingArgs) -> dict[str, Any]:
        """The pod named, from the last filter call or else the API server, with the UID
        given; raises `_BindFailed` otherwise."""
        name, namespace, uid = args.pod_name, args.pod_namespace, args.pod_uid
        pod_ref = f"{namespace}/{name}"
        pod = self._memory.recall(uid)
        meta = as_mapping(pod.get("metadata")) if pod else {}
        if pod is None or meta.get("name") != name or meta.get("namespace") != namespace:
            try:
                pod = self._cluster.get_pod(namespace, name)
            except ClusterError as exc:
                raise _BindFailed(ERROR, f"gas could not read pod {pod_ref}: {exc}") from None
            if pod is None:
                raise _BindFailed(NO_POD, f"pod {pod_ref} does not exist")
            meta = as_mapping(pod.get("metadata"))
        if meta.get("uid") != uid:
            raise _BindFailed(NO_POD, f"pod {pod_ref} has UID {meta.get('uid')}, not {uid}")
        return pod

    def _notify(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        # Only the pod's identity, and only when it is well-typed: a filter request may
        # carry any JSON as the pod's metadata (a list there once crashed the event path).
        metadata = as_mapping(pod.get("metadata"))
        ref = {k: v for k in ("name", "namespace", "uid") if isinstance(v := metadata.get(k), str)}
        if not ref.get("name"):
            return  # no pod to attach an Event to
        if self._notices.allow(ref.get("uid", ""), reason, message):
            self._cluster.record_event({"metadata": ref}, kind, reason, message)


class _BindFailed(Exception):
    """A bind that did not happen: its outcome label, the `Error` message, and the
    ledger's rejection reason when the cards were refused."""

    def __init__(self, label: str, message: str, rejection: str = "") -> None:
        super().__init__(message)
        self.label = label
        self.message = message
        self.rejection = rejection


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What bind needs of a pod: identity, annotations and container resources."""
    metadata = as_mapping(pod.get("metadata"))
    spec = as_mapping(pod.get("spec"))

    def containers(key: str) -> list[dict[str, Any]]:
        return [
            {"name": as_mapping(c).get("name"), "resources": as_mapping(c).get("resources")}
            for c in as_list(spec.get(key))
        ]

    return {
        "metadata": {
            k: metadata[k]
            for k in ("name", "namespace", "uid", "annotations", "labels")
            if k in metadata
        },
        "spec": {
            "containers": containers("containers"),
            "initContainers": containers("initContainers"),
        },
    }


def decision_record(verb: str, pod: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """One decision: what operators grep when asking why a pod waits."""
    metadata = as_mapping(pod.get("metadata"))
    return {
        "decision": verb,
        "pod": f"{metadata.get('namespace')}/{metadata.get('name')}",
        "uid": metadata.get("uid"),
        **fields,
    }


def sorted_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """Most frequent first, then by reason."""
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def describe(cards: str) -> str:
    segments = [s for s in cards.split("|") if s]
    if not segments:
        return "no card (the pod asks for none)"
    return "cards " + " | ".join(segments)


class PodMemory:
    """Pods from recent filter calls by UID, so bind does not wait for the watch; and, for
    each, how many nodes its last filter passed and whether a prioritize followed."""

    def __init__(self, seconds: float, size: int) -> None:
        self._seconds = seconds
        self._size = size
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, _Remembered] = OrderedDict()

    def remember(self, uid: str, pod: dict[str, Any], passed: int) -> None:
        """The pod, whose filter passed `passed` nodes: no prioritize has followed it yet."""
        with self._lock:
            self._pods[uid] = _Remembered(time.monotonic() + self._seconds, pod, passed)
            self._pods.move_to_end(uid)
            while len(self._pods) > self._size:
                self._pods.popitem(last=False)

    def scored(self, uid: str) -> None:
        """A prioritize of the pod came."""
        with self._lock:
            item = self._pods.get(uid)
            if item is not None:
                item.scored = True

    def recall(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            item = self._pods.get(uid)
            if item is None:
                return None
            if item.expires < time.monotonic():
                del self._pods[uid]
                return None
            return item.pod

    def forget(self, uid: str) -> _Remembered | None:
        """Drop the pod; what was remembered of it."""
        with self._lock:
            return self._pods.pop(uid, None)


@dataclass
class _Remembered:
    expires: float
    pod: dict[str, Any]
    passed: int
    scored: bool = False


class EventLimiter:
    """At most one Event per pod, reason and message in a window: kube-scheduler retries a
    Pending pod often, and each retry would otherwise add an Event."""

    def __init__(self, seconds: float, size: int = 10_000) -> None:
        self._seconds = seconds
        self._size = size
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def allow(self, uid: str, reason: str, message: str) -> bool:
        key = (uid, reason, message)
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < self._seconds:
                return False
            self._seen[key] = now
            self._seen.move_to_end(key)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)
            return True
