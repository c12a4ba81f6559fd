"""The extender's routes: kube-scheduler's verbs under gas's URL prefix, and the routes
for probes, metrics and the ledger's view."""

from __future__ import annotations

FILTER = "/scheduler/filter"
PRIORITIZE = "/scheduler/prioritize"
PREEMPT = "/scheduler/preempt"
BIND = "/scheduler/bind"

# Route -> the verb name used in metrics and decision logs.
VERBS = {FILTER: "filter", PRIORITIZE: "prioritize", PREEMPT: "preempt", BIND: "bind"}

HEALTHZ = "/healthz"
READYZ = "/readyz"
METRICS = "/metrics"
# The ledger's snapshot, as `gas inspect --extender` reads it.
LEDGER = "/debug/ledger"

DIRECT_POST = "gas_direct_post"
"""The attribute under which an app served by `gas.serving.server` offers the POSTs the
server answers without a WSGI environ (`gas.serving.direct.DirectPost`)."""

SERVING_STATS = "gas_serving_stats"
"""The attribute under which an app served by `gas.serving.server` takes the serving loop's
counters (`gas.serving.stats.ServingStats`, a Prometheus collector) once, at start."""

CONNECTION_OPENED = "gas_connection_opened"
"""The attribute under which an app served by `gas.serving.server` takes note of each
connection whose handshake completed: a callable given the protocol it chose ("h2" or
"http/1.1")."""
