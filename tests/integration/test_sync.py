"""The ledger is rebuilt from the cluster and stays in step with it.

Real `gas serve` processes (gunicorn, mutual TLS) with the real `kubernetes` client inside,
listing and watching the API-server double: restart accounting, watch events, 410 Gone,
API-server outages, uncertain Binding outcomes, and no double counting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gas.cluster.kube import pending_verdict
from gas.core.allocator import NODE_BLOCKED
from gas.core.model import ANNOTATION_CARDS, I915
from gas.tools.audit import usage_from_pods
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import assert_consistent, ledger_of, wait_for_nodes
from tests.support.objects import GI, MEM, bound_pod, container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.scheduler import SchedulerEmulator
from tests.support.workload import cut_connections

UNKNOWN_NODE = "gpu: node is not known to gas"
PODS = "/api/v1/pods"

StartGas = Callable[..., GasProcess]


# ------------------------------------------------------------------ helpers


def launch(start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles) -> GasProcess:
    process = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    process.wait_ready()
    return process


def probe(name: str, *containers: dict[str, Any]) -> dict[str, Any]:
    """A pod that only exists in a filter call."""
    pod = gpu_pod(name, *containers)
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def filter_reply(gas: GasProcess, pod: dict[str, Any], *nodes: str) -> dict[str, Any]:
    response = gas.post("/scheduler/filter", {"Pod": pod, "NodeNames": list(nodes)})
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    assert reply["Error"] == ""
    return reply


def passes(gas: GasProcess, pod: dict[str, Any], node: str) -> bool:
    reply = filter_reply(gas, pod, node)
    return bool(reply["NodeNames"] == [node])


def refusal(gas: GasProcess, pod: dict[str, Any], node: str) -> str:
    """Why gas refuses `pod` on `node` (fails if it does not refuse)."""
    reply = filter_reply(gas, pod, node)
    assert reply["NodeNames"] == [], f"{node} unexpectedly passed"
    reasons = {**reply["FailedNodes"], **reply["FailedAndUnresolvableNodes"]}
    reason: str = reasons[node]
    return reason


def cluster_usage(apiserver: ApiServerDouble) -> dict[str, Any]:
    """What the cluster's pods imply, without the empty entries of blocked-only nodes."""
    return {node: cards for node, cards in usage_from_pods(apiserver.list_pods()).items() if cards}


def uid_of(apiserver: ApiServerDouble, name: str, namespace: str = "default") -> str:
    pod = apiserver.get_pod(namespace, name)
    assert pod is not None, name
    uid: str = pod["metadata"]["uid"]
    return uid


def pod_requests_since(apiserver: ApiServerDouble, start: int) -> list[str]:
    """ "list" or "watch" for each GET of all pods after the first `start` logged requests."""
    kinds = []
    for method, target in apiserver.request_targets[start:]:
        split = urlsplit(target)
        if method == "GET" and split.path == PODS:
            watch = parse_qs(split.query).get("watch", ["false"])[-1].lower()
            kinds.append("watch" if watch in ("true", "1") else "list")
    return kinds


def wait_for_pod_request(apiserver: ApiServerDouble, start: int, kind: str = "") -> None:
    """Until gas has read pods again since request `start` (with a list or watch if given)."""

    def seen() -> bool:
        kinds = pod_requests_since(apiserver, start)
        return kind in kinds if kind else bool(kinds)

    wait_for(seen, timeout=15, what=f"gas to read pods again {kind}")


def node_name_of(apiserver: ApiServerDouble, name: str) -> str | None:
    pod = apiserver.get_pod("default", name)
    assert pod is not None, name
    node: str | None = pod["spec"].get("nodeName")
    return node


def readyz(gas: GasProcess) -> int:
    status: int = gas.session.get(gas.url + "/readyz", timeout=5).status_code
    return status


# ------------------------------------------------------------------ 1. restart accounting


def test_restart_rebuilds_exact_usage_before_reporting_ready(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    # alpha: 4 cards, 2 i915 and 8Gi per card.
    apiserver.add_node(gpu_node("alpha", "0.1.2.3", i915="8", memory_max="32Gi"))
    apiserver.add_node(gpu_node("beta", "0.1", i915="2", memory_max="16Gi"))
    apiserver.add_node(gpu_node("gamma", "0.1", i915="2", memory_max="16Gi"))
    add = apiserver.add_pod
    add(bound_pod("running", "alpha", "card0", container(i915="1", memory_max="2Gi")))
    add(
        bound_pod(
            "bound-pending",
            "alpha",
            "card1",
            container(i915="1", memory_max="1Gi"),
            phase="Pending",
        )
    )
    add(bound_pod("terminating", "alpha", "card2", container(i915="1", memory_max="3Gi")))
    apiserver.mark_pod_terminating("default", "terminating")
    for phase in ("Succeeded", "Failed"):
        add(
            bound_pod(
                phase.lower(), "alpha", "card3", container(i915="1", memory_max="4Gi"), phase=phase
            )
        )
    add(gpu_pod("no-annotation", container(i915="1"), node="alpha", phase="Running"))
    add(gpu_pod("not-bound", annotations={ANNOTATION_CARDS: "card3"}))
    add(
        bound_pod(
            "multi",
            "alpha",
            "card0|card1",
            container("a", i915="1", memory_max="1Gi"),
            container("b", i915="1", memory_max="2Gi"),
            namespace="ml",
        )
    )
    add(
        bound_pod(
            "two-gpu", "alpha", "card2,card3", container(i915="2", memory_max="4Gi"), namespace="ml"
        )
    )
    # Unreadable annotations fail closed: no card named -> the whole node; else those cards.
    add(bound_pod("broken-node", "beta", "gpu7x", container(i915="1")))
    add(bound_pod("broken-card", "gamma", "card1,gpu7x", container(i915="2")))

    gas = launch(start_gas, kubeconfig, tls_files)
    snapshot = ledger_of(gas)  # right after the first 200 from /readyz: no waiting

    assert snapshot["usage"] == {
        "alpha": {
            "card0": {I915: 2, MEM: 3 * GI},  # running + multi/a
            "card1": {I915: 2, MEM: 3 * GI},  # bound-pending + multi/b
            "card2": {I915: 2, MEM: 5 * GI},  # terminating + half of two-gpu
            "card3": {I915: 1, MEM: 2 * GI},  # half of two-gpu; succeeded/failed gone
        }
    }
    pods = {p["name"]: p for p in snapshot["pods"].values()}
    assert set(pods) == {
        "running",
        "bound-pending",
        "terminating",
        "multi",
        "two-gpu",
        "broken-node",
        "broken-card",
    }
    assert {p["state"] for p in pods.values()} == {"bound"}
    assert pods["multi"]["cards"] == [["card0"], ["card1"]]
    assert pods["multi"]["namespace"] == "ml"
    assert pods["two-gpu"]["cards"] == [["card2", "card3"]]
    assert pods["broken-node"]["blocks_node"] is True
    assert pods["broken-card"]["blocked_cards"] == ["card1"]
    assert pods["broken-card"]["blocks_node"] is False

    # Every alpha card is held by the pods found at start: a pod that fits any idle card
    # is refused; a small one still fits the only card with room (card3, which the
    # terminal pods would have filled had they been counted).
    big = probe("big", container(i915="1", memory_max="7Gi"))
    assert "not enough free" in refusal(gas, big, "alpha")
    assert passes(gas, probe("small", container(i915="1", memory_max="1Gi")), "alpha")
    # beta is blocked whole; gamma only on card1.
    assert refusal(gas, probe("b1", container(i915="1")), "beta") == NODE_BLOCKED
    assert passes(gas, probe("g1", container(i915="1")), "gamma")
    assert "unreadable" in refusal(gas, probe("g2", container(i915="2")), "gamma")
    assert_consistent(gas, apiserver)


# ------------------------------------------------------------------ 2. restart after binds


def test_restart_after_binds_rebuilds_the_same_ledger(
    apiserver: ApiServerDouble,
    start_gas: StartGas,
    kubeconfig: str,
    tls_files: TLSFiles,
    emulators: Callable[[GasProcess], SchedulerEmulator],
) -> None:
    apiserver.add_node(gpu_node("n1", "0.1.2.3", i915="8", memory_max="32Gi"))
    apiserver.add_node(gpu_node("n2", "0.1", i915="2", memory_max="16Gi"))
    pods = {
        "s1": [container(i915="1", memory_max="2Gi")],
        "s2": [container(i915="1", memory_max="6Gi")],
        "d1": [container(i915="2", memory_max="4Gi")],
        "m1": [container("a", i915="1"), container("b", i915="1", memory_max="1Gi")],
        "s3": [container(i915="1", memory_max="3Gi")],
    }
    for name, containers in pods.items():
        apiserver.add_pod(gpu_pod(name, *containers))
    first = launch(start_gas, kubeconfig, tls_files)
    wait_for_nodes(first, "n1", "n2")
    scheduler = emulators(first)
    futures = [scheduler.schedule("default", name) for name in pods]
    outcomes = [f.result() for f in futures]
    assert [(o.pod, o.bound, o.error) for o in outcomes] == [
        (f"default/{name}", True, "") for name in pods
    ]
    uids = {uid_of(apiserver, name) for name in pods}
    wait_for(
        lambda: (
            {u: p["state"] for u, p in ledger_of(first)["pods"].items()}
            == dict.fromkeys(uids, "bound")
        ),
        what="every bind confirmed by the watch",
    )
    before = ledger_of(first)
    assert before["usage"] == cluster_usage(apiserver)
    assert before["usage"]  # something is actually held

    first.kill()  # SIGKILL: no goodbye, the ledger dies with the process
    second = launch(start_gas, kubeconfig, tls_files)
    after = ledger_of(second)
    assert after["usage"] == before["usage"]
    assert after["pods"] == before["pods"]
    assert_consistent(second, apiserver)

    # A pod that completes after the restart frees its cards in the new gas.
    s2 = uid_of(apiserver, "s2")
    apiserver.set_pod_phase("default", "s2", "Succeeded")
    wait_for(lambda: s2 not in ledger_of(second)["pods"], what="s2 released")
    usage = ledger_of(second)["usage"]
    assert usage != before["usage"]
    assert usage == cluster_usage(apiserver)
    assert_consistent(second, apiserver)


# ------------------------------------------------------------------ 3. watch


def test_watch_keeps_the_ledger_current(apiserver: ApiServerDouble, gas: GasProcess) -> None:
    # w1: 2 cards, one i915 per card.
    apiserver.add_node(gpu_node("w1", "0.1", i915="2", memory_max="16Gi"))
    wait_for_nodes(gas, "w1")
    one = probe("one", container(i915="1"))
    assert passes(gas, one, "w1")

    def held() -> dict[str, Any]:
        usage: dict[str, Any] = ledger_of(gas)["usage"].get("w1", {})
        return usage

    apiserver.add_pod(bound_pod("a", "w1", "card0"))
    apiserver.add_pod(bound_pod("b", "w1", "card1"))
    wait_for(lambda: set(held()) == {"card0", "card1"}, what="a and b held")
    assert "not enough free" in refusal(gas, one, "w1")

    apiserver.delete_pod("default", "a")
    wait_for(lambda: set(held()) == {"card1"}, what="deleted pod released")
    assert passes(gas, one, "w1")

    for phase in ("Succeeded", "Failed"):
        name = f"ends-{phase.lower()}"
        apiserver.add_pod(bound_pod(name, "w1", "card0"))
        wait_for(lambda: set(held()) == {"card0", "card1"}, what=f"{name} held")
        apiserver.set_pod_phase("default", name, phase)
        wait_for(lambda: set(held()) == {"card1"}, what=f"{phase} pod released")

    apiserver.add_pod(bound_pod("leaving", "w1", "card0"))
    wait_for(lambda: set(held()) == {"card0", "card1"}, what="leaving held")
    apiserver.mark_pod_terminating("default", "leaving")
    # A later event on b: once it shows, the terminating event before it has been applied.
    apiserver.set_pod_phase("default", "b", "Succeeded")
    wait_for(lambda: set(held()) == {"card0"}, what="b released")
    leaving = ledger_of(gas)["pods"][uid_of(apiserver, "leaving")]
    assert (leaving["state"], leaving["cards"]) == ("bound", [["card0"]])
    assert held() == {"card0": {I915: 1}}

    # A node that appears later can be filtered onto.
    one_big = probe("one-big", container(i915="1", memory_max="20Gi"))
    assert refusal(gas, one, "w2") == UNKNOWN_NODE
    apiserver.add_node(gpu_node("w2", "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "w2")
    assert passes(gas, one, "w2")
    assert "per card than a card has" in refusal(gas, one_big, "w2")

    # Its allocatable changes: the capacity follows.
    apiserver.put_node(gpu_node("w2", "0", i915="1", memory_max="32Gi"))
    wait_for(
        lambda: ledger_of(gas)["nodes"]["w2"]["capacity"] == {I915: 1, MEM: 32 * GI},
        what="w2 capacity updated",
    )
    assert passes(gas, one_big, "w2")

    # It goes away: gas says so.
    apiserver.delete_node("w2")
    wait_for(lambda: "w2" not in ledger_of(gas)["nodes"], what="w2 removed")
    assert refusal(gas, one, "w2") == UNKNOWN_NODE
    assert_consistent(gas, apiserver)


# ------------------------------------------------------------------ 4. 410 Gone


def test_watch_resumed_from_a_compacted_version_relists(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    apiserver.add_node(gpu_node("n", "0.1.2.3", i915="4", memory_max="32Gi"))
    apiserver.add_pod(bound_pod("keep", "n", "card0"))
    apiserver.add_pod(bound_pod("gone", "n", "card1"))
    # gas's first pod watch is cut after its first event.
    apiserver.faults.add("GET", f"^{PODS}$", ("drop_watch", None))
    gas = launch(start_gas, kubeconfig, tls_files)
    assert set(ledger_of(gas)["usage"]["n"]) == {"card0", "card1"}

    # gas's next two requests for pods are each held back for a second. Whether gas
    # resumes the broken watch from its last version or relists first, its next watch
    # request names a version that is gone by the time the double answers it.
    apiserver.faults.add("GET", f"^{PODS}$", ("delay", 1.0), times=2)
    start = len(apiserver.request_targets)
    apiserver.add_pod(gpu_pod("trigger"))  # the first event: the watch is cut
    wait_for_pod_request(apiserver, start, "watch")
    # That watch is waiting in the double: change the cluster, then compact.
    apiserver.delete_pod("default", "gone")
    apiserver.add_pod(bound_pod("fresh", "n", "card2"))
    apiserver.compact()

    fresh_uid = uid_of(apiserver, "fresh")

    def converged() -> bool:
        names = {p["name"] for p in ledger_of(gas)["pods"].values()}
        return names == {"keep", "fresh"}

    wait_for(converged, timeout=15, what="gas to relist after 410 Gone")
    assert set(ledger_of(gas)["usage"]["n"]) == {"card0", "card2"}
    assert ledger_of(gas)["pods"][fresh_uid]["state"] == "bound"
    # The watch from the new list follows the relist at once, but on a loaded machine not
    # necessarily before the ledger shows the relist's result.
    kinds = wait_for(
        lambda: (k := pod_requests_since(apiserver, start))[-1] == "watch" and k,
        what="a watch after the relist",
    )
    # ... a watch answered 410, the relist it forced, and a watch from the new list.
    last_list = len(kinds) - 1 - kinds[::-1].index("list")
    assert kinds[last_list - 1 :] == ["watch", "list", "watch"], kinds
    assert pod_requests_since(apiserver, 0).count("list") >= 2
    assert "410 Gone" in gas.log()
    assert readyz(gas) == 200
    assert_consistent(gas, apiserver)


# ------------------------------------------------------------------ 5. API server outage


def test_api_server_down_then_back(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    apiserver.add_node(gpu_node("o", "0.1.2.3", i915="4", memory_max="32Gi"))
    apiserver.add_pod(bound_pod("a", "o", "card0"))
    apiserver.add_pod(bound_pod("b", "o", "card1"))
    # Both first watches are cut after their first event, as when the API server goes down.
    apiserver.faults.add("GET", f"^{PODS}$", ("drop_watch", None))
    apiserver.faults.add("GET", r"^/api/v1/nodes$", ("drop_watch", None))
    gas = launch(start_gas, kubeconfig, tls_files)
    assert set(ledger_of(gas)["usage"]["o"]) == {"card0", "card1"}

    # From now on, every list and watch of pods and nodes fails.
    apiserver.faults.add("GET", r"^/api/v1/(pods|nodes)$", ("status", 500), times=None)
    start = len(apiserver.request_targets)
    apiserver.add_pod(gpu_pod("trigger"))
    node = apiserver.get_node("o")
    assert node is not None
    node["metadata"]["labels"]["example.com/touched"] = "yes"
    apiserver.put_node(node)
    gas.wait_status("/readyz", 503, timeout=5)
    unsynced = gas.post("/scheduler/filter", {"Pod": probe("p"), "NodeNames": ["o"]})
    assert unsynced.status_code == 503
    assert gas.session.get(gas.url + "/healthz", timeout=5).status_code == 200
    # Changes gas cannot see while the API server is down.
    apiserver.delete_pod("default", "a")
    apiserver.set_pod_phase("default", "b", "Succeeded")
    apiserver.add_pod(bound_pod("c", "o", "card2"))
    apiserver.add_node(gpu_node("o2", "0", i915="1", memory_max="8Gi"))
    # gas keeps retrying, and stays unready while every attempt fails.
    wait_for(
        lambda: len(pod_requests_since(apiserver, start)) >= 2,
        what="gas to retry reading pods",
    )
    assert readyz(gas) == 503

    apiserver.faults.clear()
    back = time.monotonic()
    gas.wait_status("/readyz", 200, timeout=10)
    assert time.monotonic() - back < 5  # the backoff stays short after a short outage
    # Relisted, or resumed from its last version (the missed events are replayed).
    wait_for(
        lambda: ledger_of(gas)["usage"] == {"o": {"card2": {I915: 1}}},
        what="the changes made during the outage",
    )
    snapshot = ledger_of(gas)
    assert {p["name"] for p in snapshot["pods"].values()} == {"c"}
    assert set(snapshot["nodes"]) == {"o", "o2"}
    assert passes(gas, probe("p", container(i915="1")), "o")
    assert passes(gas, probe("p", container(i915="1")), "o2")
    assert_consistent(gas, apiserver)


# ------------------------------------------------------------------ 6. bind outcome unknown


def test_bind_written_but_answered_500_keeps_the_cards(
    apiserver: ApiServerDouble, gas: GasProcess
) -> None:
    apiserver.add_node(gpu_node("solo", "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "solo")
    first = apiserver.add_pod(gpu_pod("first"))
    second = apiserver.add_pod(gpu_pod("second"))
    uid = first["metadata"]["uid"]
    assert passes(gas, first, "solo")

    apiserver.faults.add("POST", r"/pods/first/binding$", ("after_write_status", 500))
    error = gas.bind(first, "solo")
    assert "outcome unknown" in error
    # The Binding did land.
    stored = apiserver.get_pod("default", "first")
    assert stored is not None and stored["spec"]["nodeName"] == "solo"
    assert stored["metadata"]["annotations"][ANNOTATION_CARDS] == "card0"
    # gas holds the card at once, whether or not its watch has caught up yet ...
    entry = ledger_of(gas)["pods"][uid]
    assert entry["state"] in ("pending", "bound")
    assert entry["cards"] == [["card0"]]
    # ... so a second pod racing for it is refused, by filter and by bind.
    assert "not enough free" in refusal(gas, second, "solo")
    assert "not enough free" in gas.bind(second, "solo")
    assert apiserver.count_requests("POST", r"/pods/second/binding$") == 0
    wait_for(lambda: ledger_of(gas)["pods"][uid]["state"] == "bound", what="first bound")
    assert ledger_of(gas)["usage"] == {"solo": {"card0": {I915: 1}}}
    assert "not enough free" in refusal(gas, second, "solo")

    apiserver.delete_pod("default", "first")
    wait_for(lambda: uid not in ledger_of(gas)["pods"], what="first released")
    assert passes(gas, second, "solo")
    assert gas.bind(second, "solo") == ""
    assert_consistent(gas, apiserver)


def test_bind_refused_or_failed_without_a_write(
    apiserver: ApiServerDouble, gas: GasProcess
) -> None:
    apiserver.add_node(gpu_node("solo", "0", i915="1", memory_max="8Gi"))
    apiserver.add_node(gpu_node("spare", "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "solo", "spare")
    refused = apiserver.add_pod(gpu_pod("refused"))
    assert passes(gas, refused, "solo")

    # A definitive refusal (nothing written) gives the card back at once.
    apiserver.faults.add("POST", r"/pods/refused/binding$", ("status", 409))
    error = gas.bind(refused, "solo")
    assert "refused the binding" in error
    assert ledger_of(gas)["pods"] == {}
    assert ledger_of(gas)["usage"] == {}
    assert node_name_of(apiserver, "refused") is None
    assert passes(gas, refused, "solo")

    # A 500 without a write is an unknown outcome: the card stays held as pending (it may
    # have landed), even after later cluster events, and nobody else gets it.
    other = apiserver.add_pod(gpu_pod("other"))
    uncertain = apiserver.add_pod(gpu_pod("uncertain"))
    apiserver.faults.add("POST", r"/pods/uncertain/binding$", ("status", 500))
    assert "outcome unknown" in gas.bind(uncertain, "solo")
    assert node_name_of(apiserver, "uncertain") is None
    apiserver.add_pod(bound_pod("marker", "spare", "card0"))
    wait_for(
        lambda: "marker" in {p["name"] for p in ledger_of(gas)["pods"].values()},
        what="a later pod event",
    )
    entry = ledger_of(gas)["pods"][uncertain["metadata"]["uid"]]
    assert (entry["state"], entry["node"], entry["cards"]) == ("pending", "solo", [["card0"]])
    assert "not enough free" in refusal(gas, other, "solo")

    # Deleting the uncertain pod frees the card.
    apiserver.delete_pod("default", "uncertain")
    wait_for(lambda: "solo" not in ledger_of(gas)["usage"], what="uncertain released")
    assert gas.bind(other, "solo") == ""
    assert_consistent(gas, apiserver)


def test_retry_after_an_unwritten_500_binding_can_use_its_own_card(
    apiserver: ApiServerDouble,
    gas: GasProcess,
    emulators: Callable[[GasProcess], SchedulerEmulator],
) -> None:
    """Regression: the pod's own uncertain earlier bind used to count against its retry,
    so on a full node the pod was refused its own card until a relist (never, with a
    healthy watch)."""
    apiserver.add_node(gpu_node("solo", "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "solo")
    apiserver.add_pod(gpu_pod("retry"))
    scheduler = emulators(gas)
    apiserver.faults.add("POST", r"/pods/retry/binding$", ("status", 500))
    outcome = scheduler.schedule_now("default", "retry")
    assert "outcome unknown" in outcome.error
    # The API server shows the pod unbound (and can only ever bind it once): the
    # scheduler's next attempt should be able to place it on the card gas holds for it.
    outcomes = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        outcome = scheduler.schedule_now("default", "retry")
        outcomes.append(outcome.error or "bound")
        if outcome.bound:
            break
        time.sleep(0.2)
    assert outcome.bound, outcomes[-1:]
    uid = uid_of(apiserver, "retry")
    wait_for(lambda: ledger_of(gas)["pods"][uid]["state"] == "bound", what="retry bound")
    assert ledger_of(gas)["usage"] == {"solo": {"card0": {I915: 1}}}  # held once
    assert_consistent(gas, apiserver)


def metric_value(gas: GasProcess, sample: str) -> float:
    """The value of one exposition line (`name{labels}`), 0 when absent."""
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def test_uncertain_binds_are_settled_after_the_grace(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    """Regression (seen in the fault-injecting workload): a bind with an unknown outcome
    held its cards for good when the pod was deleted before gas bound it, or when
    kube-scheduler never retried it. Once the grace has passed, gas reads the pod and
    releases the cards of pods not bound by it; a bind whose Binding landed keeps them."""
    gas = start_gas(["--kubeConfig", kubeconfig, "--pendingGrace", "2s"], tls=tls_files)
    gas.wait_ready()
    for name in ("solo", "duo", "trio", "quad"):
        apiserver.add_node(gpu_node(name, "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "solo", "duo", "trio", "quad")

    # A pod deleted between its filter and its bind: the Binding's answer is lost.
    ghost = apiserver.add_pod(gpu_pod("ghost"))
    assert passes(gas, ghost, "solo")
    apiserver.delete_pod("default", "ghost")
    apiserver.add_pod(bound_pod("marker", "trio", "card0"))
    wait_for(
        lambda: "marker" in {p["name"] for p in ledger_of(gas)["pods"].values()},
        what="the deletion seen by gas",
    )
    apiserver.faults.add("POST", r"/pods/ghost/binding$", ("status", 500))
    # A pod whose Binding was not written and that nobody schedules again.
    stranded = apiserver.add_pod(gpu_pod("stranded"))
    apiserver.faults.add("POST", r"/pods/stranded/binding$", ("status", 500))
    # A pod whose Binding was written though the answer was a 500: it keeps its card.
    landed = apiserver.add_pod(gpu_pod("landed"))
    apiserver.faults.add("POST", r"/pods/landed/binding$", ("after_write_status", 500))
    started = time.monotonic()
    assert "outcome unknown" in gas.bind(ghost, "solo")
    assert "outcome unknown" in gas.bind(stranded, "duo")
    entries = ledger_of(gas)["pods"]
    held = {entries[p["metadata"]["uid"]]["state"] for p in (ghost, stranded)}
    if time.monotonic() - started < 1.5:  # well inside the grace: still held
        assert held == {"pending"}
        assert "not enough free" in refusal(gas, gpu_pod("probe"), "solo")
    other = apiserver.add_pod(gpu_pod("other"))
    assert "outcome unknown" in gas.bind(landed, "quad")

    wait_for(
        lambda: {"solo", "duo"}.isdisjoint(ledger_of(gas)["usage"]),
        timeout=15,
        what="uncertain binds of pods not bound by gas settled",
    )
    assert time.monotonic() - started >= 2.0
    assert metric_value(gas, 'gas_pending_released_total{verdict="deleted"}') == 1
    assert metric_value(gas, 'gas_pending_released_total{verdict="not bound"}') == 1
    assert "released the cards held for default/ghost" in gas.log()
    assert "later the pod is not bound" in gas.log()
    assert node_name_of(apiserver, "landed") == "quad"
    assert ledger_of(gas)["usage"]["quad"] == {"card0": {I915: 1}}
    assert gas.bind(other, "solo") == ""
    assert_consistent(gas, apiserver)


def test_two_uncertain_binds_of_a_pod_both_stay_held_until_the_cluster_shows(
    apiserver: ApiServerDouble, gas: GasProcess
) -> None:
    """Regression (found by the fault-mix workload as a card given twice): a pod's retry
    whose outcome was unknown too dropped the hold of its first attempt, though it was the
    first Binding that had landed; while the watch lagged, the first attempt's card went to
    another pod. Either attempt may have landed, so both stay held."""
    apiserver.add_node(gpu_node("a", "0", i915="1", memory_max="8Gi"))
    apiserver.add_node(gpu_node("b", "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "a", "b")
    pod = apiserver.add_pod(gpu_pod("twice"))
    other = apiserver.add_pod(gpu_pod("other"))
    # gas's pod watch stalls (it stays ready): what the binds write is not seen for a while.
    apiserver.faults.add("GET", f"^{PODS}$", ("delay", 8.0))
    cut_connections(apiserver)
    apiserver.faults.add("POST", r"/pods/twice/binding$", ("after_write_status", 500))
    assert "outcome unknown" in gas.bind(pod, "a")  # written, answered 500
    apiserver.faults.add("POST", r"/pods/twice/binding$", ("status", 503))
    assert "outcome unknown" in gas.bind(pod, "b")  # not written, answered 503
    assert node_name_of(apiserver, "twice") == "a"
    entry = ledger_of(gas)["pods"][uid_of(apiserver, "twice")]
    assert entry["state"] == "pending"
    assert {"a", "b"} <= set(ledger_of(gas)["usage"])
    assert "not enough free" in gas.bind(other, "a")
    assert node_name_of(apiserver, "other") is None
    # Once the watch shows where the pod went, only that card stays held.
    wait_for(
        lambda: ledger_of(gas)["pods"][uid_of(apiserver, "twice")]["state"] == "bound",
        timeout=20,
        what="the landed binding seen",
    )
    assert ledger_of(gas)["usage"] == {"a": {"card0": {I915: 1}}}
    assert gas.bind(other, "b") == ""
    assert_consistent(gas, apiserver)


@pytest.mark.parametrize(
    ("pod", "verdict"),
    [
        (None, "deleted"),
        (gpu_pod("p"), "not bound"),
        (gpu_pod("p", node="n1"), "bound by another binder"),
        (bound_pod("p", "n1", "card0"), None),
        (bound_pod("p", "n1", "card0", phase="Succeeded"), "finished"),
        (gpu_pod("p", phase="Failed"), "finished"),
    ],
)
def test_pending_verdict(pod: dict[str, Any] | None, verdict: str | None) -> None:
    uid = "uid-p"
    if pod is not None:
        pod["metadata"]["uid"] = uid
    assert pending_verdict(pod, uid) == verdict
    if pod is not None:
        # A namesake with another UID: the pod gas tried to bind is gone.
        assert pending_verdict(pod, uid + "-old") == "deleted"


# ------------------------------------------------------------------ 7. no double count


def test_bind_then_watch_counts_each_pod_once(
    apiserver: ApiServerDouble,
    gas: GasProcess,
    emulators: Callable[[GasProcess], SchedulerEmulator],
) -> None:
    apiserver.add_node(gpu_node("d", "0.1.2.3", i915="8", memory_max="32Gi"))
    wait_for_nodes(gas, "d")
    scheduler = emulators(gas)
    names = ["x1", "x2", "x3", "x4"]
    sizes = ["1Gi", "3Gi", "5Gi", "7Gi"]
    for name, size in zip(names, sizes, strict=True):
        apiserver.add_pod(gpu_pod(name, container(i915="1", memory_max=size)))
    for name in names:
        outcome = scheduler.schedule_now("default", name)
        assert (outcome.bound, outcome.error) == (True, "")
        # The Binding is in the cluster; the watch may or may not have shown it yet.
        # Either way the pod is counted exactly once.
        assert ledger_of(gas)["usage"] == cluster_usage(apiserver)

    uids = {uid_of(apiserver, name) for name in names}
    wait_for(
        lambda: (
            {u: p["state"] for u, p in ledger_of(gas)["pods"].items()}
            == dict.fromkeys(uids, "bound")
        ),
        what="all binds confirmed by the watch",
    )
    # More MODIFIED events for the bound pods: they change nothing.
    for name in names:
        apiserver.set_pod_phase("default", name, "Running")
        apiserver.patch_pod("default", name, {"metadata": {"labels": {"seen": "twice"}}})
    apiserver.add_pod(bound_pod("marker", "d", "card3", container(i915="1")))
    marker = uid_of(apiserver, "marker")
    wait_for(lambda: marker in ledger_of(gas)["pods"], what="events up to the marker")
    snapshot = ledger_of(gas)
    assert set(snapshot["pods"]) == uids | {marker}
    assert snapshot["usage"] == cluster_usage(apiserver)
    total_mem = sum(r.get(MEM, 0) for r in snapshot["usage"]["d"].values())
    total_i915 = sum(r.get(I915, 0) for r in snapshot["usage"]["d"].values())
    assert (total_i915, total_mem) == (5, 16 * GI)
    assert_consistent(gas, apiserver)


# ------------------------------------------------------------------ reconnect delay


def test_isolated_watch_drops_do_not_escalate_the_backoff(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    """Regression: the retry delay used to be reset only when a watch ended cleanly, so
    every dropped watch doubled the wait before the next attempt (up to 30 s) even when
    each reconnect in between had succeeded."""
    apiserver.add_node(gpu_node("n", "0", i915="1"))
    # Each of gas's first five pod watches is cut after its first event; every list and
    # every reconnect in between succeeds at once.
    apiserver.faults.add("GET", f"^{PODS}$", ("drop_watch", None), times=5)
    gas = launch(start_gas, kubeconfig, tls_files)
    gaps = []
    for index in range(4):
        start = len(apiserver.request_targets)
        cut = time.monotonic()
        apiserver.add_pod(gpu_pod(f"trigger-{index}"))
        wait_for_pod_request(apiserver, start)
        gaps.append(round(time.monotonic() - cut, 2))
        wait_for_pod_request(apiserver, start, "watch")
        gas.wait_ready(timeout=10)
    # Each drop follows a successful resync, so each should be retried after the base
    # delay (0.2 s) at most, not after 0.2, 0.4, 0.8, 1.6 s ...
    assert max(gaps) < 1.0, gaps
