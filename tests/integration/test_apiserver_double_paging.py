"""Paginated lists of the API-server double (``limit``/``continue``), as the real
kube-apiserver answers them, through the real ``kubernetes`` client over HTTP."""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServerDouble
from tests.support.polling import wait_for

CoreApi = Any  # the client accepts plain dicts at runtime: see test_apiserver_double.py

EXPIRED = "The provided continue parameter is too old to display a consistent list result."


@pytest.fixture
def double(apiserver: ApiServerDouble) -> ApiServerDouble:
    return apiserver


@pytest.fixture
def api(core_v1: client.CoreV1Api) -> client.CoreV1Api:
    return core_v1


def pod(name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def list_raw(func: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One list request's JSON as the API server wrote it."""
    response = func(*args, _preload_content=False, **kwargs)
    body: dict[str, Any] = json.loads(response.data)
    return body


def pages(
    func: Any, *args: Any, limit: int, token: str | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    """Every page of a list (from `token` if given), following the continue tokens."""
    found = []
    while True:
        page = list_raw(func, *args, limit=limit, _continue=token, **kwargs)
        found.append(page)
        token = page["metadata"].get("continue")
        if not token:
            return found


def add_three_pods_each(double: ApiServerDouble, namespaces: tuple[str, ...]) -> None:
    """Pods p0, p1 and p2 in each namespace, added in this order."""
    for namespace in namespaces:
        for index in range(3):
            double.add_pod(pod(f"p{index}", namespace))


def names(page: dict[str, Any]) -> list[str]:
    return [f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in page["items"]]


def status_of(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body or "")
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert body["code"] == exc.status
    return body


def test_pages_come_in_storage_key_order_with_continue_and_remaining_count(
    double: ApiServerDouble, api: CoreApi
) -> None:
    add_three_pods_each(double, ("b", "a", "a-b"))
    whole = list_raw(api.list_pod_for_all_namespaces)
    found = pages(api.list_pod_for_all_namespaces, limit=4)

    # etcd's order: the key "a-b/p0" sorts before "a/p0" ("-" < "/").
    assert [names(p) for p in found] == [
        ["a-b/p0", "a-b/p1", "a-b/p2", "a/p0"],
        ["a/p1", "a/p2", "b/p0", "b/p1"],
        ["b/p2"],
    ]
    assert [p["metadata"].get("remainingItemCount") for p in found] == [5, 1, None]
    assert "continue" not in found[-1]["metadata"]
    assert {p["metadata"]["resourceVersion"] for p in found} == {
        whole["metadata"]["resourceVersion"]
    }
    assert [i for p in found for i in p["items"]] == whole["items"]
    # The real server's token: unpadded URL-safe base64 of the key after the last item.
    token = found[0]["metadata"]["continue"]
    assert "=" not in token
    decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert decoded == {
        "v": "meta.k8s.io/v1",
        "rv": int(whole["metadata"]["resourceVersion"]),
        "start": "a/p0\x00",
    }


def test_a_list_that_fits_one_page_has_no_continue(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_node({"metadata": {"name": "n2"}})
    double.add_node({"metadata": {"name": "n1"}})
    page = list_raw(api.list_node, limit=2)
    assert names(page) == ["/n1", "/n2"]
    assert set(page["metadata"]) == {"resourceVersion"}
    # The client's models read the same fields.
    typed = api.list_node(limit=1)
    assert typed.metadata.remaining_item_count == 1
    rest = api.list_node(limit=1, _continue=typed.metadata._continue)
    assert [n.metadata.name for n in rest.items] == ["n2"] and rest.metadata._continue is None


def test_later_pages_show_the_first_pages_snapshot(double: ApiServerDouble, api: CoreApi) -> None:
    for name in ("p1", "p2", "p3", "p4"):
        double.add_pod(pod(name))
    first = list_raw(api.list_pod_for_all_namespaces, limit=2)
    snapshot = first["metadata"]["resourceVersion"]
    double.patch_pod("default", "p3", {"metadata": {"labels": {"changed": "yes"}}})
    double.delete_pod("default", "p4")
    double.add_pod(pod("p5"))
    double.delete_pod("default", "p1")  # already listed: no effect on the later pages

    rest = list_raw(
        api.list_pod_for_all_namespaces, limit=2, _continue=first["metadata"]["continue"]
    )
    assert names(rest) == ["default/p3", "default/p4"]
    assert rest["metadata"]["resourceVersion"] == snapshot
    assert rest["items"][0]["metadata"]["labels"] == {}
    assert "continue" not in rest["metadata"]
    # A watch from the snapshot then shows every change since, in order.
    watch = api.list_pod_for_all_namespaces(
        watch=True, resource_version=snapshot, timeout_seconds=1, _preload_content=False
    )
    events = [json.loads(line) for line in watch.read().splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "p3"),
        ("DELETED", "p4"),
        ("ADDED", "p5"),
        ("DELETED", "p1"),
    ]


def test_a_namespaced_list_pages_within_its_namespace(
    double: ApiServerDouble, api: CoreApi
) -> None:
    add_three_pods_each(double, ("a", "a-b", "b"))
    found = pages(api.list_namespaced_pod, "a", limit=2)
    assert [names(p) for p in found] == [["a/p0", "a/p1"], ["a/p2"]]
    assert found[0]["metadata"]["remainingItemCount"] == 1
    token = found[0]["metadata"]["continue"]
    start = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))["start"]
    assert start == "p1\x00"  # relative to the namespace's key prefix


def test_a_selected_list_pages_without_a_remaining_count(
    double: ApiServerDouble, api: CoreApi
) -> None:
    for index in range(5):
        double.add_pod(pod(f"p{index}", tier="gpu" if index % 2 == 0 else "cpu"))
    found = pages(api.list_pod_for_all_namespaces, limit=2, label_selector="tier=gpu")
    assert [names(p) for p in found] == [["default/p0", "default/p2"], ["default/p4"]]
    # The server cannot count what a selector would keep: no remainingItemCount.
    assert "remainingItemCount" not in found[0]["metadata"]
    assert "continue" in found[0]["metadata"]


def test_resource_version_0_is_served_whole(double: ApiServerDouble, api: CoreApi) -> None:
    for index in range(3):
        double.add_pod(pod(f"p{index}"))
    # From the watch cache, which ignores the limit.
    page = list_raw(api.list_pod_for_all_namespaces, limit=1, resource_version="0")
    assert len(page["items"]) == 3 and "continue" not in page["metadata"]


def test_a_compacted_snapshot_expires_its_continue_token(
    double: ApiServerDouble, api: CoreApi
) -> None:
    for name in ("p1", "p2", "p3"):
        double.add_pod(pod(name))
    first = list_raw(api.list_pod_for_all_namespaces, limit=1)
    double.add_pod(pod("p4"))
    double.compact()
    with pytest.raises(ApiException) as caught:
        api.list_pod_for_all_namespaces(limit=1, _continue=first["metadata"]["continue"])
    status = status_of(caught.value)
    assert caught.value.status == 410
    assert status["reason"] == "Expired"
    assert status["message"].startswith(EXPIRED)
    assert "details" not in status
    # Its token goes on from the latest state, inconsistently: p4 now shows.
    rest = pages(api.list_pod_for_all_namespaces, limit=5, token=status["metadata"]["continue"])
    assert [names(p) for p in rest] == [["default/p2", "default/p3", "default/p4"]]
    assert rest[0]["metadata"]["resourceVersion"] == str(double.resource_version)


def test_a_snapshot_with_no_later_write_is_still_readable_after_compaction(
    double: ApiServerDouble, api: CoreApi
) -> None:
    double.add_pod(pod("p1"))
    double.add_pod(pod("p2"))
    first = list_raw(api.list_pod_for_all_namespaces, limit=1)
    double.compact()  # etcd compacts below the current revision: the snapshot is kept
    rest = list_raw(api.list_pod_for_all_namespaces, _continue=first["metadata"]["continue"])
    assert names(rest) == ["default/p2"]


@pytest.mark.parametrize(
    ("token", "resource_version", "message"),
    [
        ("not*base64", None, "invalid continue token: continue key is not valid"),
        (
            base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v2","rv":3,"start":"a"}').decode(),
            None,
            "invalid continue token",
        ),
        (
            base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":3,"start":"../x"}')
            .decode()
            .rstrip("="),
            None,
            "invalid start key",
        ),
        (
            base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":3,"start":"p"}')
            .decode()
            .rstrip("="),
            "3",
            "specifying resource version is not allowed when using continue",
        ),
    ],
)
def test_unusable_continue_tokens_are_bad_requests(
    api: CoreApi, token: str, resource_version: str | None, message: str
) -> None:
    with pytest.raises(ApiException) as caught:
        api.list_pod_for_all_namespaces(limit=1, _continue=token, resource_version=resource_version)
    assert caught.value.status == 400
    status = status_of(caught.value)
    assert status["reason"] == "BadRequest"
    assert message in status["message"]


def test_fault_rules_match_the_query_and_hold_a_request_until_released(
    double: ApiServerDouble, api: CoreApi
) -> None:
    for name in ("p1", "p2"):
        double.add_pod(pod(name))
    held = double.faults.add("GET", r"^/api/v1/pods$", ("hold", None), query_regex="continue=")
    first = list_raw(api.list_pod_for_all_namespaces, limit=1)  # no continue: not held
    assert held.hits == 0
    answers: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: answers.append(
            list_raw(
                api.list_pod_for_all_namespaces, limit=1, _continue=first["metadata"]["continue"]
            )
        )
    )
    reader.start()
    wait_for(lambda: held.hits == 1, what="the second page to be held")
    double.delete_pod("default", "p2")  # while the client waits
    assert answers == []
    held.release()
    reader.join(timeout=10)
    assert [names(a) for a in answers] == [["default/p2"]]  # the snapshot's
