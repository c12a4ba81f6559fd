"""gas lists the cluster in pages (`limit`/`continue`) and ends as one list would leave it.

`KubeCluster` (the real `kubernetes` client over HTTP) against the API-server double with
small pages, side by side with one that lists in one request; then a real `gas serve` with
its own page size of 500. Pages of a list are read at the first page's snapshot; pods
changed between pages reach gas through the watch that starts there; a list whose continue
token expired starts over; the ledger is replaced once, after the last page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CollectorRegistry

from gas.cluster.counters import SyncCounters
from gas.cluster.deschedule import PodFacts
from gas.cluster.kube import LIST_PAGE_SIZE, KubeCluster, load_api_client
from gas.core.ledger import Ledger
from gas.core.model import ANNOTATION_CARDS, ANNOTATION_TILES, LABEL_DESCHEDULE_POD
from tests.support.apiserver import ApiServerDouble
from tests.support.apiserver.faults import FaultRule
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.ledger_checks import assert_consistent, ledger_of
from tests.support.objects import bound_pod, container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.promtext import metric
from tests.support.workload import cut_connections

PODS = "/api/v1/pods"
DESCHEDULE_CARD0 = "telemetry.aware.scheduling.policy/gas-deschedule-pods-card0"


class Synced:
    """One `KubeCluster` with its own ledger and counters."""

    def __init__(self, kubeconfig: str, page_size: int) -> None:
        self.ledger = Ledger()
        self.registry = CollectorRegistry()
        self.api_client = load_api_client(kubeconfig)
        self.cluster = KubeCluster(
            self.ledger, self.api_client, SyncCounters(self.registry), list_page_size=page_size
        )
        self.cluster.start()

    def view(self) -> tuple[dict[str, Any], dict[str, PodFacts]]:
        """What gas holds: the ledger, and the deschedule controller's pods."""
        return self.ledger.snapshot(), self.cluster.descheduler.facts()

    def counter(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def wait_synced(self) -> None:
        wait_for(self.cluster.synced, timeout=15, what="the cluster to sync")

    def close(self) -> None:
        self.cluster.stop()
        self.api_client.close()


StartSynced = Callable[[int], Synced]


@pytest.fixture
def start(kubeconfig: str) -> Iterator[StartSynced]:
    started: list[Synced] = []

    def make(page_size: int) -> Synced:
        synced = Synced(kubeconfig, page_size)
        started.append(synced)
        return synced

    yield make
    for synced in started:
        synced.close()


def populate(apiserver: ApiServerDouble) -> int:
    """Nodes and pods of every kind gas reads; returns how many pods the ledger holds."""
    card0_descheduled = gpu_node("n1", "0.1.2.3", i915="8", memory_max="32Gi", tiles="8")
    card0_descheduled["metadata"]["labels"][DESCHEDULE_CARD0] = "true"
    apiserver.add_node(card0_descheduled)
    for name in ("n2", "n3", "n4"):
        apiserver.add_node(gpu_node(name, "0.1", i915="4", memory_max="16Gi"))
    add = apiserver.add_pod
    gpu = container(i915="1", memory_max="1Gi")
    held = 0
    for index in range(4):
        # Labelled already (card0 of n1 is descheduled): the controller leaves them be.
        pod = bound_pod(f"on-card0-{index}", "n1", "card0", gpu)
        pod["metadata"]["labels"] = {LABEL_DESCHEDULE_POD: "gpu"}
        add(pod)
        add(bound_pod(f"on-card1-{index}", "n1", "card1", gpu, namespace="ml"))
        add(bound_pod(f"other-{index}", f"n{2 + index % 3}", "card1", gpu, namespace="a-b"))
        held += 3
    tiled = bound_pod("tiled", "n1", "card2", container(i915="1", tiles="1"))
    tiled["metadata"]["annotations"][ANNOTATION_TILES] = "card2:gt1"
    add(tiled)
    add(bound_pod("unreadable", "n2", "card1,gpu7x", gpu))  # fails closed
    held += 2
    add(bound_pod("finished", "n3", "card0", gpu, phase="Succeeded"))
    add(gpu_pod("not-bound", gpu, annotations={ANNOTATION_CARDS: "card3"}))
    add(gpu_pod("no-annotation", gpu, node="n4", phase="Running"))
    return held


def pod_lists(apiserver: ApiServerDouble, start: int = 0) -> list[dict[str, str]]:
    """The query of every GET of all pods that was not a watch, after request `start`."""
    found = []
    for method, target in apiserver.request_targets[start:]:
        split = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        if method == "GET" and split.path == PODS and query.get("watch", "").lower() != "true":
            found.append(query)
    return found


def first_pod_watch_version(apiserver: ApiServerDouble) -> str:
    for method, target in apiserver.request_targets:
        split = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        if method == "GET" and split.path == PODS and query.get("watch", "").lower() == "true":
            return query["resourceVersion"]
    raise AssertionError("no watch of pods")


def wait_same(paged: Synced, whole: Synced) -> None:
    try:
        wait_for(lambda: paged.view() == whole.view(), what="the two syncs to agree")
    except TimeoutError:
        assert paged.view() == whole.view()


def synced_like_one_list(start: StartSynced) -> Synced:
    """A gas synced in pages of 3, once it agrees with one synced from a single list."""
    paged = start(3)
    paged.wait_synced()
    whole = start(0)
    whole.wait_synced()
    wait_same(paged, whole)
    return paged


# ------------------------------------------------------------------ in process


def test_a_paged_list_syncs_gas_as_one_request_does(
    apiserver: ApiServerDouble, start: StartSynced
) -> None:
    held = populate(apiserver)
    paged = start(3)
    paged.wait_synced()
    lists = pod_lists(apiserver)
    whole = start(0)
    whole.wait_synced()

    ledger, facts = paged.view()
    assert len(ledger["pods"]) == held
    assert set(ledger["nodes"]) == {"n1", "n2", "n3", "n4"}
    assert {f.name for f in facts.values()} >= {"on-card0-0", "tiled", "finished"}
    assert (ledger, facts) == whole.view()
    # 17 pods in pages of 3: six requests, the first without a token.
    assert [q.get("limit") for q in lists] == ["3"] * 6
    assert ["continue" in q for q in lists] == [False] + [True] * 5
    assert "limit" not in pod_lists(apiserver)[-1]  # the other one lists in one request
    assert paged.counter("gas_ledger_rebuilds_total") == 1


def start_held_at_the_second_page(
    apiserver: ApiServerDouble, start: StartSynced
) -> tuple[Synced, FaultRule]:
    """gas listing the populated double in pages of 3, its request for the second page held
    by the double until the test releases it."""
    populate(apiserver)
    held = apiserver.faults.add("GET", f"^{PODS}$", ("hold", None), query_regex="continue=")
    paged = start(3)
    wait_for(lambda: held.hits == 1, what="the second page to be asked for")
    return paged, held


def test_pods_changed_between_pages_are_listed_as_of_the_first_page_then_watched(
    apiserver: ApiServerDouble, start: StartSynced
) -> None:
    paged, held = start_held_at_the_second_page(apiserver, start)
    snapshot = apiserver.resource_version
    # Half listed: nothing of it is applied.
    assert not paged.cluster.synced()
    assert paged.ledger.snapshot()["pods"] == {}
    assert paged.cluster.descheduler.facts() == {}

    # Keys in order: a-b/..., default/..., ml/...; the first page held three a-b pods.
    apiserver.delete_pod("a-b", "other-0")  # already listed
    apiserver.add_pod(bound_pod("zz-new", "n4", "card0", container(i915="1")))
    apiserver.set_pod_phase("ml", "on-card1-2", "Failed")
    apiserver.patch_pod(
        "default", "on-card0-3", {"metadata": {"annotations": {ANNOTATION_CARDS: "card3"}}}
    )
    apiserver.mark_pod_terminating("default", "tiled")
    held.release()
    paged.wait_synced()
    # The list ended at its snapshot, and the watch started there.
    assert first_pod_watch_version(apiserver) == str(snapshot)

    whole = start(0)
    whole.wait_synced()
    wait_same(paged, whole)
    ledger, facts = paged.view()
    names = {pod["name"] for pod in ledger["pods"].values()}
    assert "zz-new" in names and "other-0" not in names and "on-card1-2" not in names
    moved = next(p for p in ledger["pods"].values() if p["name"] == "on-card0-3")
    assert moved["cards"] == [["card3"]]
    assert next(f for f in facts.values() if f.name == "tiled").deleting
    assert paged.counter("gas_ledger_rebuilds_total") == 1


def test_a_continue_token_expired_mid_list_starts_the_list_over(
    apiserver: ApiServerDouble, start: StartSynced, caplog: pytest.LogCaptureFixture
) -> None:
    populate(apiserver)
    # The second page is answered 410 Expired, once.
    apiserver.faults.add("GET", f"^{PODS}$", ("status", 410), query_regex="continue=")
    caplog.set_level(logging.WARNING, logger="gas.cluster.kube")
    paged = synced_like_one_list(start)

    lists = [query for query in pod_lists(apiserver) if query.get("limit") == "3"]
    firsts = [index for index, query in enumerate(lists) if "continue" not in query]
    assert firsts == [0, 2]  # page 1, a 410 for page 2, then page 1 again
    assert paged.counter("gas_list_restarts_total", resource="pods") == 1
    assert paged.counter("gas_ledger_rebuilds_total") == 1  # only the whole list applied
    assert "pods list expired with 1 of its pages read" in caplog.text


def test_a_list_expired_twice_is_read_in_one_request(
    apiserver: ApiServerDouble, start: StartSynced, caplog: pytest.LogCaptureFixture
) -> None:
    # Every continue answered 410: paging alone would never finish.
    populate(apiserver)
    apiserver.faults.add("GET", f"^{PODS}$", ("status", 410), query_regex="continue=", times=None)
    caplog.set_level(logging.WARNING, logger="gas.cluster.kube")
    paged = synced_like_one_list(start)

    limits = [query.get("limit") for query in pod_lists(apiserver)]
    # Page 1, a 410; page 1, a 410; then the whole list (and the second gas's own).
    assert limits == ["3", "3", "3", "3", None, None]
    assert paged.counter("gas_list_restarts_total", resource="pods") == 2
    assert "pods list expired with 1 of its pages read" in caplog.text
    assert "listing again from the start in one request" in caplog.text


def test_a_list_whose_snapshot_is_compacted_mid_way_starts_over_from_the_new_state(
    apiserver: ApiServerDouble, start: StartSynced
) -> None:
    paged, held = start_held_at_the_second_page(apiserver, start)
    apiserver.add_pod(bound_pod("during", "n4", "card1", container(i915="1")))
    apiserver.compact()  # the double answers the held page 410 Expired, as etcd would
    held.release()
    paged.wait_synced()
    assert paged.counter("gas_list_restarts_total", resource="pods") == 1
    assert "during" in {p["name"] for p in paged.ledger.snapshot()["pods"].values()}
    whole = start(0)
    whole.wait_synced()
    wait_same(paged, whole)


def test_a_relist_keeps_the_old_ledger_until_its_last_page(
    apiserver: ApiServerDouble, start: StartSynced
) -> None:
    populate(apiserver)
    paged = start(3)
    paged.wait_synced()
    before = paged.view()

    # gas's pod watch is cut; its resumption waits in the double while a pod goes and the
    # history is compacted, so it is answered 410 Gone and gas relists.
    resume = apiserver.faults.add("GET", f"^{PODS}$", ("hold", None), query_regex="watch=")
    second_page = apiserver.faults.add("GET", f"^{PODS}$", ("hold", None), query_regex="continue=")
    cut_connections(apiserver)
    wait_for(lambda: resume.hits == 1, what="gas to resume its watch")
    apiserver.delete_pod("default", "on-card0-0")
    apiserver.compact()
    resume.release()
    wait_for(lambda: second_page.hits == 1, what="the relist's second page")
    # Mid-relist gas still answers, from the whole of the old list.
    assert paged.cluster.synced()
    assert paged.view() == before
    second_page.release()
    wait_for(
        lambda: len(paged.ledger.snapshot()["pods"]) == len(before[0]["pods"]) - 1,
        what="the relist to be applied",
    )
    assert paged.counter("gas_ledger_rebuilds_total") == 2
    whole = start(0)
    whole.wait_synced()
    wait_same(paged, whole)


# ------------------------------------------------------------------ gas serve


StartGas = Callable[..., GasProcess]
MANY = 2 * LIST_PAGE_SIZE + 100  # three pages


def populate_many(apiserver: ApiServerDouble) -> None:
    for index in range(20):
        apiserver.add_node(gpu_node(f"n{index:02d}", "0.1.2.3", i915="400", memory_max="400Gi"))
    gpu = container(i915="1", memory_max="1Gi")
    for index in range(MANY):
        card = f"card{index % 4}"
        apiserver.add_pod(bound_pod(f"p{index:04d}", f"n{index % 20:02d}", card, gpu))


def test_gas_serve_lists_in_pages_and_watches_what_changed_between_them(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    populate_many(apiserver)
    held = apiserver.faults.add("GET", f"^{PODS}$", ("hold", None), query_regex="continue=")
    gas = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    wait_for(lambda: held.hits == 1, timeout=30, what="gas to ask for the second page")
    gas.wait_status("/readyz", 503)  # not synced from half a list
    apiserver.delete_pod("default", "p0001")  # on the first page
    apiserver.delete_pod("default", "p1050")  # on the third
    apiserver.add_pod(bound_pod("p9999", "n00", "card3", container(i915="1")))
    apiserver.set_pod_phase("default", "p0700", "Succeeded")
    held.release()
    gas.wait_ready()

    assert [q.get("limit") for q in pod_lists(apiserver)] == [str(LIST_PAGE_SIZE)] * 3
    assert_consistent(gas, apiserver)
    names = {p["name"] for p in ledger_of(gas)["pods"].values()}
    assert len(names) == MANY - 2 and "p9999" in names and "p0700" not in names


def test_gas_serve_starts_an_expired_list_over_and_counts_it(
    apiserver: ApiServerDouble, start_gas: StartGas, kubeconfig: str, tls_files: TLSFiles
) -> None:
    populate_many(apiserver)
    apiserver.faults.add("GET", f"^{PODS}$", ("status", 410), query_regex="continue=")
    gas = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    gas.wait_ready()
    assert_consistent(gas, apiserver)
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    assert metric(text, "gas_list_restarts_total", resource="pods") == 1
    assert metric(text, "gas_ledger_rebuilds_total") == 1
    assert "pods list expired with 1 of its pages read" in gas.log()
    assert len(pod_lists(apiserver)) == 5  # page 1, a 410 for page 2, then pages 1 to 3
