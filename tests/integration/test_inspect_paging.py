"""`gas inspect` reads the cluster in pages (`limit`/`continue`) through the same paging as
gas's reflector (gas/kubeapi/paging.py): a list whose continue token expires mid-way is read
again from the start, in one request after two expiries, and the report is the one a single
consistent list gives. Against the API-server double, with the real `kubernetes` client."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gas.cli import main
from gas.kubeapi.paging import PAGE_SIZE
from tests.support.apiserver import ApiServerDouble
from tests.support.objects import bound_pod, container, gpu_node
from tests.support.polling import wait_for

PODS = "/api/v1/pods"
MANY = 2 * PAGE_SIZE + 100
"""Pods in three pages."""


def populate(apiserver: ApiServerDouble) -> None:
    for index in range(20):
        apiserver.add_node(gpu_node(f"n{index:02d}", "0.1.2.3", i915="400", memory_max="400Gi"))
    gpu = container(i915="1", memory_max="1Gi")
    for index in range(MANY):
        pod = bound_pod(f"p{index:04d}", f"n{index % 20:02d}", f"card{index % 4}", gpu, ts="1")
        apiserver.add_pod(pod)


def inspect_json(kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    """`gas inspect -o json`: (exit status, the report)."""
    capsys.readouterr()
    status = main(["inspect", "--kubeConfig", kubeconfig, "-o", "json"])
    captured = capsys.readouterr()
    assert captured.err == ""
    return status, json.loads(captured.out)


def pod_lists(apiserver: ApiServerDouble) -> list[dict[str, str]]:
    """The query of every list of all pods."""
    found = []
    for method, target in apiserver.request_targets:
        split = urlsplit(target)
        if method == "GET" and split.path == PODS:
            found.append({key: values[-1] for key, values in parse_qs(split.query).items()})
    return found


def test_a_list_expired_mid_way_is_read_again_and_reported_as_one_list(
    apiserver: ApiServerDouble, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(apiserver)
    expected = inspect_json(kubeconfig, capsys)
    assert expected[1]["totals"]["pods"] == MANY
    apiserver.clear_requests()
    # The second page is answered 410 Expired, once.
    apiserver.faults.add("GET", f"^{PODS}$", ("status", 410), query_regex="continue=")

    assert inspect_json(kubeconfig, capsys) == expected
    lists = pod_lists(apiserver)
    # Page 1, a 410 for page 2, then pages 1 to 3.
    assert [query.get("limit") for query in lists] == [str(PAGE_SIZE)] * 5
    assert ["continue" in query for query in lists] == [False, True, False, True, True]


def test_a_list_that_keeps_expiring_is_read_in_one_request(
    apiserver: ApiServerDouble, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(apiserver)
    expected = inspect_json(kubeconfig, capsys)
    apiserver.clear_requests()
    # Every continue answered 410: paging alone would never finish.
    apiserver.faults.add("GET", f"^{PODS}$", ("status", 410), query_regex="continue=", times=None)

    assert inspect_json(kubeconfig, capsys) == expected
    # Page 1, a 410; page 1, a 410; then the whole list.
    assert [query.get("limit") for query in pod_lists(apiserver)] == [str(PAGE_SIZE)] * 4 + [None]


def test_a_list_whose_snapshot_is_compacted_mid_way_reports_the_cluster_after(
    apiserver: ApiServerDouble, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(apiserver)
    held = apiserver.faults.add("GET", f"^{PODS}$", ("hold", None), query_regex="continue=")
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(inspect_json, kubeconfig, capsys)
        wait_for(lambda: held.hits == 1, what="gas inspect to ask for the second page")
        # One pod gone from the page already read, one added beyond it; then the snapshot
        # the pages are read at is compacted away, as etcd would, so the held page is 410.
        apiserver.delete_pod("default", "p0001")
        apiserver.add_pod(bound_pod("p9999", "n00", "card3", container(i915="1"), ts="1"))
        apiserver.compact()
        held.release()
        status, report = running.result(timeout=60)

    # Page 1, the held page 2 answered 410, then pages 1 to 3 of the new state.
    pages = ["continue" in query for query in pod_lists(apiserver)]
    assert pages == [False, True, False, True, True]
    # Read on from the later state, the list would hold p0001 and p9999 both.
    assert report["totals"]["pods"] == MANY
    assert (status, report) == inspect_json(kubeconfig, capsys)
