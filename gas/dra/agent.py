"""`gas dra`: the DRA driver, one per GPU node (instead of `gas node`).

It finds the node's cards with the discovery both agents share (`gas.host`), publishes
them in the node's ResourceSlice with their health, serves the kubelet's DRA and device
health calls, and writes what each prepare decided into its claim's status. Its own
state (the prepared claims, the cards seen) is in `--state-dir`, shared under a lock with
the other `gas dra` of a rolling update.

Threads: the card watcher (udev events or rescans), the health check (every
`--health-interval`), the watches of the Node and of the driver's slices, the slice
publishing, the claim status writer, the gRPC servers, the metrics and liveness port.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gas.dra.claim_status import ClaimStatusWriter
from gas.dra.claims import ClaimError
from gas.dra.driver import DRIVER, dra_socket, registration_socket
from gas.dra.files import StateStore
from gas.dra.health_service import HealthFeed
from gas.dra.inventory import Device, Inventory
from gas.dra.metrics import DraMetrics
from gas.dra.plugin import DraService, KubeletPlugin, SocketTaken
from gas.dra.preparer import ObjectReader, Preparer
from gas.dra.publish import SlicePublisher, View
from gas.dra.publishing import Publishing
from gas.dra.state import StateError
from gas.host import discovery
from gas.host.cards import Card
from gas.host.containers import Holder, holders
from gas.host.errors import NodeError
from gas.host.health import card_health
from gas.host.kubeapi import API_TIMEOUT, core_api
from gas.host.overuse_calls import event_sender
from gas.host.sockets import describe, listener
from gas.host.usage_watch import UsageWatch, watch_usage
from gas.host.watch import card_watcher
from gas.kubeapi.core import RawCoreV1Api, status_message
from gas.kubeapi.dra import RawResourceV1Api
from gas.kubeapi.reflector import Objects

log = logging.getLogger(__name__)


def object_reader(kind: str, call: Callable[..., Any]) -> ObjectReader:
    """`read(namespace, name)` of one kind through a client method; ClaimError saying why
    it cannot be read."""

    def read(namespace: str, name: str) -> Mapping[str, Any]:
        what = f"{kind} {namespace}/{name}"
        try:
            response = call(name, namespace, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimError(f"{what} not found") from None
            message = status_message(exc.status, exc.reason, exc.body)
            raise ClaimError(f"cannot read {what}: {message}") from None
        except (HTTPError, OSError) as exc:
            raise ClaimError(f"cannot reach the API server to read {what}: {exc}") from None
        found = json.loads(response.data)
        if not isinstance(found, dict):
            raise ClaimError(f"{what}: the API server sent no object")
        return found

    return read


def _view(node: Objects, slices: Objects, name: str) -> Callable[[], View | None]:
    def view() -> View | None:
        if not (node.synced and slices.synced):
            return None
        found = node.objects().get(name)
        return None if found is None else View(found, list(slices.objects().values()))

    return view


class _Cards:
    """Discovery's cards into the inventory, and the inventory's into the preparer."""

    def __init__(self, inventory: Inventory, preparer: Preparer) -> None:
        self.inventory = inventory
        self.preparer = preparer

    def discovered(self, cards: list[Card]) -> bool:
        held, _ = self.preparer.held_cards()
        self.inventory.update(cards, held)
        return True

    def failed(self) -> None:
        held, _ = self.preparer.held_cards()
        self.inventory.update(None, held)

    def refresh(self) -> None:
        held, _ = self.preparer.held_cards()
        self.inventory.refresh(held)

    def apply(self, devices: Mapping[str, Device]) -> None:
        present = [d.card for d in devices.values() if d.present]
        gone = {n: d.health.message for n, d in devices.items() if not d.present}
        self.preparer.set_cards(present, gone)


def run(args: argparse.Namespace) -> int:
    node = args.node_name
    if not node:
        log.error("no node name: give --node-name or set NODE_NAME")
        return 2
    try:
        discover = discovery.discoverer(args)
        core = core_api(args.kubeconfig)
    except (ValueError, NodeError) as exc:
        log.error("%s", exc)
        return 2 if isinstance(exc, ValueError) else 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.pod_uid and not _wait_for_single_instance(args.kubelet_root_dir, stop):
        return 0
    parts = _assemble(args, node, core, stop)
    if isinstance(parts, int):
        return parts
    return _serve(args, node, parts, discover, stop)


@dataclass
class _Parts:
    """The driver's pieces, wired to each other, none started."""

    metrics: DraMetrics
    writer: ClaimStatusWriter
    preparer: Preparer
    inventory: Inventory
    cards: _Cards
    feed: HealthFeed
    publishing: Publishing
    threads: list[threading.Thread]
    """Started once the sockets serve: the watches, publishing, the status writer, the
    usage watch and its helpers."""
    usage: UsageWatch | None


def _assemble(
    args: argparse.Namespace, node: str, core: RawCoreV1Api, stop: threading.Event
) -> _Parts | int:
    resources = RawResourceV1Api(core.api_client)
    metrics = DraMetrics()
    writer = ClaimStatusWriter(
        resources, stop, lambda result: metrics.status_writes.labels(result).inc()
    )
    store = StateStore(args.state_dir)
    preparer = Preparer(
        node,
        object_reader("ResourceClaim", resources.read_namespaced_resource_claim),
        object_reader("Pod", core.read_namespaced_pod),
        store,
        args.cdi_dir,
        args.devfs_root,
        on_prepared=writer.prepared,
    )
    try:
        preparer.restore()
    except (OSError, StateError) as exc:
        log.error("not starting: the prepared claims cannot be read from %s: %s", store.path, exc)
        return 1
    sysfs_root = args.sysfs_root or "/sys"
    inventory = Inventory(
        args.state_dir,
        lambda card, present, wedged: card_health(sysfs_root, card, present, wedged),
    )
    node_watch, slice_watch = _reflectors(
        core, resources, node, stop, on_change=lambda: publishing.trigger()
    )
    publisher = SlicePublisher(
        core, resources, node, args.unhealthy_taint_effect, _view(node_watch, slice_watch, node)
    )
    publishing = Publishing(
        publisher,
        inventory,
        lambda: preparer.held_cards()[1],
        sysfs_root,
        metrics,
        stop,
        resync=args.slice_resync,
    )
    cards, feed = _Cards(inventory, preparer), HealthFeed(node)
    inventory.listen(cards.apply)
    inventory.listen(feed.update)
    inventory.listen(lambda devices: _count_health(metrics, devices))
    inventory.listen(lambda devices: publishing.trigger())
    threads: list[threading.Thread] = [writer, node_watch, slice_watch, publishing]
    sender, pods = event_sender(core, stop), _pods(core, node, stop)
    usage = watch_usage(
        args,
        core=core,
        node=node,
        component="gas-dra",
        cards=lambda: [d.card for d in inventory.devices().values() if d.present],
        holder=_holder(pods),
        registry=metrics.registry,
        sender=sender,
        stop=stop,
        environment=True,
    )
    if usage is not None:
        threads += [sender, pods, usage]
    return _Parts(metrics, writer, preparer, inventory, cards, feed, publishing, threads, usage)


def _serve(
    args: argparse.Namespace,
    node: str,
    parts: _Parts,
    discover: Callable[[], list[Card]],
    stop: threading.Event,
) -> int:
    def discover_or_say() -> list[Card]:
        try:
            return discover()
        except (NodeError, OSError):
            parts.cards.failed()
            raise

    on_card = _udev(parts.inventory, parts.cards.refresh)
    watcher = card_watcher(args, discover_or_say, parts.cards.discovered, stop, on_card=on_card)
    watcher.check()  # the cards are known before the kubelet can ask for one
    plugin = KubeletPlugin(
        dra_socket(args.kubelet_root_dir, args.pod_uid),
        registration_socket(args.kubelet_root_dir, args.pod_uid),
        DraService(parts.preparer, parts.metrics, on_unprepared=parts.writer.unprepared),
        parts.feed,
        lambda: parts.publishing.trigger(direct=True),
    )
    if args.metrics_port:
        answer = None if parts.usage is None else parts.usage.answer(node)
        parts.metrics.serve(args.metrics_port, args.metrics_host, live=plugin.probe, usage=answer)
    try:
        plugin.start()
    except SocketTaken as exc:
        log.error("not starting: %s", exc)
        plugin.stop()
        return 1
    health = (parts.inventory, parts.preparer, args.health_interval, stop)
    threads = [
        *parts.threads,
        threading.Thread(target=watcher.run, args=(stop.is_set,), name="card-watcher", daemon=True),
        threading.Thread(target=_health_loop, args=health, name="card-health", daemon=True),
    ]
    for thread in threads:
        thread.start()
    parts.publishing.trigger(direct=True)
    log.info(
        "gas dra on %s (%s): %d prepared claim(s) recorded",
        node,
        f"pod {args.pod_uid}" if args.pod_uid else "no pod UID",
        len(parts.preparer.state),
    )
    stop.wait()
    log.info("stopping")
    plugin.stop()
    parts.writer.close()
    for thread in threads:
        thread.join(timeout=5)
    if parts.writer.pending():
        log.warning("%d claim status write(s) left undone", parts.writer.pending())
    return 0


def _pods(core: RawCoreV1Api, node: str, stop: threading.Event) -> Objects:
    """The pods on this node, to name the containers whose GPU use is read."""
    return Objects(
        f"pods on {node}",
        core.list_pod_for_all_namespaces,
        {"field_selector": f"spec.nodeName={node}"},
        stop,
    )


def _holder(pods: Objects) -> Callable[[str, str], Holder | None]:
    def holder(pod_uid: str, container_id: str) -> Holder | None:
        for pod in pods.objects().values():
            if (pod.get("metadata") or {}).get("uid") == pod_uid:
                return holders(pod, extender=False).get(container_id)
        return None

    return holder


def _wait_for_single_instance(kubelet_root: str, stop: threading.Event) -> bool:
    """With a pod UID, wait while a gas dra without one serves on this node: a version
    from before the rolling updates (its pod being replaced by this one), which neither
    takes the state's lock nor reads the state again, and would hand out tiles this one
    records. It stops once this pod runs; False if this one was stopped first."""
    legacy = dra_socket(kubelet_root)
    said = False
    while not stop.is_set():
        answered, pid = listener(legacy)
        if not answered or pid == os.getpid():
            return True
        if not said:
            log.warning(
                "waiting for the gas dra serving %s (%s) to stop: it does not share the "
                "prepared claims' state with another instance",
                legacy,
                describe(pid),
            )
            said = True
        stop.wait(1.0)
    return False


def _reflectors(
    core: RawCoreV1Api,
    resources: RawResourceV1Api,
    node: str,
    stop: threading.Event,
    on_change: Callable[[], None],
) -> tuple[Objects, Objects]:
    """The watches of this node and of the driver's slices of it."""
    node_watch = Objects(
        "node", core.list_node, {"field_selector": f"metadata.name={node}"}, stop, on_change
    )
    slice_watch = Objects(
        "resourceslices",
        resources.list_resource_slice,
        {"field_selector": f"spec.driver={DRIVER},spec.nodeName={node}"},
        stop,
        on_change,
    )
    return node_watch, slice_watch


def _udev(inventory: Inventory, refresh: Callable[[], None]) -> Callable[[str, str, str], None]:
    """What a card's uevent tells the inventory: a wedged event marks it (and is judged at
    once), an add clears the mark."""

    def on_card(action: str, card: str, wedged: str) -> None:
        if action == "add":
            inventory.added(card)
        elif wedged:
            inventory.wedged(card, wedged)
            refresh()

    return on_card


def _count_health(metrics: DraMetrics, devices: Mapping[str, Device]) -> None:
    counts: dict[str, int] = {"Healthy": 0, "Unhealthy": 0, "Unknown": 0}
    for device in devices.values():
        counts[device.health.status] = counts.get(device.health.status, 0) + 1
    for status, count in counts.items():
        metrics.health.labels(status).set(count)


def _health_loop(
    inventory: Inventory, preparer: Preparer, interval: float, stop: threading.Event
) -> None:
    """Judge the cards again every `interval` seconds: a driver's health attributes change
    without a uevent."""
    while not stop.wait(interval):
        try:
            held, _ = preparer.held_cards()
            inventory.refresh(held)
        except Exception:  # the next round tries again
            log.exception("checking the cards' health failed")
