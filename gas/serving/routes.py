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
