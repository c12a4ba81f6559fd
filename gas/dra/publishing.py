"""When the node's slice is checked and written: one thread that does it whenever
something it depends on may have changed, and now and then besides.

Its triggers: the cards or their health change (`gas.dra.inventory`), a claim starts or
stops sharing a card (an exclusive label may now apply), the kubelet registers the driver
(a starting kubelet deletes the node's slices), and the watches of the Node and of the
driver's slices report any event (a label changed, the slice deleted or rewritten by
someone else). A burst of triggers makes one check, at least `SPACING` seconds after the
last; a check that fails is tried again with backoff. The check reads the watches' view;
every `resync` seconds it reads the API server directly instead, a safety net against a
watch that went quiet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gas.dra.inventory import Device, Inventory
from gas.dra.metrics import DraMetrics
from gas.dra.pcifacts import pci_facts
from gas.dra.publish import SlicePublisher
from gas.dra.slices import CardState, PciFacts
from gas.host.health import UNHEALTHY
from gas.host.kubeapi import describe_api_error

log = logging.getLogger(__name__)

SPACING = 0.5
RETRY_BASE = 1.0
RETRY_MAX = 60.0
DEFAULT_RESYNC = 600.0


class Publishing(threading.Thread):
    def __init__(
        self,
        publisher: SlicePublisher,
        inventory: Inventory,
        shared: Callable[[], Collection[str]],
        sysfs_root: str,
        metrics: DraMetrics,
        stop: threading.Event,
        resync: float = DEFAULT_RESYNC,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="slice-publishing", daemon=True)
        self.publisher = publisher
        self.inventory = inventory
        self.shared = shared
        self.sysfs_root = sysfs_root
        self.metrics = metrics
        self.resync = resync
        self._stop_event = stop
        self._clock = clock
        self._wake = threading.Event()
        self._direct = False
        self._asked = threading.Lock()
        """Guards `_direct` with `_wake`: a trigger sets both, a check takes both."""
        self._facts: dict[tuple[str, str], PciFacts] = {}
        self.published = threading.Event()
        """Set once the slice has been brought up to date."""
        self.checks = 0

    def trigger(self, direct: bool = False) -> None:
        """Check soon; `direct`: read the API server rather than the watches."""
        with self._asked:
            self._direct = self._direct or direct
            self._wake.set()

    def _states(self, devices: Mapping[str, Device]) -> list[CardState]:
        """Only an Unhealthy card is tainted: one of Unknown health (sysfs could not be read
        for a moment) keeps its pods, and the kubelet is told Unknown."""
        shared = set(self.shared())
        return [
            CardState(d.card, d.health.status != UNHEALTHY, d.health.reason, name in shared)
            for name, d in devices.items()
        ]

    def _facts_of(self, devices: Mapping[str, Device]) -> dict[str, PciFacts]:
        """A card's PCI facts, read once while it is present (an absent card keeps those
        read before)."""
        found = {}
        for name, device in devices.items():
            key = (name, device.card.pci_address)
            if key not in self._facts and device.present:
                self._facts[key] = pci_facts(self.sysfs_root, device.card)
            found[name] = self._facts.get(key, PciFacts())
        return found

    def check(self, direct: bool = False) -> bool:
        devices = self.inventory.devices()
        self.checks += 1
        try:
            self.publisher.publish(self._states(devices), self._facts_of(devices), direct=direct)
        except (ApiException, HTTPError, OSError, ValueError) as exc:
            log.error("ResourceSlice not written: %s", describe_api_error(exc, self.publisher.node))
            self.metrics.publishes.labels("error").inc()
            return False
        self.metrics.publishes.labels("ok").inc()
        self.metrics.cards.set(len(devices))
        self.metrics.generation.set(self.publisher.generation)
        self.published.set()
        return True

    def run(self) -> None:
        failures = 0
        last = -SPACING
        due = self._clock() + self.resync
        while not self._stop_event.is_set():
            now = self._clock()
            # After a failure only the backoff's end brings the next try.
            ready = now >= due or (failures == 0 and self._wake.is_set())
            if not ready:
                timeout = min(max(due - now, 0.0), 1.0)
                (self._stop_event if failures else self._wake).wait(timeout)
                continue
            pause = last + SPACING - now
            if pause > 0 and self._stop_event.wait(pause):
                return
            safety = self._clock() >= due
            with self._asked:
                direct = self._direct or safety
                self._wake.clear()
                self._direct = False
            last = self._clock()
            if self.check(direct):
                failures = 0
                due = self._clock() + self.resync
            else:
                failures += 1
                due = self._clock() + min(RETRY_MAX, RETRY_BASE * 2 ** min(failures - 1, 16))
                with self._asked:
                    self._direct = True
