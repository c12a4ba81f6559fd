"""Counters of the cluster side (relists, list and watch restarts, settled uncertain binds).

They live here rather than with the extender's metrics so that `cluster` does not import
`serving`; the extender registers them in its own registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class SyncCounters:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.ledger_rebuilds = Counter(
            "gas_ledger_rebuilds",
            "Times the ledger was rebuilt from a full list of pods.",
            registry=registry,
        )
        self.watch_restarts = Counter(
            "gas_watch_restarts",
            "Times a watch of the API server was started again, by resource.",
            ["resource"],
            registry=registry,
        )
        self.list_restarts = Counter(
            "gas_list_restarts",
            "Times a list of the API server was started over because its continue token "
            "expired (410) between two pages, by resource.",
            ["resource"],
            registry=registry,
        )
        self.pending_released = Counter(
            "gas_pending_released",
            "Cards released from binds whose outcome was unknown, once a read after the "
            "grace showed the pod not bound by gas, by what it showed.",
            ["verdict"],
            registry=registry,
        )
