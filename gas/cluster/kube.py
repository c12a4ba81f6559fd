"""The Kubernetes side: list+watch of nodes and pods into the ledger, the Binding, and the
deschedule label patches (gas/deschedule.py decides them; this module sends them).

Objects are read as plain JSON, through gas/kubeapi/ rather than the client's generated API
classes and models: the ledger wants the wire shape, model deserialisation would cost more
than everything else at tens of thousands of pods, and merely importing `CoreV1Api` costs
the worker 21 MiB. Lists are read in pages, each reduced to what gas keeps before the next
is read, and applied once, after the last.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import orjson
from kubernetes import client, config

from gas.cluster.counters import SyncCounters
from gas.cluster.deschedule import Descheduler, PatchRejected, PodFacts, PodGone, pod_facts
from gas.cluster.protocol import BindRejected, BindUncertain, ClusterError
from gas.core.holdings import PodObservation, observe_pod
from gas.core.ledger import Ledger
from gas.core.model import ANNOTATION_CARDS, NodeGpu, node_from_object
from gas.kubeapi.core import MERGE_PATCH, RawCoreV1Api, status_message
from gas.kubeapi.events import EventSender, event_body
from gas.kubeapi.paging import PAGE_SIZE, ListRestart, NotAList, list_pages
from gas.kubeapi.prepared import PreparedApi

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
"""Server-side watch length; the watch is then resumed from the last resourceVersion."""
LIST_PAGE_SIZE = PAGE_SIZE
"""Objects per list request (`limit`, 500), as client-go's reflector pages its lists (the
paging of gas/kubeapi/paging.py, `gas inspect`'s too): a page of pods is parsed, reduced
and freed before the next is read, so a list of 50,000 never lies parsed in memory at once
(and leaves no heap fragmented by it). 0 lists in one request."""
LIST_TIMEOUT = (5, 60)
"""Connect and read timeouts of one page of a list."""
BIND_TIMEOUT = (3.0, 8.0)
"""Connect and read timeouts of the Binding write: inside the scheduler's httpTimeout."""
READ_TIMEOUT = (3.0, 5.0)
"""Connect and read timeouts of a pod read (a bind of a pod the filter did not keep)."""
PATCH_TIMEOUT = (3.0, 10.0)
"""Connect and read timeouts of a deschedule label patch (background work, retried)."""
_TRANSIENT = frozenset({408, 409, 429})
"""Client-error statuses worth retrying: timeout, conflict, throttling."""


def load_api_client(kubeconfig: str | None) -> client.ApiClient:
    """The kubeconfig file when one is named, else the in-cluster configuration."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        log.info("using Kubernetes configuration from %s", kubeconfig)
    else:
        config.load_incluster_config(client_configuration=configuration)
        log.info("using in-cluster Kubernetes configuration")
    return client.ApiClient(configuration)


def in_cluster() -> bool:
    try:
        config.load_incluster_config(client_configuration=client.Configuration())
    except config.ConfigException:
        return False
    return True


class ListSink(Protocol):
    """Takes one list page by page, keeping only what gas needs of each object; applies
    it all at once after the last page (gas never answers from a half-listed cluster)."""

    def page(self, items: list[dict[str, Any]]) -> None: ...

    def done(self, listed_at: float) -> None:
        """The last page is in; the list's first request began at `listed_at`."""


class _Reflector(threading.Thread):
    """Keeps one kind of object in step with the API server, as client-go's reflector does:
    list (in pages of `page_size`), then watch from the list's resourceVersion; when a
    watch ends or its stream breaks, watch again from the last version seen; relist only on
    410 Gone. A list whose continue token expired mid-way is started over (and counted).
    Requests that fail back off exponentially (up to 8 s) and mark the cluster not synced
    until one succeeds again."""

    BASE_DELAY = 0.2
    # Kept short: while gas is not synced every GPU pod waits, so once the API server is
    # back gas should notice within seconds; one list attempt per resource every 8 s
    # costs an API server that is down nothing.
    MAX_DELAY = 8.0

    def __init__(
        self,
        kind: str,
        call: Callable[..., Any],
        new_list: Callable[[], ListSink],
        on_event: Callable[[str, dict[str, Any]], None],
        on_health: Callable[[], None],
        metrics: SyncCounters,
        stop: threading.Event,
        settle_heap: bool = False,
        page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        super().__init__(name=f"reflector-{kind}", daemon=True)
        self._settle_heap = settle_heap
        self._metrics = metrics
        self.kind = kind
        self._call = call
        self._new_list = new_list
        self._on_event = on_event
        self._on_health = on_health
        self._stop_event = stop
        self._page_size = page_size
        self.healthy = False
        self.lists = 0
        self.watch_restarts = 0
        self._response: Any = None
        self._version: str | None = None

    def run(self) -> None:
        delay = self.BASE_DELAY
        while not self._stop_event.is_set():
            try:
                if self._version is None:
                    self._version = self._list()
                self._watch()
                delay = self.BASE_DELAY
            except _Expired:
                log.info("%s watch expired (410 Gone): relisting", self.kind)
                self._version = None
                continue
            except Exception as exc:
                if self._stop_event.is_set():
                    break
                if isinstance(exc, _StreamBroken):
                    # The stream broke after the API server accepted it: resume at once.
                    log.info("%s watch stream broke (%s); resuming", self.kind, exc)
                    delay = self.BASE_DELAY
                else:
                    self._set_health(False)
                    log.warning("%s sync failed (%s); retrying in %.1fs", self.kind, exc, delay)
                    self._stop_event.wait(delay * random.uniform(0.8, 1.2))
                    delay = min(delay * 2, self.MAX_DELAY)
                    continue
            self.watch_restarts += 1
            self._metrics.watch_restarts.labels(self.kind).inc()
            # A short pause, so a server that ends every watch at once is not hammered.
            self._stop_event.wait(self.BASE_DELAY * random.uniform(0.5, 1.0))

    def close(self) -> None:
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def _list(self) -> str:
        with _heap_settled(self._settle_heap):
            sink: ListSink | None = None
            version: str | None = None
            count = 0
            started = 0.0
            pages = list_pages(
                self._call,
                page_size=self._page_size,
                timeout=LIST_TIMEOUT,
                on_restart=self._list_restarted,
            )
            try:
                for page in pages:
                    if page.first or sink is None:
                        # A list (re)started: what the sink took of an expired one goes too.
                        sink = self._new_list()
                        version, started, count = page.version, page.started, 0
                    count += len(page.items)
                    sink.page(page.items)
                    # Freed before the next page is read: only what the sink kept stays.
                    del page
            except NotAList as exc:
                raise ClusterError(f"listing {self.kind}: {exc}") from exc
            if sink is None or version is None:
                raise ClusterError(f"listing {self.kind}: the API server gave no resourceVersion")
            sink.done(started)
        self.lists += 1
        log.info("listed %d %s at resourceVersion %s", count, self.kind, version)
        return version

    def _list_restarted(self, restart: ListRestart) -> None:
        # The snapshot the pages were read at was compacted away (gas/kubeapi/paging.py).
        self._metrics.list_restarts.labels(self.kind).inc()
        log.warning("%s %s", self.kind, restart)

    def _watch(self) -> None:
        """Follow one watch until it ends; _StreamBroken if it breaks once accepted."""
        response = self._call(
            watch=True,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(5, WATCH_SECONDS + 30),
        )
        self._response = response
        self._set_health(True)
        try:
            for event in _json_lines(response):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise _StreamBroken(f"watch error: {obj.get('message')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_event(kind, obj)
                # Only after the event is applied: a crash above replays it on resume.
                if rv:
                    self._version = str(rv)
        except (_Expired, _StreamBroken):
            raise
        except Exception as exc:
            raise _StreamBroken(str(exc) or type(exc).__name__) from exc
        finally:
            self._response = None
            response.release_conn()

    def _set_health(self, healthy: bool) -> None:
        if healthy != self.healthy:
            self.healthy = healthy
            self._on_health()


@contextlib.contextmanager
def _heap_settled(settle: bool) -> Iterator[None]:
    """Around a large list (tens of thousands of pods): no collection while its pages are
    parsed and reduced and the list is applied, then one full collection and every
    surviving object frozen.

    What gas keeps of the list is hundreds of thousands of objects, all alive until the
    list is applied, and each page's parsed objects go by reference counting, so
    collecting during it only costs time. Once applied, what survives is long-lived: left
    in the collector's oldest generation, each full collection would go over all of it
    (250-330 ms at 50,000 pods, stalling every request). Frozen, collections skip it;
    objects freed later still go by reference counting. Frozen objects are unfrozen at the
    next large list, so its full collection also finds whatever of them became cyclic
    garbage.
    """
    if not settle:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        gc.unfreeze()
        yield
    finally:
        if was_enabled:
            gc.enable()
    gc.collect()
    gc.freeze()


class _Expired(Exception):
    pass


class _StreamBroken(Exception):
    """A watch stream that the API server had accepted ended abnormally."""


def _json_lines(response: Any) -> Iterator[dict[str, Any]]:
    """A watch's events: one JSON object a line, blank lines skipped, a last line taken
    without its newline.

    The API server writes each event as one chunk of a chunked body, so a chunk is read
    whole and split here. urllib3's line iterator, used before, reads chunks through its
    generic stream in 64 KiB pieces and joins and splits every piece again: 3-6 us more
    of the 30-65 us an event's reading and parsing cost (benchmarks/kubewire.py's pods, one
    event a wake-up or many). A body that is not chunked is read in the pieces that
    iterator reads it in (a read of `None` would wait for its end).
    """
    if response.chunked and response.supports_chunked_reads():
        blocks = response.read_chunked(None, decode_content=True)
    else:
        blocks = response.stream(decode_content=True)
    pending = b""
    for block in blocks:
        lines = block.split(b"\n")
        if pending:
            lines[0] = pending + lines[0]
        pending = lines.pop()
        for line in lines:
            line = line.strip()
            if line:
                yield orjson.loads(line)
    pending = pending.strip()
    if pending:
        yield orjson.loads(pending)


class _PendingSweeper(threading.Thread):
    """Settles PENDING entries older than the ledger's grace (binds whose outcome was
    unknown and that the watch has not resolved: the pod was deleted before the Binding
    could land, or kube-scheduler never retried it) by reading each pod afresh."""

    def __init__(
        self,
        ledger: Ledger,
        get_pod: Callable[[str, str], dict[str, Any] | None],
        metrics: SyncCounters,
        stop: threading.Event,
    ) -> None:
        super().__init__(name="pending-sweeper", daemon=True)
        self._ledger = ledger
        self._get_pod = get_pod
        self._metrics = metrics
        self._stop_event = stop
        # Often enough that a stale entry lives at most a third longer than the grace.
        self.interval = min(max(ledger.pending_grace / 3, 0.2), 30.0)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.sweep()
            except Exception:
                log.exception("settling uncertain binds failed; retrying")

    def sweep(self) -> int:
        released = 0
        for stale in self._ledger.stale_pending():
            try:
                pod = self._get_pod(stale.namespace, stale.name)
            except ClusterError as exc:
                log.debug(
                    "cannot settle the bind of %s/%s yet: %s", stale.namespace, stale.name, exc
                )
                continue
            verdict = pending_verdict(pod, stale.uid)
            if verdict is None or not self._ledger.settle_pending(stale):
                continue
            released += 1
            self._metrics.pending_released.labels(verdict).inc()
            log.warning(
                "released the cards held for %s/%s (uid %s) on %s: its bind's outcome was "
                "unknown and %.0fs later the pod is %s",
                stale.namespace,
                stale.name,
                stale.uid,
                stale.node,
                self._ledger.pending_grace,
                verdict,
            )
        return released


def pending_verdict(pod: Mapping[str, Any] | None, uid: str) -> str | None:
    """Why a stale uncertain bind of pod `uid` no longer holds cards, given a fresh read of
    the pod; None when the pod shows gas's binding (the watch will confirm it)."""
    if pod is None:
        return "deleted"
    metadata = pod.get("metadata") or {}
    if metadata.get("uid") != uid:
        return "deleted"  # a namesake replaced it
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    if not (pod.get("spec") or {}).get("nodeName"):
        return "not bound"
    if ANNOTATION_CARDS not in (metadata.get("annotations") or {}):
        return "bound by another binder"
    return None


class KubeCluster:
    """A real cluster through the official client."""

    def __init__(
        self,
        ledger: Ledger,
        api_client: client.ApiClient,
        metrics: SyncCounters | None = None,
        list_page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        self._ledger = ledger
        self._metrics = metrics or SyncCounters()
        self._core = RawCoreV1Api(api_client)
        self._api = PreparedApi(api_client)
        self._stop = threading.Event()
        # At debug level: the extender's Events are a courtesy, and an API server that
        # refuses them shows in its other calls' logs.
        self._events = EventSender(self._post_event, self._stop, failure_level=logging.DEBUG)
        self._host = socket.gethostname()
        self._was_synced = False
        self._descheduler = Descheduler(self._patch_pod, self._stop)
        self._sweeper = _PendingSweeper(ledger, self.get_pod, self._metrics, self._stop)
        self._reflectors = [
            _Reflector(
                "nodes",
                self._core.list_node,
                lambda: _NodeList(self._ledger, self._descheduler),
                self._node_event,
                self._health_changed,
                self._metrics,
                self._stop,
                page_size=list_page_size,
            ),
            _Reflector(
                "pods",
                self._core.list_pod_for_all_namespaces,
                lambda: _PodList(self._ledger, self._descheduler, self._metrics),
                self._pod_event,
                self._health_changed,
                self._metrics,
                self._stop,
                settle_heap=True,
                page_size=list_page_size,
            ),
        ]

    # ------------------------------------------------------------ Cluster protocol

    def start(self) -> None:
        self._events.start()
        self._descheduler.start()
        self._sweeper.start()
        for reflector in self._reflectors:
            reflector.start()

    def stop(self) -> None:
        self._stop.set()
        self._descheduler.wake()
        for reflector in self._reflectors:
            reflector.close()

    def synced(self) -> bool:
        return all(r.healthy for r in self._reflectors)

    @property
    def descheduler(self) -> Descheduler:
        """The deschedule controller the watch feeds (its view: `facts()`)."""
        return self._descheduler

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        where = f"reading pod {namespace}/{name}"
        try:
            reply = self._api.read_namespaced_pod(name, namespace, READ_TIMEOUT)
        except Exception as exc:
            raise ClusterError(f"{where}: {exc}") from exc
        if reply.status == 404:
            return None
        if not reply.ok:
            raise ClusterError(f"{where}: {status_message(reply.status, reply.reason, reply.data)}")
        try:
            pod = orjson.loads(reply.data)
        except orjson.JSONDecodeError as exc:
            raise ClusterError(f"{where}: the API server answered no JSON: {exc}") from exc
        if not isinstance(pod, dict):
            raise ClusterError(f"{where}: the API server answered no object")
        return pod

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
        # Prepared JSON over the client's kept-alive pool, no model: gas/kubeapi/prepared.py.
        metadata = pod.get("metadata") or {}
        name, namespace = str(metadata.get("name")), str(metadata.get("namespace"))
        binding_meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "annotations": dict(annotations),
        }
        uid = metadata.get("uid")
        if uid:
            binding_meta["uid"] = uid  # a precondition: never bind a namesake
        body = orjson.dumps(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": binding_meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
        )
        where = f"binding {namespace}/{name} to {node}"
        try:
            reply = self._api.create_namespaced_pod_binding(name, namespace, body, BIND_TIMEOUT)
        except Exception as exc:
            raise BindUncertain(f"{where}: {exc}") from exc
        if reply.ok:
            return
        message = f"{where}: {status_message(reply.status, reply.reason, reply.data)}"
        if 400 <= reply.status < 500 and reply.status != 429:
            raise BindRejected(message)
        raise BindUncertain(message)

    def record_event(
        self, pod: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        metadata = pod.get("metadata") or {}
        involved = {
            "kind": "Pod",
            "name": metadata.get("name"),
            "namespace": str(metadata.get("namespace") or "default"),
            "uid": metadata.get("uid"),
        }
        self._events.send(
            event_body(involved, event_type, reason, message, component="gas", instance=self._host)
        )

    def _patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        # A JSON merge patch, never a JSON patch: it needs no labels map to exist, removing
        # an absent label is no error, and no `force` (which only apply patches accept).
        try:
            response = self._core.patch_namespaced_pod(
                name, namespace, patch, _content_type=MERGE_PATCH, _request_timeout=PATCH_TIMEOUT
            )
        except client.ApiException as exc:
            message = _api_message(exc)
            # 422: the UID in the patch no longer matches, so the pod was replaced.
            if exc.status in (404, 410, 422):
                raise PodGone(message) from exc
            if exc.status is not None and 400 <= exc.status < 500 and exc.status not in _TRANSIENT:
                raise PatchRejected(message) from exc
            raise ClusterError(message) from exc
        # Read to the end, so the connection goes back to the pool clean for the next patch.
        response.drain_conn()
        response.release_conn()

    def _post_event(self, namespace: str, event: dict[str, Any]) -> None:
        # Prepared JSON on the kept-alive pool, as the Binding: the reply is read whole, so
        # the connection goes back to the pool.
        reply = self._api.create_namespaced_event(namespace, orjson.dumps(event), (3, 5))
        if not reply.ok:
            raise ClusterError(f"event not created: {reply.status} {reply.reason}")

    # ------------------------------------------------------------ watch callbacks

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        node = node_from_object(obj)
        if kind == "DELETED":
            self._ledger.remove_node(node.name)
            self._descheduler.node_removed(node.name)
        else:
            self._ledger.set_node(node)
            self._descheduler.node_changed(node)

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._descheduler.pod_removed(obj)
        else:
            self._descheduler.pod_changed(obj)
        observation = observe_pod(obj)
        if observation is None:
            return
        if kind == "DELETED":
            self._ledger.forget(observation.uid)
        else:
            self._ledger.observe(observation)

    def _health_changed(self) -> None:
        synced = self.synced()
        if synced != self._was_synced:
            self._was_synced = synced
            log.info("cluster sync %s", "ready" if synced else "lost: not ready")


class _NodeList:
    """A node list: each node read as gas sees it as its page comes in."""

    def __init__(self, ledger: Ledger, descheduler: Descheduler) -> None:
        self._ledger = ledger
        self._descheduler = descheduler
        self._nodes: list[NodeGpu] = []

    def page(self, items: list[dict[str, Any]]) -> None:
        self._nodes.extend(map(node_from_object, items))

    def done(self, listed_at: float) -> None:
        self._ledger.replace_nodes(self._nodes)
        self._descheduler.nodes_listed(self._nodes)


class _PodList:
    """A pod list: each pod reduced, as its page comes in, to what the ledger and the
    deschedule controller keep of it, so the page's parsed objects can go."""

    def __init__(self, ledger: Ledger, descheduler: Descheduler, metrics: SyncCounters) -> None:
        self._ledger = ledger
        self._descheduler = descheduler
        self._metrics = metrics
        self._observations: list[PodObservation] = []
        self._facts: list[PodFacts] = []

    def page(self, items: list[dict[str, Any]]) -> None:
        observations, facts = self._observations, self._facts
        for item in items:
            observation = observe_pod(item)
            if observation is not None:
                observations.append(observation)
            fact = pod_facts(item)
            if fact is not None:
                facts.append(fact)

    def done(self, listed_at: float) -> None:
        self._ledger.replace_pods(self._observations, listed_at)
        self._metrics.ledger_rebuilds.inc()
        self._descheduler.pods_listed(self._facts)


def _api_message(exc: client.ApiException) -> str:
    return status_message(exc.status, exc.reason, exc.body)
