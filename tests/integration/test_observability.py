"""What an operator sees: Prometheus metrics, Kubernetes Events on pods, decision logs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import wait_for_nodes
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.promtext import metric


def test_metrics_after_traffic(gas: GasProcess, apiserver: ApiServerDouble) -> None:
    apiserver.add_node(gpu_node("m1", "0.1", i915="2", memory_max="16Gi"))
    wait_for_nodes(gas, "m1")
    small = apiserver.add_pod(gpu_pod("small", container(i915="1", memory_max="6Gi")))
    huge = apiserver.add_pod(gpu_pod("huge", container(i915="1", memory_max="9Gi")))
    assert gas.post("/scheduler/filter", {"Pod": small, "NodeNames": ["m1"]}).ok
    assert gas.post("/scheduler/filter", {"Pod": huge, "NodeNames": ["m1", "ghost"]}).ok
    assert gas.post("/scheduler/filter", {"Pod": "x", "NodeNames": []}).status_code == 400
    assert gas.bind(small, "m1") == ""
    response = gas.session.get(gas.url + "/metrics", timeout=5)
    assert response.status_code == 200
    text = response.text
    assert metric(text, "gas_requests_total", verb="filter", outcome="fit") == 1
    assert metric(text, "gas_requests_total", verb="filter", outcome="no_fit") == 1
    assert metric(text, "gas_requests_total", verb="filter", outcome="bad_request") == 1
    assert metric(text, "gas_requests_total", verb="bind", outcome="bound") == 1
    assert metric(text, "gas_request_duration_seconds_count", verb="filter") == 3
    assert (
        metric(
            text,
            "gas_node_rejections_total",
            reason="gpu: container needs more gpu.intel.com/memory.max per card than a card has",
        )
        == 1
    )
    assert metric(text, "gas_node_rejections_total", reason="gpu: node is not known to gas") == 1
    assert (
        metric(
            text, "gas_card_capacity", node="m1", card="card1", resource="gpu.intel.com/memory.max"
        )
        == 8 * 2**30
    )
    assert (
        metric(
            text, "gas_card_allocated", node="m1", card="card0", resource="gpu.intel.com/memory.max"
        )
        == 6 * 2**30
    )
    assert (
        metric(
            text, "gas_card_allocated", node="m1", card="card1", resource="gpu.intel.com/memory.max"
        )
        == 0
    )
    assert metric(text, "gas_ledger_rebuilds_total") == 1
    assert metric(text, "gas_ledger_pods", state="reserved") == 0


def test_events_explain_binds_and_pending_pods(
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    apiserver: ApiServerDouble,
) -> None:
    gas = start_gas(["--kubeConfig", kubeconfig, "--bindEvents"], tls=tls_files)
    gas.wait_ready()
    apiserver.add_node(gpu_node("e1", "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "e1")
    ok = apiserver.add_pod(gpu_pod("ok", container(i915="1", memory_max="4Gi")))
    waits = apiserver.add_pod(gpu_pod("waits", container(i915="1", memory_max="2Gi")))
    assert gas.bind(ok, "e1") == ""
    for _ in range(3):  # kube-scheduler retries a Pending pod; one Event, not three
        reply = gas.post("/scheduler/filter", {"Pod": waits, "NodeNames": ["e1"]}).json()
        assert reply["NodeNames"] == []

    def events_for(name: str) -> list[dict[str, Any]]:
        return [e for e in apiserver.events if e["involvedObject"]["name"] == name]

    wait_for(lambda: events_for("ok") and events_for("waits"), what="events posted")
    (bound,) = events_for("ok")
    assert bound["reason"] == "GPUsAllocated" and bound["type"] == "Normal"
    assert bound["message"] == "gas gave cards card0 on e1"
    assert bound["involvedObject"]["uid"] == ok["metadata"]["uid"]
    (pending,) = events_for("waits")
    assert pending["type"] == "Warning" and pending["reason"] == "NoGPUFit"
    assert "1 x gpu: not enough free gpu.intel.com/i915" in str(pending["message"])


def test_decisions_are_logged_as_json_lines(gas: GasProcess, apiserver: ApiServerDouble) -> None:
    apiserver.add_node(gpu_node("l1", "0.1", i915="2", memory_max="16Gi"))
    wait_for_nodes(gas, "l1")
    pod = apiserver.add_pod(gpu_pod("logged", container(i915="2", memory_max="2Gi")))
    assert gas.bind(pod, "l1") == ""

    def decisions() -> list[dict[str, object]]:
        found = []
        for line in gas.log().splitlines():
            if "gas.decisions" in line:
                found.append(json.loads(line[line.index("{") :]))
        return found

    records = wait_for(decisions, what="decision log line")
    # In gunicorn's line format, as the rest of the process's lines, made by the lean
    # records of gas.serving.logformat (the command's logging is serve's own).
    lines = [line for line in gas.log().splitlines() if "gas.decisions" in line]
    stamp = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[\d+\] "
    assert re.match(stamp + r"\[INFO\] gas\.decisions: \{", lines[-1]), lines[-1]
    assert re.search(stamp + r"\[INFO\] Starting gunicorn", gas.log(), re.MULTILINE)
    assert records[-1] == {
        "decision": "bind",
        "pod": "default/logged",
        "uid": pod["metadata"]["uid"],
        "node": "l1",
        "result": "bound",
        "cards": "card0,card1",
    }


def test_a_bind_is_one_api_write_without_bind_events(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    apiserver.add_node(gpu_node("e1", "0", i915="1", memory_max="8Gi"))
    wait_for_nodes(gas, "e1")
    ok = apiserver.add_pod(gpu_pod("ok", container(i915="1", memory_max="4Gi")))

    def writes() -> list[tuple[str, str]]:
        return [(m, path) for m, path in apiserver.requests if m in ("POST", "PATCH", "PUT")]

    before = len(writes())
    assert gas.bind(ok, "e1") == ""
    # A later Warning Event shows gas's event queue has been flushed past the bind.
    waits = apiserver.add_pod(gpu_pod("waits", container(i915="1", memory_max="8Gi")))
    reply = gas.post("/scheduler/filter", {"Pod": waits, "NodeNames": ["e1"]}).json()
    assert reply["NodeNames"] == []
    wait_for(lambda: apiserver.events, what="the NoGPUFit event")
    assert [e["reason"] for e in apiserver.events] == ["NoGPUFit"]
    assert writes()[before:] == [
        ("POST", "/api/v1/namespaces/default/pods/ok/binding"),
        ("POST", "/api/v1/namespaces/default/events"),
    ]
