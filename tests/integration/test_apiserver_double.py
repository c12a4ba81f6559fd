"""Tests of the API-server double, driven through the real ``kubernetes`` client over HTTP."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tests.support.apiserver import ApiError, ApiServerDouble

NS = "default"
REQUEST_TIMEOUT = 10

# The client's type hints demand model objects, but it accepts plain dicts at runtime (which
# is how these tests, and the extender, build bodies): keep the injected client untyped.
CoreApi = Any


# ---------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture
def double(tmp_path) -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as server:
        server.kubeconfig_path = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


@pytest.fixture
def api(double: ApiServerDouble) -> Iterator[client.CoreV1Api]:
    api_client = config.new_client_from_config(config_file=double.kubeconfig_path)
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()


# Plain pods and nodes: the double's own tests need no GPU resources.
def pod(name: str, **extra: Any) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    for key, value in extra.items():
        manifest.setdefault(key, {}).update(value)
    return manifest


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "status": {"capacity": {"cpu": "4"}}}


def status_of(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body or "")
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["code"] == exc.status
    return body


def binding(name: str, node_name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": NS, **meta},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
    }


def bind(api: CoreApi, name: str, body: Any) -> Any:
    return api.create_namespaced_pod_binding(
        name, NS, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
    )


def raw_watch(
    func: Callable[..., Any], *args: Any, **kwargs: Any
) -> Generator[dict[str, Any], None, None]:
    """Raw JSON events of one watch request (``_preload_content=False``)."""
    resp = func(
        *args, watch=True, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs
    )
    try:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        for line in iter_resp_lines(resp):
            if line:
                yield json.loads(line)
    finally:
        resp.release_conn()


def collect(events: Iterator[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    for event in events:
        got.append(event)
        if len(got) == count:
            break
    close = getattr(events, "close", None)
    if close is not None:
        close()
    return got


def later(delay: float, action: Callable[[], Any]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------
# server basics


def test_kubeconfig_is_loadable_and_points_at_the_double(double: ApiServerDouble) -> None:
    cfg = client.Configuration()
    config.load_kube_config(config_file=double.kubeconfig_path, client_configuration=cfg)
    assert cfg.host == double.url
    assert double.url.startswith("http://127.0.0.1:")
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer dummy-token"


def test_keep_alive_serves_several_requests_on_one_connection(double: ApiServerDouble) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", double.port, timeout=5)
    try:
        for _ in range(3):
            conn.request("GET", "/api/v1/nodes")
            resp = conn.getresponse()
            body = json.loads(resp.read())
            assert resp.status == 200
            assert resp.getheader("Content-Length") is not None
            assert body["kind"] == "NodeList"
    finally:
        conn.close()


def test_unknown_path_is_404_and_wrong_method_is_405(double: ApiServerDouble) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", double.port, timeout=5)
    try:
        conn.request("GET", "/api/v1/widgets")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 404
        assert body["kind"] == "Status"
        assert body["reason"] == "NotFound"
        conn.request("POST", "/api/v1/pods", body=b"{}")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 405
        assert body["reason"] == "MethodNotAllowed"
        assert body["code"] == 405
    finally:
        conn.close()


def test_create_list_and_get_nodes_and_pods(double: ApiServerDouble, api: CoreApi) -> None:
    created = api.create_node(node("n1", zone="a"))
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert api.list_node().items[0].metadata.labels == {"zone": "a"}

    pod_body = pod("p1", status={"phase": "Running"})
    new = api.create_namespaced_pod(NS, pod_body)
    assert new.metadata.namespace == NS
    assert new.status.phase == "Pending"  # the real server ignores status on create
    assert api.read_namespaced_pod("p1", NS).metadata.uid == new.metadata.uid
    assert api.read_node("n1").metadata.name == "n1"
    assert [p.metadata.name for p in api.list_pod_for_all_namespaces().items] == ["p1"]

    raw = json.loads(api.list_namespaced_pod(NS, _preload_content=False).data)
    assert raw["kind"] == "PodList"
    assert raw["apiVersion"] == "v1"
    assert raw["metadata"] == {"resourceVersion": str(double.resource_version)}
    assert "kind" not in raw["items"][0]
    assert raw["items"][0]["metadata"]["resourceVersion"] == new.metadata.resource_version
    assert api.list_namespaced_pod("other").items == []

    generated = api.create_namespaced_pod(NS, {"metadata": {"generateName": "gen-"}})
    assert generated.metadata.name.startswith("gen-")
    assert len(generated.metadata.name) == len("gen-") + 5


def test_missing_objects_and_name_clashes_give_real_status_bodies(
    api: CoreApi,
) -> None:
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod("nope", NS)
    body = status_of(missing.value)
    assert missing.value.status == 404
    assert body["reason"] == "NotFound"
    assert body["message"] == 'pods "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "pods"}

    with pytest.raises(ApiException) as missing_node:
        api.read_node("ghost")
    assert status_of(missing_node.value)["message"] == 'nodes "ghost" not found'

    api.create_namespaced_pod(NS, pod("p1"))
    with pytest.raises(ApiException) as clash:
        api.create_namespaced_pod(NS, pod("p1"))
    body = status_of(clash.value)
    assert clash.value.status == 409
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'pods "p1" already exists'


def test_every_write_bumps_the_global_resource_version(double: ApiServerDouble) -> None:
    start = double.resource_version
    first = double.add_node(node("n1"))
    assert first["metadata"]["resourceVersion"] == str(start + 1)
    added = double.add_pod(pod("p1"))
    assert added["metadata"]["resourceVersion"] == str(start + 2)
    assert added["status"]["phase"] == "Pending"
    assert double.set_pod_phase(NS, "p1", "Running")["metadata"]["resourceVersion"] == str(
        start + 3
    )
    double.set_pod_phase(NS, "p1", "Running")  # no change: no write
    assert double.resource_version == start + 3
    # helpers hand out copies
    copy_ = double.get_pod(NS, "p1")
    assert copy_ is not None
    copy_["metadata"]["labels"] = {"mutated": "yes"}
    stored = double.get_pod(NS, "p1")
    assert stored is not None
    assert "labels" not in stored["metadata"]
    with pytest.raises(ApiError) as exc:
        double.add_pod(pod("p1"))
    assert exc.value.code == 409


# ---------------------------------------------------------------------------------------
# watch


def test_watch_from_list_rv_sees_later_events_in_order(
    double: ApiServerDouble, api: CoreApi
) -> None:
    listed = api.list_namespaced_pod(NS)
    rv = listed.metadata.resource_version
    double.add_pod(pod("p1"))  # before the watch starts: replayed from history
    double.set_pod_phase(NS, "p1", "Running")

    def live() -> None:
        double.add_pod(pod("p2"))
        double.delete_pod(NS, "p1")

    later(0.2, live)
    events = collect(
        raw_watch(api.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=5), 4
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "p1"),
        ("MODIFIED", "p1"),
        ("ADDED", "p2"),
        ("DELETED", "p1"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs)
    assert rvs[0] == int(rv) + 1
    assert rvs[-1] == double.resource_version  # DELETED carries the deletion's own RV
    assert all(e["object"]["kind"] == "Pod" for e in events)
    assert all(e["object"]["apiVersion"] == "v1" for e in events)
    assert events[3]["object"]["status"]["phase"] == "Running"  # last state


def test_watch_without_rv_starts_with_synthetic_added_events(
    double: ApiServerDouble, api: CoreApi
) -> None:
    double.add_node(node("n1"))
    double.add_node(node("n2"))
    later(0.2, lambda: double.add_node(node("n3")))
    w = watch.Watch()
    stream = w.stream(api.list_node, timeout_seconds=5, _request_timeout=REQUEST_TIMEOUT)
    got = collect(stream, 3)
    assert [(e["type"], e["object"].metadata.name) for e in got] == [
        ("ADDED", "n1"),
        ("ADDED", "n2"),
        ("ADDED", "n3"),
    ]
    assert isinstance(got[0]["object"], client.V1Node)
    assert w.resource_version == str(double.resource_version)


def test_watch_from_compacted_rv_gets_410_expired_error_event(
    double: ApiServerDouble, api: CoreApi
) -> None:
    old_rv = api.list_namespaced_pod(NS).metadata.resource_version
    double.add_pod(pod("p1"))
    double.add_pod(pod("p2"))
    floor = double.compact()

    events = list(raw_watch(api.list_namespaced_pod, NS, resource_version=old_rv))
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {old_rv} ({floor})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]
    with pytest.raises(ApiException) as exc:
        list(
            watch.Watch().stream(
                api.list_namespaced_pod, NS, resource_version=old_rv, timeout_seconds=5
            )
        )
    assert exc.value.status == 410
    assert "Expired: too old resource version" in exc.value.reason
    # the compaction point itself is still a valid place to resume from
    later(0.2, lambda: double.add_pod(pod("p3")))
    fresh = collect(
        raw_watch(api.list_namespaced_pod, NS, resource_version=str(floor), timeout_seconds=5), 1
    )
    assert fresh[0]["type"] == "ADDED"
    assert fresh[0]["object"]["metadata"]["name"] == "p3"


def test_watch_from_a_future_rv_is_an_error_event(double: ApiServerDouble, api: CoreApi) -> None:
    future = str(double.resource_version + 100)
    events = list(raw_watch(api.list_node, resource_version=future))
    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 504
    assert events[0]["object"]["reason"] == "Timeout"


def test_timeout_seconds_ends_the_stream_cleanly(double: ApiServerDouble, api: CoreApi) -> None:
    rv = str(double.resource_version)
    started = time.monotonic()
    events = list(raw_watch(api.list_node, resource_version=rv, timeout_seconds=1))
    elapsed = time.monotonic() - started
    assert events == []
    assert 0.9 <= elapsed < 3
    assert double.open_watch_count == 0


def test_bookmarks_while_idle_and_at_timeout(double: ApiServerDouble, api: CoreApi) -> None:
    double.bookmark_interval = 0.3
    double.add_pod(pod("p1"))
    rv = str(double.resource_version)
    w = watch.Watch()
    events = list(
        w.stream(
            api.list_namespaced_pod,
            NS,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        )
    )
    assert len(events) >= 3  # ~every 0.3 s while idle, plus one at the timeout
    assert {e["type"] for e in events} == {"BOOKMARK"}
    for event in events:
        assert event["raw_object"] == {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": rv},
        }
    assert w.resource_version == rv

    # without allowWatchBookmarks nothing is sent while idle
    assert (
        list(raw_watch(api.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1)) == []
    )


def test_watch_applies_field_and_label_selectors_with_transitions(
    double: ApiServerDouble, api: CoreApi
) -> None:
    double.add_node(node("n1"))
    double.add_pod(pod("bound", spec={"nodeName": "n1"}))
    double.add_pod(pod("gpu", metadata={"labels": {"gpu": "yes"}}))
    double.add_pod(pod("cpu"))
    rv = str(double.resource_version)

    unscheduled = raw_watch(
        api.list_namespaced_pod,
        NS,
        resource_version="0",
        field_selector="spec.nodeName=",
        timeout_seconds=5,
    )
    initial = [next(unscheduled), next(unscheduled)]
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in initial) == [
        ("ADDED", "cpu"),
        ("ADDED", "gpu"),
    ]
    # changes made after the snapshot arrive live on the same stream
    bind(api, "gpu", binding("gpu", "n1"))
    double.patch_pod(NS, "cpu", {"metadata": {"labels": {"gpu": "yes"}}})
    live = [next(unscheduled), next(unscheduled)]
    unscheduled.close()
    # leaving the selection is DELETED, with the previous content and the new RV
    assert live[0]["type"] == "DELETED"
    assert live[0]["object"]["metadata"]["name"] == "gpu"
    assert "nodeName" not in live[0]["object"]["spec"]
    assert live[0]["object"]["metadata"]["resourceVersion"] == str(int(rv) + 1)
    assert (live[1]["type"], live[1]["object"]["metadata"]["name"]) == ("MODIFIED", "cpu")

    labelled = collect(
        raw_watch(
            api.list_namespaced_pod,
            NS,
            resource_version=rv,
            label_selector="gpu=yes",
            timeout_seconds=5,
        ),
        2,
    )
    # binding keeps "gpu" matching the label selector; "cpu" starts matching => ADDED
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in labelled] == [
        ("MODIFIED", "gpu"),
        ("ADDED", "cpu"),
    ]
    on_node = collect(
        raw_watch(
            api.list_namespaced_pod,
            NS,
            resource_version=rv,
            field_selector="spec.nodeName!=",
            timeout_seconds=5,
        ),
        1,
    )
    assert on_node[0]["type"] == "ADDED"
    assert on_node[0]["object"]["metadata"]["name"] == "gpu"
    assert on_node[0]["object"]["spec"]["nodeName"] == "n1"


def test_list_selectors(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_pod(
        pod("a", metadata={"labels": {"app": "x", "tier": "web"}}, spec={"nodeName": "n1"})
    )
    double.add_pod(pod("b", metadata={"labels": {"app": "y"}}))
    double.add_pod(pod("c"))
    double.set_pod_phase(NS, "a", "Running")

    def names(**kwargs: Any) -> list[str]:
        return [p.metadata.name for p in api.list_namespaced_pod(NS, **kwargs).items]

    assert names(label_selector="app=x") == ["a"]
    assert names(label_selector="app!=x") == ["b", "c"]
    assert names(label_selector="app") == ["a", "b"]
    assert names(label_selector="!app") == ["c"]
    assert names(label_selector="app in (x,y),tier") == ["a"]
    assert names(field_selector="spec.nodeName=n1") == ["a"]
    assert names(field_selector="status.phase!=Running") == ["b", "c"]
    assert names(field_selector="metadata.name==b,metadata.namespace=default") == ["b"]
    assert names(label_selector="app", field_selector="status.phase=Pending") == ["b"]
    with pytest.raises(ApiException) as exc:
        names(field_selector="spec.bogus=1")
    assert exc.value.status == 400
    assert status_of(exc.value)["message"] == "field label not supported: spec.bogus"


# ---------------------------------------------------------------------------------------
# updates and patches


def test_merge_patch_and_noop_patch(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_pod(pod("p1", metadata={"labels": {"keep": "1", "drop": "1"}}))
    patched = api.patch_namespaced_pod(
        "p1",
        NS,
        {"metadata": {"labels": {"drop": None, "new": "2"}, "annotations": {"a": "b"}}},
        _content_type="application/merge-patch+json",
    )
    assert patched.metadata.labels == {"keep": "1", "new": "2"}
    assert patched.metadata.annotations == {"a": "b"}
    rv = double.resource_version
    assert patched.metadata.resource_version == str(rv)

    again = api.patch_namespaced_pod(
        "p1",
        NS,
        {"metadata": {"labels": {"new": "2"}}},
        _content_type="application/merge-patch+json",
    )
    assert again.metadata.resource_version == str(rv)
    assert double.resource_version == rv
    assert (
        list(raw_watch(api.list_namespaced_pod, NS, resource_version=str(rv), timeout_seconds=1))
        == []
    )

    status = api.patch_namespaced_pod_status(
        "p1",
        NS,
        {"status": {"phase": "Running"}},
        _content_type="application/merge-patch+json",
    )
    assert status.status.phase == "Running"
    # status changes through the main resource are ignored (real update strategy)
    ignored = api.patch_namespaced_pod("p1", NS, {"status": {"phase": "Failed"}})
    assert ignored.status.phase == "Running"
    assert ignored.metadata.resource_version == status.metadata.resource_version


def test_resource_version_in_a_patch_is_a_precondition(
    double: ApiServerDouble, api: CoreApi
) -> None:
    double.add_node(node("n1"))
    with pytest.raises(ApiException) as exc:
        api.patch_node(
            "n1",
            {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}},
            _content_type="application/merge-patch+json",
        )
    assert exc.value.status == 409
    assert status_of(exc.value)["reason"] == "Conflict"


def test_strategic_merge_patch_merges_conditions_by_type(
    double: ApiServerDouble, api: CoreApi
) -> None:
    double.add_pod(pod("p1", status={"conditions": [{"type": "Ready", "status": "False"}]}))
    # a dict body makes the client send application/strategic-merge-patch+json
    out = api.patch_namespaced_pod_status(
        "p1",
        NS,
        {
            "status": {
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ]
            }
        },
    )
    assert [(c.type, c.status) for c in out.status.conditions] == [
        ("Ready", "True"),
        ("Initialized", "True"),
    ]


def test_json_patch_operations_and_failures(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_node(node("n1", zone="a"))
    out = api.patch_node(
        "n1",
        [
            {"op": "test", "path": "/metadata/labels/zone", "value": "a"},
            {"op": "replace", "path": "/metadata/labels/zone", "value": "b"},
            {"op": "add", "path": "/metadata/labels/gpu", "value": "true"},
            {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
            {"op": "remove", "path": "/metadata/annotations/x"},
        ],
    )
    assert out.metadata.labels == {"zone": "b", "gpu": "true"}
    assert out.metadata.annotations == {}
    rv = double.resource_version

    failures = [
        [{"op": "test", "path": "/metadata/labels/zone", "value": "a"}],
        [{"op": "remove", "path": "/metadata/labels/missing"}],
        [{"op": "add", "path": "/spec/missing/deep", "value": 1}],
        [{"op": "replace", "path": "/metadata/nothing", "value": 1}],
    ]
    for operations in failures:
        with pytest.raises(ApiException) as exc:
            api.patch_node("n1", operations)
        body = status_of(exc.value)
        assert exc.value.status == 422
        assert body["reason"] == "Invalid"
    assert double.resource_version == rv
    node_now = double.get_node("n1")
    assert node_now is not None
    assert node_now["metadata"]["labels"] == {"zone": "b", "gpu": "true"}


def test_unsupported_patch_content_type_is_415(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_node(node("n1"))
    with pytest.raises(ApiException) as exc:
        api.patch_node("n1", {"metadata": {}}, _content_type="application/apply-patch+yaml")
    assert exc.value.status == 415
    assert status_of(exc.value)["reason"] == "UnsupportedMediaType"


def test_put_with_stale_resource_version_conflicts(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_pod(pod("p1"))
    current = api.read_namespaced_pod("p1", NS)
    current.metadata.labels = {"v": "1"}
    updated = api.replace_namespaced_pod("p1", NS, current)
    assert updated.metadata.labels == {"v": "1"}

    current.metadata.labels = {"v": "2"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as exc:
        api.replace_namespaced_pod("p1", NS, current)
    body = status_of(exc.value)
    assert exc.value.status == 409
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on pods "p1": the object has been modified; please '
        "apply your changes to the latest version and try again"
    )
    assert body["details"] == {"name": "p1", "kind": "pods"}

    current.metadata.resource_version = None  # unconditional update is allowed for pods
    assert api.replace_namespaced_pod("p1", NS, current).metadata.labels == {"v": "2"}

    fresh = api.read_namespaced_pod("p1", NS)
    fresh.status.phase = "Running"
    assert api.replace_namespaced_pod_status("p1", NS, fresh).status.phase == "Running"


def test_unchanged_client_round_trip_is_a_noop(double: ApiServerDouble, api: CoreApi) -> None:
    """The client re-renders times as +00:00 and drops nulls; that is not a change."""
    double.add_pod(pod("p1"))
    bind(api, "p1", binding("p1", "n1"))
    rv = double.resource_version
    read = api.read_namespaced_pod_status("p1", NS)
    assert api.replace_namespaced_pod_status("p1", NS, read).metadata.resource_version == str(rv)
    assert api.replace_namespaced_pod("p1", NS, read).metadata.resource_version == str(rv)
    assert double.resource_version == rv
    stored = double.get_pod(NS, "p1")
    assert stored is not None
    condition = stored["status"]["conditions"][0]
    assert condition["lastProbeTime"] is None
    assert condition["lastTransitionTime"].endswith("Z")


def test_pod_updates_cannot_move_a_pod_to_a_node(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_pod(pod("p1"))
    with pytest.raises(ApiException) as exc:
        api.patch_namespaced_pod("p1", NS, {"spec": {"nodeName": "n1"}})
    assert exc.value.status == 422
    assert "pod updates may not change fields" in status_of(exc.value)["message"]


def test_node_status_subresource(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_node(node("n1"))
    out = api.patch_node_status(
        "n1",
        {"status": {"allocatable": {"gpu.intel.com/i915": "2"}}},
        _content_type="application/merge-patch+json",
    )
    assert out.status.allocatable == {"gpu.intel.com/i915": "2"}
    assert out.status.capacity == {"cpu": "4"}
    fetched = api.read_node_status("n1")
    fetched.spec = client.V1NodeSpec(unschedulable=True)  # spec is ignored through /status
    fetched.status.allocatable = {"gpu.intel.com/i915": "1"}
    replaced = api.replace_node_status("n1", fetched)
    assert replaced.spec is None
    assert replaced.status.allocatable == {"gpu.intel.com/i915": "1"}
    # ...and status is ignored through the main resource
    cordoned = api.patch_node(
        "n1", {"spec": {"unschedulable": True}, "status": {"allocatable": {}}}
    )
    assert cordoned.spec.unschedulable is True
    assert cordoned.status.allocatable == {"gpu.intel.com/i915": "1"}


# ---------------------------------------------------------------------------------------
# binding


def test_binding_success_is_one_atomic_write(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_node(node("n1"))
    stored = double.add_pod(
        pod(
            "p1",
            metadata={"annotations": {"existing": "kept"}},
            status={
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                ]
            },
        )
    )
    rv = double.resource_version
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(
            name="p1",
            namespace=NS,
            uid=stored["metadata"]["uid"],
            annotations={"gas-ts": "123", "gas-container-cards": "card0"},
        ),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name="n1"),
    )
    resp = bind(api, "p1", body)
    assert resp.status == 201
    assert json.loads(resp.data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    assert double.resource_version == rv + 1
    assert double.count_requests("POST", r"/pods/p1/binding$") == 1

    events = list(
        raw_watch(api.list_namespaced_pod, NS, resource_version=str(rv), timeout_seconds=1)
    )
    assert len(events) == 1
    assert events[0]["type"] == "MODIFIED"
    bound = events[0]["object"]
    assert bound["metadata"]["resourceVersion"] == str(rv + 1)
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == {
        "existing": "kept",
        "gas-ts": "123",
        "gas-container-cards": "card0",
    }
    conditions = bound["status"]["conditions"]
    assert len(conditions) == 1
    assert conditions[0]["type"] == "PodScheduled"
    assert conditions[0]["status"] == "True"
    assert "reason" not in conditions[0]
    assert double.get_pod(NS, "p1") == {
        k: v for k, v in bound.items() if k not in ("kind", "apiVersion")
    }


def test_binding_with_preloaded_content_fails_client_side(
    double: ApiServerDouble, api: CoreApi
) -> None:
    """Documents the client quirk: it parses the Status reply as a V1Binding."""
    double.add_pod(pod("p1"))
    with pytest.raises(Exception) as exc:  # pydantic ValidationError: target is required
        api.create_namespaced_pod_binding("p1", NS, binding("p1", "n1"))
    assert "target" in str(exc.value)
    bound = double.get_pod(NS, "p1")
    assert bound is not None
    assert bound["spec"]["nodeName"] == "n1"  # ...although the server did bind the pod


BINDING_REJECTIONS: list[tuple[str, Callable[[ApiServerDouble], dict[str, Any]], int, str]] = [
    (
        "uid-mismatch",
        lambda d: binding("p1", "n1", uid="00000000-0000-0000-0000-000000000000"),
        409,
        "Precondition failed: UID in precondition: 00000000-0000-0000-0000-000000000000, "
        "UID in object meta: {uid}",
    ),
    (
        "rv-mismatch",
        lambda d: binding("p1", "n1", resourceVersion="1"),
        409,
        "Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object "
        "meta: {rv}",
    ),
    (
        "already-assigned",
        lambda d: (d.patch_pod(NS, "p1", {"spec": {"nodeName": "n0"}}), binding("p1", "n1"))[1],
        409,
        'pod p1 is already assigned to node "n0"',
    ),
    (
        "terminating",
        lambda d: (d.mark_pod_terminating(NS, "p1"), binding("p1", "n1"))[1],
        409,
        "pod p1 is being deleted, cannot be assigned to a host",
    ),
    (
        "scheduling-gates",
        lambda d: (
            d.patch_pod(NS, "p1", {"spec": {"schedulingGates": [{"name": "wait"}]}}),
            binding("p1", "n1"),
        )[1],
        409,
        "pod p1 has non-empty .spec.schedulingGates",
    ),
    ("missing-pod", lambda d: binding("ghost", "n1"), 404, 'pods "ghost" not found'),
    (
        "bad-target-kind",
        lambda d: {**binding("p1", "n1"), "target": {"kind": "Pod", "name": "n1"}},
        500,
        'target.kind: Unsupported value: "Pod": supported values: "Node", "<empty>"',
    ),
    (
        "empty-target-name",
        lambda d: {**binding("p1", "n1"), "target": {"kind": "Node", "name": ""}},
        500,
        "target.name: Required value",
    ),
    (
        "name-mismatch",
        lambda d: binding("other", "n1"),
        400,
        "name in URL does not match name in Binding object",
    ),
]


@pytest.mark.parametrize(
    ("case", "make_body", "code", "message"),
    BINDING_REJECTIONS,
    ids=[case[0] for case in BINDING_REJECTIONS],
)
def test_binding_rejections(
    double: ApiServerDouble,
    api: CoreApi,
    case: str,
    make_body: Callable[[ApiServerDouble], dict[str, Any]],
    code: int,
    message: str,
) -> None:
    stored = double.add_pod(pod("p1"))
    body = make_body(double)
    before = double.get_pod(NS, "p1")
    assert before is not None
    rv = double.resource_version
    url_name = "ghost" if case == "missing-pod" else "p1"
    with pytest.raises(ApiException) as exc:
        bind(api, url_name, body)
    status = status_of(exc.value)
    assert exc.value.status == code
    expected = message.format(
        uid=stored["metadata"]["uid"], rv=before["metadata"]["resourceVersion"]
    )
    assert expected in status["message"]
    if code == 409:
        assert status["reason"] == "Conflict"
        assert status["message"].startswith("Operation cannot be fulfilled on pods")
    elif code == 404:
        assert status["reason"] == "NotFound"
    elif code == 400:
        assert status["reason"] == "BadRequest"
    else:  # ValidatePodBinding errors are not StatusErrors: 500 without a reason
        assert "reason" not in status
    assert double.resource_version == rv
    assert double.get_pod(NS, "p1") == before


def test_binding_with_matching_uid_succeeds(double: ApiServerDouble, api: CoreApi) -> None:
    stored = double.add_pod(pod("p1"))
    meta = stored["metadata"]
    resp = bind(
        api, "p1", binding("p1", "n1", uid=meta["uid"], resourceVersion=meta["resourceVersion"])
    )
    assert resp.status == 201


# ---------------------------------------------------------------------------------------
# delete and events


def test_delete_emits_deleted_with_last_state(double: ApiServerDouble, api: CoreApi) -> None:
    stored = double.add_pod(pod("p1", metadata={"labels": {"a": "b"}}))
    rv = double.resource_version
    deleted = api.delete_namespaced_pod("p1", NS)
    assert deleted.metadata.uid == stored["metadata"]["uid"]
    with pytest.raises(ApiException) as exc:
        api.read_namespaced_pod("p1", NS)
    assert exc.value.status == 404
    events = list(
        raw_watch(api.list_namespaced_pod, NS, resource_version=str(rv), timeout_seconds=1)
    )
    assert [e["type"] for e in events] == ["DELETED"]
    assert events[0]["object"]["metadata"]["labels"] == {"a": "b"}
    assert events[0]["object"]["metadata"]["resourceVersion"] == str(rv + 1)

    double.add_node(node("n1"))
    api.delete_node("n1")
    assert double.get_node("n1") is None

    double.add_pod(pod("p2"))
    with pytest.raises(ApiException) as conflict:
        api.delete_namespaced_pod(
            "p2", NS, body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="x"))
        )
    assert conflict.value.status == 409
    assert double.get_pod(NS, "p2") is not None


def test_events_are_stored(double: ApiServerDouble, api: CoreApi) -> None:
    core = api.create_namespaced_event(
        NS,
        {
            "metadata": {"generateName": "p1."},
            "involvedObject": {"kind": "Pod", "name": "p1", "namespace": NS},
            "reason": "Scheduled",
            "message": "bound to n1",
            "type": "Normal",
        },
    )
    assert core.metadata.name.startswith("p1.")
    events_api: Any = client.EventsV1Api(api.api_client)
    events_api.create_namespaced_event(
        NS,
        {
            "metadata": {"name": "e2"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reason": "Failed",
            "note": "no card",
            "action": "Binding",
            "reportingController": "gas",
            "reportingInstance": "gas-1",
            "type": "Warning",
        },
    )
    stored = double.events
    assert [e["reason"] for e in stored] == ["Scheduled", "Failed"]
    assert stored[1]["apiVersion"] == "events.k8s.io/v1"
    assert stored[0]["metadata"]["namespace"] == NS


# ---------------------------------------------------------------------------------------
# lifecycle of watch streams


def test_stop_closes_open_watch_streams_promptly(tmp_path) -> None:
    server = ApiServerDouble().start()
    api_client = config.new_client_from_config(config_file=server.write_kubeconfig(tmp_path / "kc"))
    outcome: list[str] = []

    def consume() -> None:
        try:
            watcher_api: Any = client.CoreV1Api(api_client)
            for _ in raw_watch(watcher_api.list_node, resource_version="0"):
                pass
            outcome.append("ended")
        except Exception as exc:  # abrupt close is fine too
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while server.open_watch_count == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.open_watch_count == 1
    started = time.monotonic()
    server.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2
    assert outcome
    api_client.close()


def test_client_disconnect_releases_the_watcher(double: ApiServerDouble, api: CoreApi) -> None:
    resp = api.list_node(watch=True, _preload_content=False)
    deadline = time.monotonic() + 5
    while double.open_watch_count == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert double.open_watch_count == 1
    resp.close()
    resp.release_conn()
    while double.open_watch_count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert double.open_watch_count == 0


# ---------------------------------------------------------------------------------------
# fault injection


def test_status_fault_answers_without_touching_the_store(
    double: ApiServerDouble, api: CoreApi
) -> None:
    rule = double.faults.add("POST", r"/namespaces/default/pods$", ("status", 503))
    rv = double.resource_version
    with pytest.raises(ApiException) as exc:
        api.create_namespaced_pod(NS, pod("p1"))
    assert exc.value.status == 503
    assert status_of(exc.value)["reason"] == "ServiceUnavailable"
    assert double.get_pod(NS, "p1") is None
    assert double.resource_version == rv
    assert rule.hits == 1
    api.create_namespaced_pod(NS, pod("p1"))  # times=1: the next request is normal
    assert double.get_pod(NS, "p1") is not None


def test_after_write_status_fault_performs_the_write(double: ApiServerDouble, api: CoreApi) -> None:
    double.add_pod(pod("p1"))
    double.faults.add("POST", r"/binding$", ("after_write_status", 504))
    with pytest.raises(ApiException) as exc:
        bind(api, "p1", binding("p1", "n1"))
    assert exc.value.status == 504
    assert status_of(exc.value)["reason"] == "Timeout"
    bound = double.get_pod(NS, "p1")
    assert bound is not None
    assert bound["spec"]["nodeName"] == "n1"
    with pytest.raises(ApiException) as retry:
        bind(api, "p1", binding("p1", "n1"))
    assert retry.value.status == 409
    assert 'already assigned to node "n1"' in status_of(retry.value)["message"]
    assert double.count_requests("POST", r"/pods/p1/binding$") == 2


def test_delay_fault_and_clear(double: ApiServerDouble, api: CoreApi) -> None:
    double.faults.add("GET", r"^/api/v1/nodes$", ("delay", 0.3), times=None)
    for _ in range(2):
        started = time.monotonic()
        api.list_node()
        assert time.monotonic() - started >= 0.3
    double.faults.clear()
    started = time.monotonic()
    api.list_node()
    assert time.monotonic() - started < 0.3


def test_drop_watch_fault_cuts_the_stream_after_one_event(
    double: ApiServerDouble, api: CoreApi
) -> None:
    double.add_node(node("n1"))
    double.add_node(node("n2"))
    double.faults.add("GET", r"^/api/v1/nodes$", ("drop_watch", None))
    assert len(api.list_node().items) == 2  # plain lists are not affected
    received: list[dict[str, Any]] = []
    with pytest.raises(urllib3.exceptions.HTTPError):  # ProtocolError: ended prematurely
        for event in raw_watch(api.list_node, resource_version="0", timeout_seconds=5):
            received.append(event)
    assert [e["object"]["metadata"]["name"] for e in received] == ["n1"]
    # the rule is used up: the next watch is whole
    events = collect(raw_watch(api.list_node, resource_version="0", timeout_seconds=5), 2)
    assert len(events) == 2


def test_close_fault_on_get_is_retried_by_the_client(double: ApiServerDouble, api: CoreApi) -> None:
    double.faults.add("GET", r"^/api/v1/nodes$", ("close", None))
    assert api.list_node().items == []  # urllib3 silently retries idempotent requests
    assert double.count_requests("GET", r"^/api/v1/nodes$") == 2
    double.faults.add("POST", r"^/api/v1/nodes$", ("close", None))
    with pytest.raises(urllib3.exceptions.HTTPError):  # ...but not POSTs
        api.create_node(node("n1"))
    assert double.get_node("n1") is None
