"""Prometheus metrics of `gas node`, on their own registry (served by `--metrics-port`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from gas.host.usage_watch import USAGE_PATH
from gas.httpserver.background import BackgroundServer, listen
from gas.httpserver.routes import Answer, with_answers


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "gas_node_decisions_total",
            "Device-plugin requests by outcome: gas (the container got gas's cards), "
            "unmanaged (a pod gas did not place got the kubelet's choice), mismatch, "
            "problem (unusable annotations), unidentified, error",
            ["resource", "method", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gas_node_request_seconds",
            "Time to answer a device-plugin request",
            ["resource", "method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.devices = Gauge(
            "gas_node_devices",
            "Advertised device IDs (card shares) by health",
            ["resource", "health"],
            registry=self.registry,
        )
        self.registrations = Counter(
            "gas_node_registrations_total",
            "Registrations with the kubelet, by result",
            ["resource", "result"],
            registry=self.registry,
        )
        self.annotations = Counter(
            "gas_node_annotation_patches_total",
            "Patches of the gas-node-cards pod annotation, by result",
            ["result"],
            registry=self.registry,
        )

    def serve(
        self, port: int, host: str = "0.0.0.0", usage: Answer | None = None
    ) -> BackgroundServer:
        """Serves the metrics on `host`:`port` from a thread of their own, through the
        serving loop every listener of gas uses (docs/serving.md: no thread per
        connection, the same timeouts and limits); its connections are counted there.
        `usage` answers `/usage` (the containers' GPU use, as JSON)."""
        app = make_wsgi_app(self.registry)
        if usage is not None:
            app = with_answers(app, {USAGE_PATH: usage})
        server = BackgroundServer(listen(host, port), app, name="metrics")
        self.registry.register(server.stats)
        server.start()
        return server
