"""The API calls shared by the extender and the node agent (gas/kubeapi/) against the
API-server double: the extender's lists (in pages), watches and Lease calls send what their
generated namesakes send and get the same answers, a refusal or an expired continue token
is the client's `ApiException` with the server's status, and the `gas serve` worker, as it
syncs, binds, reads pods, posts Events, patches pods and holds the Lease, never loads a
generated API class or model. The node agent's calls: test_node_kubeapi.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from gas.core.model import ANNOTATION_CARDS, LABEL_DESCHEDULE_POD
from gas.kubeapi.core import RawCoordinationV1Api, RawCoreV1Api
from gas.kubeapi.prepared import PreparedApi
from tests.support.apiserver import ApiServerDouble
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.rawcalls import both, json_body, last_request

TIMEOUT = (5.0, 10.0)
ROOT = Path(__file__).resolve().parents[2]
DESCHEDULE_CARD0 = "telemetry.aware.scheduling.policy/gas-deschedule-pods-card0"


@pytest.fixture
def api_client(kubeconfig: str) -> Any:
    return kubernetes.config.new_client_from_config(config_file=kubeconfig)


@pytest.mark.parametrize("method", ["list_node", "list_pod_for_all_namespaces"])
def test_a_list_read_in_pages_sends_what_core_v1_api_sends(
    apiserver: ApiServerDouble, api_client: Any, method: str
) -> None:
    for i in range(5):
        apiserver.add_node(gpu_node(f"n{i}", "0"))
        apiserver.add_pod(gpu_pod(f"p{i}", container(i915="1"), node=f"n{i}"))
    ours = getattr(RawCoreV1Api(api_client), method)
    theirs = getattr(kubernetes.client.CoreV1Api(api_client), method)
    raw: dict[str, Any] = {"_preload_content": False, "_request_timeout": TIMEOUT}
    names: list[str] = []
    token: str | None = None
    while True:
        paging: dict[str, Any] = {"limit": 2} | ({"_continue": token} if token else {})
        page, same = both(
            apiserver,
            partial(ours, _request_timeout=TIMEOUT, **paging),
            partial(theirs, **raw, **paging),
        )
        assert page == same
        _, path, query = last_request(apiserver)
        assert query["limit"] == ["2"] and query.get("continue") == ([token] if token else None)
        names += [item["metadata"]["name"] for item in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert len(names) == len(set(names)) == 5
    assert path == ("/api/v1/nodes" if method == "list_node" else "/api/v1/pods")


def test_a_node_watch_sends_what_core_v1_api_sends_and_streams_events(
    apiserver: ApiServerDouble, api_client: Any
) -> None:
    apiserver.add_node(gpu_node("n1", "0"))
    version = str(apiserver.resource_version)
    apiserver.add_node(gpu_node("n2", "0"))
    watch: dict[str, Any] = {
        "watch": True,
        "resource_version": version,
        "allow_watch_bookmarks": True,
        "timeout_seconds": 1,
    }
    generated: Any = kubernetes.client.CoreV1Api(api_client)
    streamed = []
    calls: list[Callable[[], Any]] = [
        lambda: RawCoreV1Api(api_client).list_node(**watch, _request_timeout=TIMEOUT),
        lambda: generated.list_node(**watch, _preload_content=False, _request_timeout=TIMEOUT),
    ]
    for call in calls:
        response = call()
        events = [json.loads(line) for line in response if line.strip()]
        response.release_conn()
        # Bookmarks come when the server pleases; the changes are what must agree.
        changes = [e for e in events if e["type"] != "BOOKMARK"]
        names = [(e["type"], e["object"]["metadata"]["name"]) for e in changes]
        streamed.append((names, last_request(apiserver)))
    assert streamed[0] == streamed[1]
    assert streamed[0][0] == [("ADDED", "n2")]
    assert streamed[0][1][2]["watch"] == ["true"]


def test_an_expired_continue_token_is_the_clients_410(
    apiserver: ApiServerDouble, api_client: Any
) -> None:
    for i in range(3):
        apiserver.add_pod(gpu_pod(f"p{i}", container(i915="1"), node="n1"))
    api = RawCoreV1Api(api_client)
    first = json_body(api.list_pod_for_all_namespaces(limit=1, _request_timeout=TIMEOUT))
    apiserver.add_pod(gpu_pod("later", container(i915="1"), node="n1"))
    apiserver.compact()  # the first page's snapshot with it
    with pytest.raises(kubernetes.client.ApiException) as caught:
        api.list_pod_for_all_namespaces(
            limit=1, _continue=first["metadata"]["continue"], _request_timeout=TIMEOUT
        )
    assert caught.value.status == 410
    assert json.loads(caught.value.body or "{}")["reason"] == "Expired"


def test_lease_calls_send_what_coordination_v1_api_sends(
    apiserver: ApiServerDouble, api_client: Any
) -> None:
    ours = RawCoordinationV1Api(api_client)
    theirs: Any = kubernetes.client.CoordinationV1Api(api_client)
    raw: dict[str, Any] = {"_preload_content": False, "_request_timeout": TIMEOUT}

    def lease(name: str, holder: str, version: str = "") -> dict[str, Any]:
        metadata = {"name": name, "namespace": "gas-system"}
        if version:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        }

    created = [
        json_body(
            ours.create_namespaced_lease("gas-system", lease("a", "me"), _request_timeout=TIMEOUT)
        ),
        json_body(theirs.create_namespaced_lease("gas-system", lease("b", "me"), **raw)),
    ]
    assert (
        apiserver.request_targets[-2:]
        == [("POST", "/apis/coordination.k8s.io/v1/namespaces/gas-system/leases")] * 2
    )
    assert [c["spec"] for c in created] == [
        {"holderIdentity": "me", "leaseDurationSeconds": 15}
    ] * 2

    read, same = both(
        apiserver,
        lambda: ours.read_namespaced_lease("a", "gas-system", _request_timeout=TIMEOUT),
        lambda: theirs.read_namespaced_lease("a", "gas-system", **raw),
    )
    assert read == same == created[0]

    version = read["metadata"]["resourceVersion"]
    replaced = json_body(
        ours.replace_namespaced_lease(
            "a", "gas-system", lease("a", "you", version), _request_timeout=TIMEOUT
        )
    )
    assert replaced["spec"]["holderIdentity"] == "you"
    assert apiserver.request_targets[-1] == (
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/gas-system/leases/a",
    )
    # A stale resourceVersion: the same conflict either way.
    conflicts = []
    for call in (
        lambda: ours.replace_namespaced_lease(
            "a", "gas-system", lease("a", "me", version), _request_timeout=TIMEOUT
        ),
        lambda: theirs.replace_namespaced_lease(
            "a", "gas-system", lease("a", "me", version), **raw
        ),
    ):
        with pytest.raises(kubernetes.client.ApiException) as caught:
            call()
        conflicts.append((caught.value.status, json.loads(caught.value.body or "{}")["reason"]))
    assert conflicts == [(409, "Conflict")] * 2


def test_every_call_carries_the_name_of_the_generated_call_it_stands_for() -> None:
    """So the RBAC check of `deploy/` (tests/integration/test_manifests.py) reads each as
    its namesake."""
    client = kubernetes.client
    for ours, theirs in (
        (RawCoreV1Api, client.CoreV1Api),
        (RawCoordinationV1Api, client.CoordinationV1Api),
    ):
        methods = {m for m in vars(ours) if not m.startswith("_")}
        assert methods
        assert all(callable(getattr(theirs, m, None)) for m in methods), ours
    prepared = {"read_namespaced_pod", "create_namespaced_pod_binding", "create_namespaced_event"}
    assert prepared <= set(vars(PreparedApi))
    assert all(callable(getattr(client.CoreV1Api, m, None)) for m in prepared)


def test_the_extenders_worker_never_loads_the_generated_api_or_its_models(
    apiserver: ApiServerDouble, kubeconfig: str
) -> None:
    """What the `gas serve` worker imports and calls, in a fresh interpreter: it syncs
    nodes and pods (lists and watches), binds a pod it reads first, posts an Event, patches
    a pod's deschedule label and takes, renews and releases the Lease; then no generated
    API class and no model is loaded."""
    node = gpu_node("n1", "0.1", i915="2")
    node["metadata"]["labels"][DESCHEDULE_CARD0] = "true"
    apiserver.add_node(node)
    running = {ANNOTATION_CARDS: "card0"}
    apiserver.add_pod(gpu_pod("running", node="n1", annotations=running, phase="Running"))
    apiserver.add_pod(gpu_pod("pending", container(i915="1")))
    script = f"""
import sys, time
import gas.serving.main
from gas.cluster.kube import KubeCluster, load_api_client
from gas.cluster.leader import KubeLeaseStore, LeaseRecord
from gas.core.ledger import Ledger
from gas.kubeapi.prepared import PreparedApi

def wait(check):
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)

api_client = load_api_client({kubeconfig!r})
cluster = KubeCluster(Ledger(), api_client)
cluster.start()
wait(cluster.synced)
pod = cluster.get_pod("default", "pending")
cluster.bind(pod, "n1", {{"gas-container-cards": "card1"}})
cluster.record_event(pod, "Normal", "Seen", "a test event")
events = "/api/v1/namespaces/default/events"
wait(lambda: b"Seen" in PreparedApi(api_client).request("GET", events, None, (5, 5)).data)
store = KubeLeaseStore(api_client, "gas-system", "gas-extender", 5.0)
assert store.get() is None
held = store.create(LeaseRecord(holder="me", duration_seconds=15))
store.update(LeaseRecord(holder="", duration_seconds=1, resource_version=held.resource_version))
wait(lambda: {LABEL_DESCHEDULE_POD!r} in (cluster.get_pod("default", "running")["metadata"]
                                          .get("labels") or {{}}))
cluster.stop()
print(sorted(
    m for m in sys.modules
    if m.startswith(("kubernetes.client.api.", "kubernetes.client.models."))
))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=90
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    bound = apiserver.get_pod("default", "pending")
    assert bound is not None and bound["spec"]["nodeName"] == "n1"
    assert [e["reason"] for e in apiserver.events] == ["Seen"]
    methods = {m for m, _ in apiserver.request_targets}
    assert methods == {"GET", "POST", "PUT", "PATCH"}


def test_an_argument_gas_does_not_pass_is_refused_before_any_request(
    apiserver: ApiServerDouble, api_client: Any
) -> None:
    """As the generated methods refuse an unknown keyword: a misspelt option must not
    quietly send a different request."""
    api: Any = RawCoreV1Api(api_client)
    apiserver.clear_requests()
    with pytest.raises(TypeError, match="resource_version_match"):
        api.list_node(resource_version_match="NotOlderThan")
    with pytest.raises(TypeError, match="_preload_content"):
        api.patch_node("n1", {}, _preload_content=False)
    assert apiserver.requests == []
