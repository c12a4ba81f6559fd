"""The extender's routes: kube-scheduler's verbs under gas's URL prefix."""

from __future__ import annotations

FILTER = "/scheduler/filter"
PRIORITIZE = "/scheduler/prioritize"
PREEMPT = "/scheduler/preempt"
BIND = "/scheduler/bind"

# Route -> the verb name used in metrics and decision logs.
VERBS = {FILTER: "filter", PRIORITIZE: "prioritize", PREEMPT: "preempt", BIND: "bind"}
