"""Prometheus metrics of `gas dra`, on their own registry (served by `--metrics-port`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from gas.httpserver.background import BackgroundServer, listen


class DraMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "gas_dra_claims_total",
            "Claims prepared and unprepared for the kubelet, by call and result",
            ["call", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gas_dra_prepare_seconds",
            "Time to prepare one claim",
            ["call"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.cards = Gauge(
            "gas_dra_cards", "Cards published in the node's ResourceSlice", registry=self.registry
        )
        self.generation = Gauge(
            "gas_dra_pool_generation",
            "Generation of the node's pool last published",
            registry=self.registry,
        )
        self.publishes = Counter(
            "gas_dra_slice_publishes_total",
            "Checks of the node's ResourceSlice, by result",
            ["result"],
            registry=self.registry,
        )

    def serve(self, port: int, host: str = "0.0.0.0") -> BackgroundServer:
        server = BackgroundServer(listen(host, port), make_wsgi_app(self.registry), name="metrics")
        self.registry.register(server.stats)
        server.start()
        return server
