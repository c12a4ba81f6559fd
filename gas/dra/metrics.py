"""Prometheus metrics of `gas dra`, on their own registry, and its liveness answer, both
served on `--metrics-port`."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from gas.host.usage_watch import USAGE_PATH
from gas.httpserver.background import BackgroundServer, listen
from gas.httpserver.routes import Answer, with_answers

LIVENESS_PATH = "/healthz"


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
            "Time to prepare the claims of one kubelet call",
            ["call"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.cards = Gauge(
            "gas_dra_cards", "Cards published in the node's ResourceSlice", registry=self.registry
        )
        self.health = Gauge(
            "gas_dra_card_health",
            "Cards published, by health (Healthy, Unhealthy, Unknown)",
            ["health"],
            registry=self.registry,
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
        self.status_writes = Counter(
            "gas_dra_claim_status_writes_total",
            "Writes of claims' status.devices, by result (ok, gone, error)",
            ["result"],
            registry=self.registry,
        )

    def serve(
        self,
        port: int,
        host: str = "0.0.0.0",
        live: Callable[[], str | None] | None = None,
        usage: Answer | None = None,
    ) -> BackgroundServer:
        """Metrics on every path but `/healthz`, which answers 200 when `live()` finds
        nothing wrong and 503 with its reason otherwise, and `/usage` (the containers' GPU
        use, as JSON)."""
        answers: dict[str, Answer] = {}
        if live is not None:
            answers[LIVENESS_PATH] = lambda: _liveness(live)
        if usage is not None:
            answers[USAGE_PATH] = usage
        app = with_answers(make_wsgi_app(self.registry), answers)
        server = BackgroundServer(listen(host, port), app, name="metrics")
        self.registry.register(server.stats)
        server.start()
        return server


def _liveness(live: Callable[[], str | None]) -> tuple[int, str, bytes]:
    problem = live()
    if problem is None:
        return 200, "text/plain; charset=utf-8", b"ok\n"
    return 503, "text/plain; charset=utf-8", f"{problem}\n".encode()
