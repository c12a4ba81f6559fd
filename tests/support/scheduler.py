"""A kube-scheduler emulator that calls gas the way kube-scheduler v1.28 does.

What it copies (see ../shared/reference/extender-protocol.md, sections 0, 1 and 2):
- one scheduling cycle at a time: resource-fit filtering of its own (extended resources
  counted against allocatable, including pods it has assumed but not yet bound), then the
  extender's filter with `NodeNames` (or full `Nodes`), then a node pick, then "assume";
- binding runs asynchronously, so the next pod's filter can reach gas while earlier binds
  are still in flight;
- the wire: POST, only `Content-Type: application/json`, compact JSON, exact capitalised
  keys, one attempt, a client timeout; a reply counts only with status 200 and a JSON body;
  `Error` makes the call a failure; a `NodeNames` entry not in the input is an error;
- the extender is asked only about pods that name a managed resource;
- prioritize (when `prioritize_weight` > 0) only with at least 2 feasible nodes; each
  node's total is Score x weight x 10 (its own plugins are taken to score every node the
  same), the highest total wins, ties are broken at random; a failed call adds nothing;
- with `preemption` on, DefaultPreemption after a FitError (not after a filter error):
  candidates are the nodes the extender did not call unresolvable where evicting every
  lower-priority pod makes the pod fit by node totals; victims are reprieved one by one,
  most important first (higher priority, then older), as long as it still fits; nodes left
  without a victim are no candidates. The extender's preempt verb (when `preempt_verb`)
  gets them in the meta form (cache-capable) or with whole pods; a reply naming a node
  that does not exist, a pod not on that node, or no pod for a node is an error, which
  aborts preemption. Then the node with the fewest PDB violations, the lowest highest
  victim priority, the lowest priority sum and the fewest victims (the first on ties) is
  nominated and its victims deleted; the pod is scheduled again in a later cycle.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from gas.core.model import RESOURCE_PREFIX, as_list, as_mapping
from gas.core.quantity import parse_quantity
from tests.support.apiserver import ApiServerDouble

MANAGED = ("gpu.intel.com/i915", "gpu.intel.com/xe")


@dataclass
class Outcome:
    pod: str
    node: str | None = None
    bound: bool = False
    error: str = ""
    failed_nodes: dict[str, str] = field(default_factory=dict)
    unresolvable_nodes: dict[str, str] = field(default_factory=dict)
    # The nodes the scheduler's own fit left out before asking the extender, and why
    # ("Insufficient <resource>", as kube-scheduler words it).
    unfit_nodes: dict[str, str] = field(default_factory=dict)
    # Preemption: the candidates kube-scheduler found by node totals (node -> victim
    # names), what the extender answered (None: not asked), and the nominated node.
    candidates: dict[str, list[str]] = field(default_factory=dict)
    preempt_reply: Any = None
    nominated: str | None = None
    evicted: list[str] = field(default_factory=list)


class ExtenderCallError(Exception):
    pass


class SchedulerEmulator:
    def __init__(
        self,
        api: ApiServerDouble,
        url: str,
        *,
        cert: tuple[str, str] | None = None,
        verify: str | bool = False,
        node_cache_capable: bool = True,
        timeout: float = 10.0,
        seed: int = 0,
        bind_workers: int = 8,
        prioritize_weight: int = 1,
        preemption: bool = False,
        preempt_verb: bool = True,
    ) -> None:
        self.api = api
        self.url = url.rstrip("/")
        self.node_cache_capable = node_cache_capable
        self.timeout = timeout
        self.prioritize_weight = prioritize_weight
        self.preemption = preemption
        self.preempt_verb = preempt_verb
        self.random = random.Random(seed)
        self._session = requests.Session()
        self._session.trust_env = False  # kube-scheduler trusts only its configured CA
        del self._session.headers["Connection"]  # nor does it send one on HTTP/1.1
        self._session.cert = cert
        self._session.verify = verify
        self._assumed: dict[str, tuple[str, dict[str, int]]] = {}  # uid -> (node, requests)
        self._lock = threading.Lock()
        self._binder = ThreadPoolExecutor(max_workers=bind_workers)

    def close(self) -> None:
        self._binder.shutdown(wait=True)
        self._session.close()

    # ------------------------------------------------------------ the wire

    def call(self, verb: str, body: Mapping[str, Any]) -> Any:
        data = json.dumps(body, separators=(",", ":"))
        response = self._session.post(
            f"{self.url}/{verb}",
            data=data,
            headers={"Content-Type": "application/json"},
            timeout=self.timeout,
        )
        if response.status_code != 200:
            raise ExtenderCallError(f"{verb}: code {response.status_code}: {response.text}")
        if not response.content:
            raise ExtenderCallError(f"{verb}: EOF")
        return response.json()

    # ------------------------------------------------------------ one cycle

    def schedule(self, namespace: str, name: str) -> Future[Outcome]:
        """Run one scheduling cycle now; the binding cycle completes in the future."""
        pod = self.api.get_pod(namespace, name)
        if pod is None:
            raise KeyError(f"{namespace}/{name}")
        outcome = Outcome(pod=f"{namespace}/{name}")
        feasible = self._fit_nodes(pod, outcome.unfit_nodes)
        if feasible and _interested(pod):
            try:
                feasible = self._extender_filter(pod, feasible, outcome)
            except (ExtenderCallError, requests.RequestException, ValueError) as exc:
                outcome.error = f"filter: {exc}"
                return _done(outcome)
        if not feasible:
            if self.preemption and not outcome.error:
                self._preempt(pod, outcome)
            outcome.error = outcome.error or "unschedulable"
            return _done(outcome)
        if len(feasible) >= 2 and self.prioritize_weight > 0 and _interested(pod):
            feasible = self._extender_prioritize(pod, feasible)
        node = feasible[0] if len(feasible) == 1 else self.random.choice(feasible)
        outcome.node = node
        uid = pod["metadata"]["uid"]
        with self._lock:
            self._assumed[uid] = (node, _pod_requests(pod))
        return self._binder.submit(self._bind, pod, node, outcome)

    def schedule_now(self, namespace: str, name: str) -> Outcome:
        return self.schedule(namespace, name).result()

    def _args(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"Pod": pod}
        if self.node_cache_capable:
            body.update(Nodes=None, NodeNames=nodes)
        else:
            wanted = set(nodes)
            items = [n for n in self.api.list_nodes() if n["metadata"]["name"] in wanted]
            body.update(Nodes={"metadata": {}, "items": items}, NodeNames=None)
        return body

    def _extender_prioritize(self, pod: dict[str, Any], nodes: list[str]) -> list[str]:
        """The nodes with the highest total, in `nodes` order (the caller picks at random)."""
        totals = dict.fromkeys(nodes, 0)
        try:
            reply = self.call("scheduler/prioritize", self._args(pod, nodes))
        except (ExtenderCallError, requests.RequestException, ValueError):
            return nodes  # any prioritize error is ignored
        if not isinstance(reply, list):
            return nodes  # an object instead of an array is a decode error, ignored too
        for entry in reply:
            host = entry.get("Host") if isinstance(entry, dict) else None
            score = entry.get("Score") if isinstance(entry, dict) else None
            if host in totals and isinstance(score, int):
                totals[host] += score * self.prioritize_weight * 10
        best = max(totals.values())
        return [node for node in nodes if totals[node] == best]

    def _extender_filter(
        self, pod: dict[str, Any], nodes: list[str], outcome: Outcome
    ) -> list[str]:
        reply = self.call("scheduler/filter", self._args(pod, nodes))
        if reply is None:
            return []
        if reply.get("Error"):
            raise ExtenderCallError(reply["Error"])
        outcome.failed_nodes = dict(reply.get("FailedNodes") or {})
        outcome.unresolvable_nodes = dict(reply.get("FailedAndUnresolvableNodes") or {})
        if self.node_cache_capable and reply.get("NodeNames") is not None:
            names = list(reply["NodeNames"])
            unknown = [n for n in names if n not in nodes]
            if unknown:
                raise ExtenderCallError(f"extender claims unknown nodes {unknown}")
            return names
        if reply.get("Nodes") is not None:
            return [n["metadata"]["name"] for n in reply["Nodes"].get("items") or []]
        return []

    def _bind(self, pod: dict[str, Any], node: str, outcome: Outcome) -> Outcome:
        meta = pod["metadata"]
        uid = meta["uid"]
        try:
            if _interested(pod):
                reply = self.call(
                    "scheduler/bind",
                    {
                        "PodName": meta["name"],
                        "PodNamespace": meta["namespace"],
                        "PodUID": uid,
                        "Node": node,
                    },
                )
                if reply and reply.get("Error"):
                    raise ExtenderCallError(reply["Error"])
            else:
                raise ExtenderCallError("emulator only binds through the extender")
            outcome.bound = True
        except (ExtenderCallError, requests.RequestException, ValueError) as exc:
            outcome.error = f"bind: {exc}"
        finally:
            with self._lock:
                self._assumed.pop(uid, None)
        return outcome

    # ------------------------------------------------------------ DefaultPreemption

    def _preempt(self, pod: dict[str, Any], outcome: Outcome) -> None:
        spec = pod.get("spec") or {}
        if spec.get("preemptionPolicy") == "Never":
            return
        priority = _priority(pod)
        want = _pod_requests(pod)
        pods = [
            p
            for p in self.api.list_pods()
            if p.get("spec", {}).get("nodeName")
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ]
        with self._lock:
            assumed = list(self._assumed.values())
        nodes = {n["metadata"]["name"]: n for n in self.api.list_nodes()}
        candidates: dict[str, list[dict[str, Any]]] = {}
        for name, node in nodes.items():
            if name in outcome.unresolvable_nodes:
                continue
            allocatable = {
                res: parse_quantity(q)
                for res, q in (node.get("status", {}).get("allocatable") or {}).items()
                if res.startswith(RESOURCE_PREFIX)
            }
            here = [p for p in pods if p["spec"]["nodeName"] == name]
            stays = [_pod_requests(p) for p in here if _priority(p) >= priority]
            stays += [requests_ for node_name, requests_ in assumed if node_name == name]
            lower = sorted(
                (p for p in here if _priority(p) < priority),
                key=lambda p: (
                    -_priority(p),
                    p["metadata"].get("creationTimestamp") or "",
                    p["metadata"]["name"],
                ),
            )
            if not _fits(allocatable, stays, want):
                continue
            victims = []
            for other in lower:  # reprieve the most important first
                if _fits(allocatable, [*stays, _pod_requests(other)], want):
                    stays.append(_pod_requests(other))
                else:
                    victims.append(other)
            if victims:
                candidates[name] = victims
        outcome.candidates = {
            n: [v["metadata"]["name"] for v in vs] for n, vs in candidates.items()
        }
        if not candidates:
            return
        if self.preempt_verb and _interested(pod):
            try:
                candidates = self._extender_preempt(pod, candidates, nodes, pods, outcome)
            except (ExtenderCallError, requests.RequestException, ValueError) as exc:
                outcome.error = f"preempt: {exc}"
                return
        if not candidates:
            return
        best = min(
            candidates,
            key=lambda n: (
                max(_priority(v) for v in candidates[n]),
                sum(_priority(v) for v in candidates[n]),
                len(candidates[n]),
            ),
        )
        outcome.nominated = best
        for victim in candidates[best]:
            meta = victim["metadata"]
            self.api.delete_pod(meta["namespace"], meta["name"])
            outcome.evicted.append(meta["name"])
        self.api.patch_pod(
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            {"status": {"nominatedNodeName": best}},
        )

    def _extender_preempt(
        self,
        pod: dict[str, Any],
        candidates: dict[str, list[dict[str, Any]]],
        nodes: Mapping[str, Any],
        pods: list[dict[str, Any]],
        outcome: Outcome,
    ) -> dict[str, list[dict[str, Any]]]:
        if self.node_cache_capable:
            meta = {
                n: {"Pods": [{"UID": v["metadata"]["uid"]} for v in vs], "NumPDBViolations": 0}
                for n, vs in candidates.items()
            }
            body = {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta}
        else:
            full = {n: {"Pods": vs, "NumPDBViolations": 0} for n, vs in candidates.items()}
            body = {"Pod": pod, "NodeNameToVictims": full, "NodeNameToMetaVictims": None}
        reply = outcome.preempt_reply = self.call("scheduler/preempt", body)
        answered = (reply or {}).get("NodeNameToMetaVictims") or {}
        result: dict[str, list[dict[str, Any]]] = {}
        for name, victims in answered.items():
            if name not in nodes:
                raise ExtenderCallError(f"preempt: node {name} not found")
            listed = (victims or {}).get("Pods") or []
            if not listed:
                raise ExtenderCallError(f"expected at least one victim pod on node {name}")
            on_node = {p["metadata"]["uid"]: p for p in pods if p["spec"]["nodeName"] == name}
            result[name] = []
            for item in listed:
                if item.get("UID") not in on_node:
                    raise ExtenderCallError(f"preempt: pod {item.get('UID')} not on {name}")
                result[name].append(on_node[item["UID"]])
        return result

    # ------------------------------------------------------------ NodeResourcesFit

    def _fit_nodes(self, pod: dict[str, Any], unfit: dict[str, str] | None = None) -> list[str]:
        """Nodes whose allocatable covers the pod's extended requests, as the scheduler's
        own NodeResourcesFit plugin sees it (totals per node, not per card); the others go
        into `unfit`, each with the resources it is short of."""
        want = _pod_requests(pod)
        used: dict[str, dict[str, int]] = {}
        for other in self.api.list_pods():
            node = other.get("spec", {}).get("nodeName")
            if node and other.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                _add(used.setdefault(node, {}), _pod_requests(other))
        with self._lock:
            for node, requests_ in self._assumed.values():
                _add(used.setdefault(node, {}), requests_)
        result = []
        nodes = self.api.list_nodes()
        self.random.shuffle(nodes)  # the scheduler rotates its starting node
        for node in nodes:
            name = node["metadata"]["name"]
            allocatable = node.get("status", {}).get("allocatable") or {}
            short = [
                res
                for res, amount in sorted(want.items())
                if amount > 0
                and (
                    res not in allocatable
                    or parse_quantity(allocatable[res]) - used.get(name, {}).get(res, 0) < amount
                )
            ]
            if not short:
                result.append(name)
            elif unfit is not None:
                unfit[name] = ", ".join(f"Insufficient {res}" for res in short)
        return result


def listed_scores(listed: Any, names: list[str]) -> dict[str, int]:
    """A prioritize answer (`HostPriorityList`, decoded) as kube-scheduler reads it: each
    of `names` with its listed score, 0 when left out; checked to list only nodes of
    `names`, each with an integer score other than 0 (gas leaves the 0s out)."""
    assert isinstance(listed, list)
    assert all(isinstance(e, dict) and set(e) == {"Host", "Score"} for e in listed), listed
    assert all(type(e["Score"]) is int and e["Score"] != 0 for e in listed), listed
    assert all(e["Host"] in names for e in listed), listed
    return dict.fromkeys(names, 0) | {e["Host"]: e["Score"] for e in listed}


def _interested(pod: Mapping[str, Any]) -> bool:
    spec = as_mapping(pod.get("spec"))
    for container in as_list(spec.get("containers")) + as_list(spec.get("initContainers")):
        resources = as_mapping(as_mapping(container).get("resources"))
        keys = set(as_mapping(resources.get("requests"))) | set(as_mapping(resources.get("limits")))
        if keys & set(MANAGED):
            return True
    return False


def _pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for container in as_list(as_mapping(pod.get("spec")).get("containers")):
        resources = as_mapping(as_mapping(container).get("resources"))
        merged = {**as_mapping(resources.get("limits")), **as_mapping(resources.get("requests"))}
        for res, quantity in merged.items():
            if res.startswith(RESOURCE_PREFIX):
                total[res] = total.get(res, 0) + parse_quantity(quantity)
    return total


def _priority(pod: Mapping[str, Any]) -> int:
    value = as_mapping(pod.get("spec")).get("priority")
    return value if isinstance(value, int) else 0


def _fits(
    allocatable: Mapping[str, int], held: list[dict[str, int]], want: Mapping[str, int]
) -> bool:
    used: dict[str, int] = {}
    for requests_ in held:
        _add(used, requests_)
    return all(
        res in allocatable and allocatable[res] - used.get(res, 0) >= amount
        for res, amount in want.items()
        if amount > 0
    )


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for res, amount in more.items():
        into[res] = into.get(res, 0) + amount


def _done(outcome: Outcome) -> Future[Outcome]:
    future: Future[Outcome] = Future()
    future.set_result(outcome)
    return future
