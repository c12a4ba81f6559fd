"""Binds racing each other and filters running during binds, through real gunicorn threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import assert_consistent, ledger_of, wait_for_nodes
from tests.support.objects import binding_args, container, gpu_node, gpu_pod
from tests.support.scheduler import SchedulerEmulator

RACERS = 16


def test_many_binds_racing_for_the_last_card_exactly_one_wins(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    apiserver.add_node(gpu_node("last", "0", i915="1", memory_max="8G"))
    wait_for_nodes(gas, "last")
    pods = [apiserver.add_pod(gpu_pod(f"racer-{i}")) for i in range(RACERS)]
    # Every filter passes: filter reserves nothing, as in kube-scheduler's pipeline.
    for pod in pods:
        reply = gas.post("/scheduler/filter", {"Pod": pod, "NodeNames": ["last"]}).json()
        assert reply["NodeNames"] == ["last"]
    barrier = threading.Barrier(RACERS)

    def race(pod: dict[str, Any]) -> str:
        barrier.wait()
        response = gas.post("/scheduler/bind", binding_args(pod, "last"))
        assert response.status_code == 200
        error: str = response.json()["Error"]
        return error

    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        errors = list(pool.map(race, pods))
    winners = [pod for pod, error in zip(pods, errors, strict=True) if error == ""]
    assert len(winners) == 1
    assert all("i915" in error for error in errors if error)
    bound = [p for p in apiserver.list_pods() if p["spec"].get("nodeName")]
    assert [p["metadata"]["uid"] for p in bound] == [winners[0]["metadata"]["uid"]]
    assert apiserver.count_requests("POST", r"/binding$") == 1
    assert ledger_of(gas)["usage"]["last"] == {"card0": {"gpu.intel.com/i915": 1}}
    assert_consistent(gas, apiserver)


def test_async_binds_with_filters_in_between_never_overcommit(
    gas: GasProcess, apiserver: ApiServerDouble, tls_files: TLSFiles
) -> None:
    """kube-scheduler filters the next pod while earlier binds are still in flight."""
    for name, numbers in (("a", "0.1"), ("b", "0.1.2.3")):
        cards = len(numbers.split("."))
        apiserver.add_node(gpu_node(name, numbers, i915=str(2 * cards), memory_max=f"{8 * cards}G"))
    wait_for_nodes(gas, "a", "b")
    # Slow Binding writes keep several binds in flight at once.
    apiserver.faults.add("POST", r"/binding$", ("delay", 0.2), times=None)
    emulator = SchedulerEmulator(
        apiserver,
        gas.url,
        cert=(tls_files.client_cert, tls_files.client_key),
        verify=tls_files.ca,
        bind_workers=8,
        seed=3,
    )
    try:
        futures = []
        for index in range(24):
            apiserver.add_pod(gpu_pod(f"job-{index}", container(i915="1", memory_max="3G")))
            futures.append(emulator.schedule("default", f"job-{index}"))
        outcomes = [future.result(timeout=60) for future in futures]
    finally:
        emulator.close()
        apiserver.faults.clear()
    # 6 cards x 2 slots (i915 2 per card) and 8G each: at most 2 pods of 3G per card.
    bound = [o for o in outcomes if o.bound]
    assert len(bound) == 12
    per_card: dict[tuple[str, str], int] = {}
    for pod in apiserver.list_pods():
        annotation = (pod["metadata"].get("annotations") or {}).get("gas-container-cards")
        if annotation:
            key = (pod["spec"]["nodeName"], annotation)
            per_card[key] = per_card.get(key, 0) + 1
    assert sorted(per_card.values()) == [2] * 6
    assert_consistent(gas, apiserver)


def test_filters_are_answered_while_a_bind_waits_on_the_api_server(
    gas: GasProcess, apiserver: ApiServerDouble
) -> None:
    """No I/O under the ledger lock: a slow Binding write does not stall filters."""
    apiserver.add_node(gpu_node("n", "0.1", i915="4", memory_max="16G"))
    wait_for_nodes(gas, "n")
    slow = apiserver.add_pod(gpu_pod("slow"))
    probe = apiserver.add_pod(gpu_pod("probe"))
    apiserver.faults.add("POST", r"/pods/slow/binding$", ("delay", 2.0))
    finished: dict[str, float] = {}

    def bind_slow() -> None:
        gas.post("/scheduler/bind", binding_args(slow, "n"))
        finished["bind"] = time.monotonic()

    thread = threading.Thread(target=bind_slow)
    thread.start()
    time.sleep(0.3)  # the bind is now waiting on the API server
    reply = gas.post("/scheduler/filter", {"Pod": probe, "NodeNames": ["n"]}).json()
    finished["filter"] = time.monotonic()
    thread.join(timeout=30)
    assert reply["NodeNames"] == ["n"]
    assert finished["filter"] < finished["bind"]
    # The reservation was visible to the filter: card0 held by the in-flight bind.
    assert ledger_of(gas)["pods"][slow["metadata"]["uid"]]["cards"] == [["card0"]]
