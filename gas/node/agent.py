"""`gas node`: the node agent, one per GPU node (a DaemonSet).

It finds the node's cards, keeps the node's labels and GPU capacity true to them, and runs
one kubelet device plugin per resource present (`gpu.intel.com/i915`, `gpu.intel.com/xe`)
that hands each container exactly the cards gas chose for it. Cards coming and going
(udev, or a rescan of `--sysfs-root`) update the advertised devices: a vanished card's
shares turn Unhealthy.

State lives in the kubelet (pod-resources) and the API server (pods on this node), so a
restart of the agent loses nothing.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gas.host import discovery
from gas.host.cards import Card
from gas.host.errors import NodeError
from gas.host.kubeapi import core_api
from gas.host.usage_watch import watch_usage
from gas.host.watch import card_watcher
from gas.kubeapi.core import RawCoreV1Api
from gas.kubeapi.events import EventSender
from gas.node.devices import cards_by_resource
from gas.node.handout import HandoutWriter
from gas.node.matcher import PodMatcher
from gas.node.metrics import NodeMetrics
from gas.node.plugin import DevicePlugin, Reporter
from gas.node.podapi import COMPONENT, NodeApi
from gas.node.podcache import PodCache
from gas.node.podresources import PodResourcesClient, PodResourcesError
from gas.node.publish import NodePublisher
from gas.node.registration import PluginServer
from gas.node.sockets import SocketTaken, check_plugin_sockets

log = logging.getLogger(__name__)

SYNC_WAIT = 30.0
RECONCILE_SECONDS = 30.0
"""How often `gas-node-cards` is compared with what the kubelet says pods hold."""


@dataclass
class Plugins:
    """The plugins by resource, and every card each has seen (a vanished card stays,
    Unhealthy, so the kubelet keeps the containers holding it accounted)."""

    make: Callable[[str, list[Card]], DevicePlugin]
    start: Callable[[DevicePlugin], None]
    by_resource: dict[str, DevicePlugin] = field(default_factory=dict)
    seen: dict[str, dict[str, Card]] = field(default_factory=dict)

    def update(self, cards: Sequence[Card]) -> None:
        present = cards_by_resource(cards)
        for resource in sorted(set(present) | set(self.seen)):
            now = {card.name: card for card in present.get(resource, [])}
            seen = self.seen.setdefault(resource, {})
            seen.update(now)
            every = sorted(seen.values(), key=lambda c: (c.number, c.name))
            gone = [name for name in seen if name not in now]
            plugin = self.by_resource.get(resource)
            if plugin is None:
                plugin = self.make(resource, every)
                self.by_resource[resource] = plugin
                self.start(plugin)
            plugin.set_cards(every, gone)


def _publisher(core: RawCoreV1Api, node: str, numa: bool) -> Callable[[list[Card]], bool]:
    """The node labels and capacity writer."""
    return NodePublisher(core, node, numa=numa).publish


def run(args: argparse.Namespace) -> int:
    node = args.node_name
    if not node:
        log.error("no node name: give --node-name or set NODE_NAME")
        return 2
    try:
        check_plugin_sockets(args.device_plugin_dir)
    except SocketTaken as exc:
        log.error("not starting: %s", exc)
        return 1
    try:
        discover = discovery.discoverer(args)
        core = core_api(args.kubeconfig)
    except (ValueError, NodeError) as exc:
        log.error("%s", exc)
        return 2 if isinstance(exc, ValueError) else 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    metrics = NodeMetrics()
    api = NodeApi(core, node)
    events = EventSender(api.create_event, stop)
    writer_stop = threading.Event()  # after the plugins, so the last writes are flushed
    writer = HandoutWriter(api, metrics, writer_stop)
    pod_resources = PodResourcesClient(args.pod_resources_socket)
    matcher: PodMatcher | None = None

    def removed(uid: str) -> None:
        writer.forget(uid)
        if matcher is not None:
            matcher.forget(uid)

    cache = PodCache(api, stop, on_removed=removed)
    seen_cards: list[Card] = []
    usage = watch_usage(
        args,
        core=core,
        node=node,
        component=COMPONENT,
        cards=lambda: seen_cards,
        holder=cache.holder,
        registry=metrics.registry,
        sender=events,
        stop=stop,
        environment=False,
    )
    if args.metrics_port:
        answer = None if usage is None else usage.answer(node)
        metrics.serve(args.metrics_port, args.metrics_host, usage=answer)
    matcher = PodMatcher(cache, pod_resources)
    reporter = Reporter(node, metrics, events, writer)
    for thread in (events, writer, cache, *([usage] if usage is not None else [])):
        thread.start()
    if not cache.wait_synced(SYNC_WAIT):
        log.warning("pods on %s not listed yet; serving anyway, requests wait for it", node)

    servers: list[PluginServer] = []

    def make(resource: str, cards: list[Card]) -> DevicePlugin:
        assert matcher is not None
        return DevicePlugin(
            resource, cards, args.shares_per_card, matcher, reporter, args.devfs_root
        )

    def start(plugin: DevicePlugin) -> None:
        server = PluginServer(plugin, args.device_plugin_dir, metrics, stop)
        servers.append(server)
        server.start()

    plugins = Plugins(make, start)
    publish = _publisher(core, node, args.numa)

    def on_change(cards: list[Card]) -> bool:
        seen_cards[:] = cards
        plugins.update(cards)
        return publish(cards)

    watcher = card_watcher(args, discover, on_change, stop)
    log.info("gas node on %s: %d shares per card", node, args.shares_per_card)
    watcher_thread = threading.Thread(
        target=watcher.run, args=(stop.is_set,), name="card-watcher", daemon=True
    )
    watcher_thread.start()
    delay = 1.0  # soon after a start, then now and then
    while not stop.wait(delay):
        _reconcile(writer, cache, pod_resources, matcher)
        delay = RECONCILE_SECONDS
    log.info("stopping")
    for plugin in plugins.by_resource.values():
        plugin.stop()  # ends the ListAndWatch streams at once
    watcher_thread.join(timeout=5)
    for server in servers:
        server.join(timeout=5)
        server.close()
    writer_stop.set()
    if not writer.flush(timeout=3.0):
        log.warning("%d gas-node-cards writes left undone", writer.pending())
    pod_resources.close()
    taken = [server.taken for server in servers if server.taken is not None]
    for conflict in taken:
        log.error("stopped: %s", conflict)
    return 1 if taken else 0


def _reconcile(
    writer: HandoutWriter, cache: PodCache, pod_resources: PodResourcesClient, matcher: PodMatcher
) -> None:
    try:
        listing = pod_resources.list()
    except PodResourcesError as exc:
        log.debug("no reconcile of gas-node-cards: %s", exc)
        return
    matcher.observe(listing)  # a pod listed now was listed before any that come later
    held = {
        key: {name: {i for ids in res.values() for i in ids} for name, res in containers.items()}
        for key, containers in listing.items()
    }
    count = writer.reconcile(cache.pods(), held)
    if count:
        log.info("gas-node-cards recorded afresh for %d pod(s)", count)
