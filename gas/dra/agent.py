"""`gas dra`: the DRA driver, one per GPU node (instead of `gas node`).

It finds the node's cards with `gas node`'s discovery, publishes them in the node's
ResourceSlice, and serves the kubelet's DRA calls. Its own state (the prepared claims) is
in `--state-dir`; the slice is written again at every start, after every card change,
when the kubelet registers the driver (a starting kubelet deletes the node's slices) and
checked every half minute.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gas.dra.claims import ClaimError
from gas.dra.driver import dra_socket, registration_socket
from gas.dra.files import StateStore
from gas.dra.metrics import DraMetrics
from gas.dra.pcifacts import facts_of
from gas.dra.plugin import DraService, KubeletPlugin, SocketTaken
from gas.dra.preparer import Preparer
from gas.dra.publish import SlicePublisher
from gas.dra.state import StateError
from gas.kubeapi.core import status_message
from gas.kubeapi.dra import RawResourceV1Api
from gas.node import discovery
from gas.node.cards import Card
from gas.node.errors import NodeError
from gas.node.kubeapi import API_TIMEOUT, core_api, describe_api_error

log = logging.getLogger(__name__)

SLICE_CHECK = 30.0


def claim_reader(resources: RawResourceV1Api) -> Callable[[str, str], Mapping[str, Any]]:
    def read(namespace: str, name: str) -> Mapping[str, Any]:
        what = f"ResourceClaim {namespace}/{name}"
        try:
            response = resources.read_namespaced_resource_claim(
                name, namespace, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimError(f"{what} not found") from None
            message = status_message(exc.status, exc.reason, exc.body)
            raise ClaimError(f"cannot read {what}: {message}") from None
        except (HTTPError, OSError) as exc:
            raise ClaimError(f"cannot reach the API server to read {what}: {exc}") from None
        claim = json.loads(response.data)
        if not isinstance(claim, dict):
            raise ClaimError(f"{what}: the API server sent no object")
        return claim

    return read


class Publishing:
    """The slice written from the latest cards, one write at a time."""

    def __init__(
        self, publisher: SlicePublisher, sysfs_root: str, metrics: DraMetrics, node: str
    ) -> None:
        self.publisher = publisher
        self.sysfs_root = sysfs_root
        self.metrics = metrics
        self.node = node
        self.cards: list[Card] | None = None
        self._lock = threading.Lock()

    def publish(self, cards: list[Card] | None = None) -> bool:
        with self._lock:
            if cards is not None:
                self.cards = cards
            if self.cards is None:
                return False
            try:
                self.publisher.publish(self.cards, facts_of(self.sysfs_root, self.cards))
            except (ApiException, HTTPError, OSError, ValueError) as exc:
                log.error("ResourceSlice not written: %s", describe_api_error(exc, self.node))
                self.metrics.publishes.labels("error").inc()
                return False
            self.metrics.publishes.labels("ok").inc()
            self.metrics.cards.set(len(self.cards))
            self.metrics.generation.set(self.publisher.generation)
            return True


def _watcher(
    args: argparse.Namespace,
    discover: Callable[[], list[Card]],
    on_change: Callable[[list[Card]], bool],
    stop: threading.Event,
) -> discovery.CardWatcher:
    if args.sysfs_root is not None:

        def no_events(timeout: float | None) -> str | None:
            stop.wait(1.0 if timeout is None else timeout)
            return None

        return discovery.CardWatcher(
            discover, on_change, no_events, resync=args.rescan or 5.0, debounce=0.2
        )
    monitor = discovery.card_monitor()
    return discovery.CardWatcher(
        discover, on_change, discovery.udev_card_events(monitor), resync=args.rescan or 600.0
    )


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
    resources = RawResourceV1Api(core.api_client)
    store = StateStore(args.state_dir)
    try:
        preparer = Preparer(node, claim_reader(resources), store, args.cdi_dir, args.devfs_root)
        preparer.restore()
    except (OSError, StateError) as exc:
        log.error("not starting: the prepared claims cannot be read from %s: %s", store.path, exc)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = DraMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_host)
    publishing = Publishing(
        SlicePublisher(core, resources, node), args.sysfs_root or "/sys", metrics, node
    )

    def on_change(cards: list[Card]) -> bool:
        preparer.set_cards(cards)
        return publishing.publish(cards)

    watcher = _watcher(args, discover, on_change, stop)
    watcher.check()  # the cards are known before the kubelet can ask for one
    registered = threading.Event()
    plugin = KubeletPlugin(
        dra_socket(args.kubelet_root_dir),
        registration_socket(args.kubelet_root_dir),
        DraService(preparer, metrics),
        registered.set,
    )
    try:
        plugin.start()
    except SocketTaken as exc:
        log.error("not starting: %s", exc)
        plugin.stop()
        return 1
    watcher_thread = threading.Thread(
        target=watcher.run, args=(stop.is_set,), name="card-watcher", daemon=True
    )
    watcher_thread.start()
    log.info("gas dra on %s: %d prepared claim(s) recorded", node, len(preparer.state))
    checked = time.monotonic()
    while not stop.is_set():
        if registered.wait(timeout=0.5):
            registered.clear()
            publishing.publish()
            checked = time.monotonic()
        elif time.monotonic() - checked >= SLICE_CHECK:
            publishing.publish()
            checked = time.monotonic()
    log.info("stopping")
    plugin.stop()
    watcher_thread.join(timeout=5)
    return 0
