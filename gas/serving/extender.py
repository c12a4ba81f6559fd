"""The HTTP face of gas: the scheduler-extender routes, health, and error mapping.

Wire format as kube-scheduler speaks it: top-level keys are Go field names, read
case-insensitively and always written with their exact capitalisation. A pod that does not
fit is a `FailedNodes` entry, never an `Error`; a malformed request is a 400 with a JSON
body naming the problem; `Error` carries internal failures only.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter
from typing import Any

from flask import Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from gas.cluster.protocol import BindRejected, BindUncertain, Cluster, ClusterError
from gas.core import preemption, scoring
from gas.core.allocator import Policy, Rejection
from gas.core.ledger import Ledger
from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_TILES,
    ANNOTATION_TS,
    FIRST_FIT,
    Allocation,
    NodeGpu,
    SpecError,
    as_list,
    as_mapping,
    format_cards,
    format_tiles,
    node_from_object,
    pod_request,
)
from gas.serving import routes
from gas.serving.metrics import Metrics

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_ERROR_LENGTH = 1000


@dataclass(frozen=True)
class Options:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # How long a pod seen in a filter call is kept for its bind, which names the pod but
    # does not carry it; past this (or on a miss) bind reads the pod from the API server.
    pod_memory_seconds: float = 600.0
    pod_memory_size: int = 20_000
    event_repeat_seconds: float = 300.0
    # --enableAllowlist, --enableDenylist, --balancedResource: read by the ledger's
    # allocator, so the ledger must be built with this same policy.
    policy: Policy = field(default_factory=Policy)


class BadRequest(Exception):
    """The request body is not what the extender protocol says; answered with 400."""


class _PodMemory:
    """Pods from recent filter calls by UID, so bind does not wait for the watch."""

    def __init__(self, seconds: float, size: int) -> None:
        self._seconds = seconds
        self._size = size
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    def remember(self, uid: str, pod: dict[str, Any]) -> None:
        with self._lock:
            self._pods[uid] = (time.monotonic() + self._seconds, pod)
            self._pods.move_to_end(uid)
            while len(self._pods) > self._size:
                self._pods.popitem(last=False)

    def recall(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            item = self._pods.get(uid)
            if item is None:
                return None
            if item[0] < time.monotonic():
                del self._pods[uid]
                return None
            return item[1]

    def forget(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)


def create_app(
    ledger: Ledger,
    cluster: Cluster,
    options: Options | None = None,
    metrics: Metrics | None = None,
) -> Flask:
    options = options or Options()
    metrics = metrics or Metrics()
    metrics.watch_ledger(ledger)
    app = Flask("gas")
    app.config["MAX_CONTENT_LENGTH"] = options.max_request_bytes
    memory = _PodMemory(options.pod_memory_seconds, options.pod_memory_size)
    notices = _EventLimiter(options.event_repeat_seconds)

    def notify(pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        # Only the pod's identity, and only when it is well-typed: a filter request may
        # carry any JSON as the pod's metadata (a list there once crashed the event path).
        metadata = as_mapping(pod.get("metadata"))
        ref = {k: v for k in ("name", "namespace", "uid") if isinstance(v := metadata.get(k), str)}
        if not ref.get("name"):
            return  # no pod to attach an Event to
        if notices.allow(ref.get("uid", ""), reason, message):
            cluster.record_event({"metadata": ref}, kind, reason, message)

    @app.before_request
    def start_clock() -> None:
        g.started = time.perf_counter()

    @app.after_request
    def count(response: Response) -> Response:
        verb = routes.VERBS.get(request.path)
        if verb is not None:
            metrics.latency.labels(verb).observe(time.perf_counter() - g.started)
            outcome = g.get("outcome") or _STATUS_OUTCOMES.get(response.status_code, "error")
            metrics.requests.labels(verb, outcome).inc()
        return response

    @app.post(routes.FILTER)
    def filter_route() -> Response:
        args, pod = _decode_pod_args("ExtenderArgs")
        names, node_objects = _candidate_nodes(args)
        if not cluster.synced():
            return _not_synced(_filter_reply([], {}, {}, node_objects, "gas is not synced"))
        uid = _pod_uid(pod)
        answers: list[Allocation | Rejection]
        try:
            pod_ask = pod_request(pod)
        except SpecError as exc:
            answers = [Rejection(str(exc), unresolvable=True)] * len(names)
        else:
            if uid is not None:
                memory.remember(uid, _slim_pod(pod))
            if node_objects is None:
                answers = ledger.check_names(pod_ask, names, uid)
            else:
                candidates = [node_from_object(item) for item in node_objects]
                results = ledger.check(pod_ask, candidates, uid)
                answers = list(map(results.__getitem__, names))
        passed, failed, unresolvable, counts = _partition(names, answers)
        for reason, count in counts.items():
            metrics.rejections.labels(reason).inc(count)
        reasons = _sorted_counts(counts)
        g.outcome = "fit" if passed else "no_fit"
        _decision(
            "filter",
            pod,
            nodes=len(names),
            passed=len(passed),
            reasons=reasons,
            passed_nodes=passed[:20],
        )
        if not passed and names:
            summary = "; ".join(f"{count} x {reason}" for reason, count in reasons.items())
            notify(pod, "Warning", "NoGPUFit", f"no node has GPU cards for this pod: {summary}")
        kept = None
        if node_objects is not None:
            passing = set(passed)
            kept = [item for item in node_objects if _node_name(item) in passing]
        return _filter_reply(passed, failed, unresolvable, kept, "")

    @app.post(routes.PRIORITIZE)
    def prioritize_route() -> Response:
        """HostPriorityList for the nodes given: `gas.core.scoring` explains the scores. Nodes
        the pod does not fit on, and pods that cannot be read, get 0. Reserves nothing."""
        args, pod = _decode_pod_args("ExtenderArgs")
        names, node_objects = _candidate_nodes(args)
        if not cluster.synced():
            return _not_synced({"Error": "gas is not synced with the cluster yet"})
        scores = dict.fromkeys(names, 0)
        fitting = 0
        try:
            pod_ask = pod_request(pod)
        except SpecError:
            pod_ask = None
        if pod_ask is not None:
            given: dict[str, NodeGpu] = {}
            if node_objects is not None:
                given = {n.name: n for n in map(node_from_object, node_objects)}
            candidates: list[NodeGpu | str] = list(given.values()) if given else list(names)
            results = ledger.check(pod_ask, candidates, _pod_uid(pod))
            # First fit scores 0 everywhere: no need to copy each node's usage for it.
            scored = options.policy.placement_for(pod_ask) != FIRST_FIT
            for name in names:
                result = results.get(name)
                node = given.get(name) or ledger.node(name)
                if result is None or isinstance(result, Rejection) or node is None:
                    continue
                fitting += 1
                if scored:
                    scores[name] = scoring.node_score(
                        node, ledger.usage(name), pod_ask, result, options.policy
                    )
        g.outcome = "fit" if fitting else "no_fit"
        _decision("prioritize", pod, nodes=len(names), scores=dict(list(scores.items())[:20]))
        return _json([{"Host": name, "Score": value} for name, value in scores.items()])

    @app.post(routes.PREEMPT)
    def preempt_route() -> Response:
        """ExtenderPreemptionResult, always in the meta form, for the candidate nodes given
        in either form: `gas.core.preemption` explains which victims are kept, which are added
        and which nodes are dropped. A pod whose GPU asks cannot be read fits nowhere.
        Reserves nothing."""
        args, pod = _decode_pod_args("ExtenderPreemptionArgs")
        proposals, violations = _preemption_candidates(args)
        if not cluster.synced():
            return _not_synced({"Error": "gas is not synced with the cluster yet"})
        results: dict[str, preemption.Selection | Rejection]
        try:
            pod_ask = pod_request(pod)
        except SpecError as exc:
            results = {name: Rejection(str(exc), unresolvable=True) for name in proposals}
        else:
            states = ledger.node_states(proposals, _pod_uid(pod))
            results = preemption.select_all(
                pod_ask, proposals, states, options.policy, priority=_priority(pod)
            )
        reply: dict[str, Any] = {}
        dropped: dict[str, str] = {}
        spared: dict[str, list[str]] = {}
        added: dict[str, list[str]] = {}
        for name, result in results.items():
            if isinstance(result, Rejection):
                dropped[name] = result.reason
                metrics.preempt_nodes.labels("dropped").inc()
                continue
            metrics.preempt_nodes.labels(result.outcome).inc()
            if result.spared:
                spared[name] = list(result.spared)
            if result.added:
                added[name] = list(result.added)
            # gas cannot tell which victims a disruption budget covers, nor count those of
            # the victims it adds: the scheduler's count, which cannot exceed the proposed
            # victims left.
            proposed_left = len(result.victims) - len(result.added)
            count = min(max(violations[name], 0), proposed_left)
            reply[name] = {
                "Pods": [{"UID": victim} for victim in result.victims],
                "NumPDBViolations": count,
            }
        g.outcome = "fit" if reply else "no_fit"
        _decision(
            "preempt",
            pod,
            nodes=len(proposals),
            kept=len(reply),
            victims={name: [p["UID"] for p in v["Pods"]] for name, v in list(reply.items())[:20]},
            spared=dict(list(spared.items())[:20]),
            added=dict(list(added.items())[:20]),
            dropped=_reason_counts(dropped),
        )
        return _json({"NodeNameToMetaVictims": reply})

    @app.post(routes.BIND)
    def bind_route() -> Response:
        args = _decode_object()
        fields = {}
        for key in ("PodName", "PodNamespace", "PodUID", "Node"):
            value = args.get(key.lower())
            if not isinstance(value, str) or not value:
                raise BadRequest(f"ExtenderBindingArgs.{key} must be a non-empty string")
            fields[key] = value
        name, namespace, uid, node = (
            fields["PodName"],
            fields["PodNamespace"],
            fields["PodUID"],
            fields["Node"],
        )
        if not cluster.synced():
            return _not_synced({"Error": "gas is not synced with the cluster yet"})
        pod_ref: Mapping[str, Any] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid}
        }
        error, cards = _bind(name, namespace, uid, node)
        if error:
            _decision("bind", pod_ref, node=node, result="error", error=error)
            notify(pod_ref, "Warning", "GPUBindFailed", f"gas could not bind to {node}: {error}")
        else:
            g.outcome = "bound"
            _decision("bind", pod_ref, node=node, result="bound", cards=cards)
            notify(pod_ref, "Normal", "GPUsAllocated", f"gas gave {_describe(cards)} on {node}")
        return _json({"Error": _clean(error)})

    def _bind(name: str, namespace: str, uid: str, node: str) -> tuple[str, str]:
        """("", cards) when bound, else (error, "")."""
        pod_ref = f"{namespace}/{name}"
        pod = memory.recall(uid)
        meta = as_mapping(pod.get("metadata")) if pod else {}
        if pod is None or meta.get("name") != name or meta.get("namespace") != namespace:
            try:
                pod = cluster.get_pod(namespace, name)
            except ClusterError as exc:
                g.outcome = "error"
                return f"gas could not read pod {pod_ref}: {exc}", ""
            if pod is None:
                g.outcome = "no_pod"
                return f"pod {pod_ref} does not exist", ""
            meta = as_mapping(pod.get("metadata"))
        if meta.get("uid") != uid:
            g.outcome = "no_pod"
            return f"pod {pod_ref} has UID {meta.get('uid')}, not {uid}", ""
        try:
            pod_ask = pod_request(pod)
        except SpecError as exc:
            g.outcome = "no_fit"
            return str(exc), ""
        result = ledger.reserve_placement(uid, namespace, name, pod_ask, node)
        if isinstance(result, Rejection):
            g.outcome = "no_fit"
            metrics.rejections.labels(result.reason).inc()
            return f"{result.reason} (node {node})", ""
        cards = format_cards(result.cards)
        annotations = {ANNOTATION_TS: str(time.time_ns()), ANNOTATION_CARDS: cards}
        if pod_ask.wants_tiles:
            annotations[ANNOTATION_TILES] = format_tiles(result.tiles)
        try:
            cluster.bind(pod, node, annotations)
        except BindRejected as exc:
            ledger.cancel(uid)
            g.outcome = "api_refused"
            return f"the API server refused the binding: {exc}", ""
        except (BindUncertain, Exception) as exc:
            # The write may have landed: keep the cards held until the cluster says.
            ledger.commit(uid, landed=False)
            g.outcome = "uncertain"
            return (
                f"binding outcome unknown, cards stay held until the cluster shows: {exc}",
                "",
            )
        ledger.commit(uid)
        memory.forget(uid)
        return "", cards

    @app.get("/metrics")
    def metrics_route() -> Response:
        return Response(metrics.exposition(), mimetype="text/plain; version=0.0.4")

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        if cluster.synced():
            return _json({"status": "ready"})
        return _json({"status": "not synced with the cluster"}, 503)

    @app.get("/debug/ledger")
    def ledger_view() -> Response:
        return _json(ledger.snapshot())

    @app.errorhandler(BadRequest)
    def bad_request(exc: BadRequest) -> Response:
        log.info("bad request to %s: %s", request.path, exc)
        return _json({"Error": _clean(f"bad request: {exc}")}, 400)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        if code >= 400:
            log.info("%s %s -> %d", request.method, request.path, code)
        return _json({"Error": _clean(f"{code} {exc.name}: {exc.description}")}, code)

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.path)
        return _json({"Error": _clean(f"internal error: {type(exc).__name__}: {exc}")}, 500)

    return app


# ------------------------------------------------------------------ decoding


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _reject_huge_float(text: str) -> float:
    # 1e400 reads as infinity, which a JSON reply cannot carry back (Go refuses it too).
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _read_body() -> bytes:
    """The whole body; 413 when it is larger than the limit, even without Content-Length.

    werkzeug enforces the limit only through the declared Content-Length: a chunked body
    is silently cut at the limit, and the cut could even parse as JSON."""
    limit = current_app.config.get("MAX_CONTENT_LENGTH")
    try:
        if limit is None or request.content_length is not None:
            return request.get_data(cache=False)  # werkzeug refuses a large declared size
        # Chunked: read the server's own (terminated) stream, one byte past the limit.
        data = request.environ["wsgi.input"].read(limit + 1)
    except OSError as exc:  # the client stalled past the server's read deadline
        raise RequestTimeout(f"the request body did not arrive in time: {exc}") from None
    if len(data) > limit:
        raise RequestEntityTooLarge()
    return bytes(data)


def _decode_pod_args(what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request body and its `Pod` object (400 when it is not one)."""
    args = _decode_object()
    pod = args.get("pod")
    if not isinstance(pod, dict):
        raise BadRequest(f"{what}.Pod must be a Pod object")
    return args, pod


def _pod_uid(pod: Mapping[str, Any]) -> str | None:
    uid = as_mapping(pod.get("metadata")).get("uid")
    return uid if isinstance(uid, str) and uid else None


def _decode_object() -> dict[str, Any]:
    """The request body as a JSON object with lower-cased top-level keys."""
    data = _read_body()
    try:
        value = json.loads(data, parse_constant=_reject_constant, parse_float=_reject_huge_float)
    except RecursionError:
        raise BadRequest("JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("body must be a JSON object")
    return _fold(value)


def _fold(value: Mapping[str, Any]) -> dict[str, Any]:
    """A wire struct's keys lower-cased, as Go matches field names case-insensitively."""
    lowered: dict[str, Any] = {}
    for key, item in value.items():
        # An exact-case key wins over a differently cased duplicate, as in Go.
        if key.lower() not in lowered or key[:1].isupper():
            lowered[key.lower()] = item
    return lowered


def _candidate_nodes(args: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """Names of the nodes to judge, and the Node objects when the scheduler sent them."""
    names = args.get("nodenames")
    if names is not None:
        # set(map(type, ...)) runs in C: NodeNames may list thousands of nodes.
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
        return list(dict.fromkeys(names)), None
    nodes = args.get("nodes")
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise BadRequest("ExtenderArgs.Nodes must be a NodeList with an items list")
        if not all(_node_name(item) for item in items):
            raise BadRequest("every node in ExtenderArgs.Nodes needs metadata.name")
        unique = {_node_name(item): item for item in items}
        return list(unique), list(unique.values())
    raise BadRequest("ExtenderArgs carries neither NodeNames nor Nodes")


def _preemption_candidates(
    args: Mapping[str, Any],
) -> tuple[dict[str, list[preemption.Victim]], dict[str, int]]:
    """The proposed victims per node and each node's NumPDBViolations, from
    `NodeNameToMetaVictims` (UIDs only) when it is given, else `NodeNameToVictims` (whole
    pods, whose `spec.priority` is read). A null node entry proposes no victim."""
    meta = args.get("nodenametometavictims")
    full = args.get("nodenametovictims")
    if meta is not None:
        field, victims_of = "NodeNameToMetaVictims", _meta_victim
    elif full is not None:
        field, victims_of = "NodeNameToVictims", _pod_victim
    else:
        raise BadRequest(
            "ExtenderPreemptionArgs carries neither NodeNameToMetaVictims nor NodeNameToVictims"
        )
    nodes = meta if meta is not None else full
    if not isinstance(nodes, dict):
        raise BadRequest(f"ExtenderPreemptionArgs.{field} must be an object of nodes")
    proposals: dict[str, list[preemption.Victim]] = {}
    violations: dict[str, int] = {}
    for name, entry in nodes.items():
        if entry is None:
            proposals[name], violations[name] = [], 0
            continue
        if not isinstance(entry, dict):
            raise BadRequest(f"{field}[{name[:100]!r}] must be an object with Pods")
        entry = _fold(entry)
        pods = entry.get("pods")
        count = entry.get("numpdbviolations", 0)
        if pods is not None and not isinstance(pods, list):
            raise BadRequest(f"{field}[{name[:100]!r}].Pods must be a list")
        if not isinstance(count, int) or isinstance(count, bool):
            raise BadRequest(f"{field}[{name[:100]!r}].NumPDBViolations must be an integer")
        proposals[name] = [victims_of(item, f"{field}[{name[:100]!r}]") for item in pods or []]
        violations[name] = count
    return proposals, violations


def _priority(pod: Mapping[str, Any]) -> int:
    """The pod's `spec.priority`; 0 without one, as kube-scheduler counts it."""
    value = as_mapping(pod.get("spec")).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _meta_victim(item: object, where: str) -> preemption.Victim:
    uid = _fold(item).get("uid") if isinstance(item, dict) else None
    if not isinstance(uid, str) or not uid:
        raise BadRequest(f"every pod in {where}.Pods needs a non-empty UID")
    return preemption.Victim(uid)


def _pod_victim(item: object, where: str) -> preemption.Victim:
    pod = as_mapping(item)
    uid = as_mapping(pod.get("metadata")).get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest(f"every pod in {where}.Pods needs metadata.uid")
    priority = as_mapping(pod.get("spec")).get("priority")
    if isinstance(priority, bool) or not isinstance(priority, int):
        priority = None
    return preemption.Victim(uid, priority)


def _node_name(node: Mapping[str, Any]) -> str:
    name = as_mapping(node.get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def _slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
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


# ------------------------------------------------------------------ replies


def _filter_reply(
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    node_objects: list[dict[str, Any]] | None,
    error: str,
) -> Response:
    return _json(
        {
            "Nodes": None if node_objects is None else {"metadata": {}, "items": node_objects},
            "NodeNames": passed,
            "FailedNodes": _clean_values(failed),
            "FailedAndUnresolvableNodes": _clean_values(unresolvable),
            "Error": _clean(error),
        }
    )


def _partition(
    names: list[str], answers: list[Allocation | Rejection]
) -> tuple[list[str], dict[str, str], dict[str, str], Counter[str]]:
    """(passed names, failed and unresolvable reasons by name, nodes per reason) in the
    order of `names`, from the answer for each. A filter judges thousands of nodes: every
    step is a C-level pass over them rather than a Python loop."""
    refused = list(map(isinstance, answers, repeat(Rejection)))
    passed = list(compress(names, map(operator.not_, refused)))
    rejections = list(compress(answers, refused))
    refused_names = list(compress(names, refused))
    reasons: list[str] = list(map(attrgetter("reason"), rejections))
    final = list(map(attrgetter("unresolvable"), rejections))
    # Two zips rather than one list of pairs: zip reuses its tuple as dict() consumes it,
    # where a list would hold thousands of tuples for the garbage collector to count.
    failed = dict(compress(zip(refused_names, reasons, strict=True), map(operator.not_, final)))
    unresolvable = dict(compress(zip(refused_names, reasons, strict=True), final))
    return passed, failed, unresolvable, Counter(reasons)


def _clean_values(reasons: dict[str, str]) -> dict[str, str]:
    """`_clean` on every value; thousands of nodes share a few reasons, each cleaned once,
    and the dict is returned as it is when no reason changes."""
    cleaned: dict[str, str] = {}
    for reason in reasons.values():
        if reason not in cleaned:
            cleaned[reason] = _clean(reason)
    if all(before is after for before, after in cleaned.items()):
        return reasons
    return {name: cleaned[reason] for name, reason in reasons.items()}


def _not_synced(reply: Response | dict[str, Any]) -> Response:
    response = reply if isinstance(reply, Response) else _json(reply)
    response.status_code = 503
    return response


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status, mimetype="application/json")


def _clean(message: str) -> str:
    """kube-scheduler uses Error strings as format strings, so `%` must not appear."""
    message = message.replace("%", " percent")
    if len(message) > MAX_ERROR_LENGTH:
        message = message[: MAX_ERROR_LENGTH - 3] + "..."
    return message


# ------------------------------------------------------------------ observability

_STATUS_OUTCOMES = {400: "bad_request", 413: "bad_request", 503: "not_synced"}

decisions = logging.getLogger("gas.decisions")


def _decision(verb: str, pod: Mapping[str, Any], **fields: Any) -> None:
    """One JSON line per decision: what operators grep when asking why a pod waits."""
    metadata = as_mapping(pod.get("metadata"))
    record = {
        "decision": verb,
        "pod": f"{metadata.get('namespace')}/{metadata.get('name')}",
        "uid": metadata.get("uid"),
        **fields,
    }
    decisions.info(json.dumps(record, separators=(",", ":"), sort_keys=False))


def _reason_counts(reasons: Mapping[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in reasons.values():
        counts[reason] = counts.get(reason, 0) + 1
    return _sorted_counts(counts)


def _sorted_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """Most frequent first, then by reason."""
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _describe(cards: str) -> str:
    segments = [s for s in cards.split("|") if s]
    if not segments:
        return "no card (the pod asks for none)"
    return "cards " + " | ".join(segments)


class _EventLimiter:
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
