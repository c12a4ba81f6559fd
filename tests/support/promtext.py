"""Reading samples out of a /metrics page (Prometheus text format)."""

from __future__ import annotations

import re


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the first sample of `name` whose labels include `labels`; KeyError
    when there is none."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"{name} {labels} not in metrics")


def total(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of `name` whose labels include `labels` (0 when there is
    none): a counter over all its other labels, as every outcome of one verb."""
    found = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
        if all(sample.get(k) == v for k, v in labels.items()):
            found += float(line.rsplit(" ", 1)[1])
    return found
