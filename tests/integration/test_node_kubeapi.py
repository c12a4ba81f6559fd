"""`gas node`'s Kubernetes client (`gas.kubeapi.core.RawCoreV1Api`, as `gas.host.kubeapi`
loads it) against the API-server double: each call the agent makes sends what its
`CoreV1Api` namesake sends and has the same effect, errors come back as the client's
`ApiException`, and the agent's process never loads the generated `CoreV1Api` or its models
(the memory that saves is the point of the class). The extender's calls:
test_kubeapi.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from gas.host.kubeapi import core_api
from gas.kubeapi.core import MERGE_PATCH
from gas.node.podapi import NodeApi, event_body
from tests.support.apiserver import ApiServerDouble
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.rawcalls import both, json_body, last_request

TIMEOUT = (5.0, 10.0)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def generated(kubeconfig: str) -> Any:
    return kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=kubeconfig)
    )


def test_reads_send_what_core_v1_api_sends_and_get_the_same(
    apiserver: ApiServerDouble, kubeconfig: str, generated: Any
) -> None:
    apiserver.add_node(gpu_node("n1", "0.1"))
    apiserver.add_pod(gpu_pod("p", container(i915="1"), node="n1"))
    apiserver.add_pod(gpu_pod("elsewhere", container(i915="1"), node="n2"))
    api = core_api(kubeconfig)
    raw = {"_preload_content": False, "_request_timeout": TIMEOUT}

    ours, theirs = both(
        apiserver,
        lambda: api.read_node("n1", _request_timeout=TIMEOUT),
        lambda: generated.read_node("n1", **raw),
    )
    assert ours == theirs and ours["metadata"]["name"] == "n1"

    ours, theirs = both(
        apiserver,
        lambda: api.read_namespaced_pod("p", "default", _request_timeout=TIMEOUT),
        lambda: generated.read_namespaced_pod("p", "default", **raw),
    )
    assert ours == theirs and ours["metadata"]["name"] == "p"

    selector = "spec.nodeName=n1"
    ours, theirs = both(
        apiserver,
        lambda: api.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=TIMEOUT),
        lambda: generated.list_pod_for_all_namespaces(field_selector=selector, **raw),
    )
    assert ours == theirs
    assert [pod["metadata"]["name"] for pod in ours["items"]] == ["p"]


def test_a_watch_sends_what_core_v1_api_sends_and_streams_events(
    apiserver: ApiServerDouble, kubeconfig: str, generated: Any
) -> None:
    apiserver.add_pod(gpu_pod("p", container(i915="1"), node="n1"))
    version = str(apiserver.resource_version)
    apiserver.add_pod(gpu_pod("q", container(i915="1"), node="n1"))
    api = core_api(kubeconfig)
    watch: dict[str, Any] = {
        "field_selector": "spec.nodeName=n1",
        "watch": True,
        "resource_version": version,
        "allow_watch_bookmarks": True,
        "timeout_seconds": 1,
    }
    streamed = []
    for call in (
        lambda: api.list_pod_for_all_namespaces(**watch, _request_timeout=TIMEOUT),
        lambda: generated.list_pod_for_all_namespaces(
            **watch, _preload_content=False, _request_timeout=TIMEOUT
        ),
    ):
        response = call()
        events = [json.loads(line) for line in response if line.strip()]
        # Bookmarks come when the server pleases; the changes are what must agree.
        lines = [e for e in events if e["type"] != "BOOKMARK"]
        response.release_conn()
        streamed.append(
            ([(e["type"], e["object"]["metadata"]["name"]) for e in lines], last_request(apiserver))
        )
    assert streamed[0] == streamed[1]
    assert streamed[0][0][0] == ("ADDED", "q")
    _, path, query = streamed[0][1]
    assert path == "/api/v1/pods" and query["watch"] == ["true"]


def test_writes_send_what_core_v1_api_sends_with_the_same_effect(
    apiserver: ApiServerDouble, kubeconfig: str, generated: Any
) -> None:
    apiserver.add_node(gpu_node("n1", "0.1"))
    pod = apiserver.add_pod(gpu_pod("p", container(i915="1"), node="n1"))
    api = core_api(kubeconfig)
    writes: list[tuple[str, str, dict[str, Any]]] = [
        ("patch_node", "n1", {"metadata": {"labels": {"gpu.intel.com/tiles": "2"}}}),
        ("patch_node_status", "n1", {"status": {"capacity": {"gpu.intel.com/tiles": "2"}}}),
    ]
    for method, name, body in writes:
        apiserver.clear_requests()
        for client in (api, generated):
            extra = {} if client is api else {"_preload_content": False}
            response = getattr(client, method)(
                name, body, _content_type=MERGE_PATCH, _request_timeout=TIMEOUT, **extra
            )
            response.drain_conn()
            response.release_conn()
        (first, second) = apiserver.request_targets
        assert first == second == ("PATCH", f"/api/v1/nodes/n1{'/status' * ('status' in method)}")
    node = apiserver.get_node("n1")
    assert node is not None
    assert node["metadata"]["labels"]["gpu.intel.com/tiles"] == "2"
    assert node["status"]["capacity"]["gpu.intel.com/tiles"] == "2"

    uid = pod["metadata"]["uid"]
    patch = {"metadata": {"uid": uid, "annotations": {"gas-node-cards": "card1"}}}
    apiserver.clear_requests()
    ours = json_body(
        api.patch_namespaced_pod(
            "p", "default", patch, _content_type=MERGE_PATCH, _request_timeout=TIMEOUT
        )
    )
    theirs = json_body(
        generated.patch_namespaced_pod(
            "p",
            "default",
            patch,
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=TIMEOUT,
        )
    )
    assert ours["metadata"]["annotations"]["gas-node-cards"] == "card1"
    assert ours == theirs
    assert apiserver.request_targets == [("PATCH", "/api/v1/namespaces/default/pods/p")] * 2


def test_an_event_is_created_as_core_v1_api_creates_it(
    apiserver: ApiServerDouble, kubeconfig: str, generated: Any
) -> None:
    involved = {"kind": "Pod", "name": "p", "namespace": "default", "uid": "u1"}
    body = event_body(involved, "Warning", "GasAllocationMismatch", "refused", "n1")
    api = core_api(kubeconfig)
    ours = json_body(api.create_namespaced_event("default", body, _request_timeout=TIMEOUT))
    theirs = json_body(
        generated.create_namespaced_event(
            "default",
            kubernetes.client.CoreV1Event.from_dict(body),
            _preload_content=False,
            _request_timeout=TIMEOUT,
        )
    )
    assert apiserver.request_targets == [("POST", "/api/v1/namespaces/default/events")] * 2
    server_set = ("name", "uid", "resourceVersion", "creationTimestamp")
    for event in (ours, theirs):
        for key in server_set:
            event["metadata"].pop(key, None)
    assert ours == theirs
    assert ours["involvedObject"] == {"apiVersion": "v1", **involved}
    assert [e["reason"] for e in apiserver.events] == ["GasAllocationMismatch"] * 2


def test_a_refusal_is_the_clients_api_exception_with_the_servers_reason(
    apiserver: ApiServerDouble, kubeconfig: str
) -> None:
    api = core_api(kubeconfig)
    with pytest.raises(kubernetes.client.ApiException) as caught:
        api.read_node("ghost", _request_timeout=TIMEOUT)
    assert caught.value.status == 404
    assert "ghost" in (caught.value.body or "")
    # The pod calls read a 404 as a pod that is gone, as before.
    assert NodeApi(api, "n1").get_pod("default", "ghost") is None


def test_the_agents_process_never_loads_the_generated_api_or_its_models(
    apiserver: ApiServerDouble, kubeconfig: str
) -> None:
    """What `gas node` imports and calls, in a fresh interpreter: the `gas` command's
    parser, the agent, the client, every kind of call; then no generated API class and no
    model is loaded, nor numpy (the extender's arrays: 15 MiB)."""
    apiserver.add_node(gpu_node("n1", "0"))
    apiserver.add_pod(gpu_pod("p", container(i915="1"), node="n1"))
    script = f"""
import sys
from gas.cli import build_parser
import gas.node.agent
from gas.host.kubeapi import core_api, read_node
from gas.host.labels import patch_labels
from gas.node.podapi import NodeApi, event_body
build_parser()
core = core_api({kubeconfig!r})
api = NodeApi(core, "n1")
read_node(core, "n1")
patch_labels(core, "n1", {{"gpu.intel.com/tiles": "1"}})
items, version = api.list_pods()
api.get_pod("default", "p")
api.patch_pod_annotation("default", "p", items[0]["metadata"]["uid"], "gas-node-cards", "card0")
involved = {{"kind": "Pod", "name": "p", "namespace": "default", "uid": "u"}}
api.create_event("default", event_body(involved, "Normal", "R", "m", "n1"))
loaded = sorted(
    m for m in sys.modules
    if m.startswith(("kubernetes.client.api.", "kubernetes.client.models.", "numpy"))
)
print(loaded)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert [e["reason"] for e in apiserver.events] == ["R"]
