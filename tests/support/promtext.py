"""Reading samples out of a /metrics page (Prometheus text format)."""

from __future__ import annotations

import re
from collections.abc import Iterator


def _values(text: str, name: str, labels: dict[str, str]) -> Iterator[float]:
    """The values of the samples of `name` whose labels include `labels`, in page order."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            yield float(line.rsplit(" ", 1)[1])


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the first sample of `name` whose labels include `labels`; KeyError
    when there is none."""
    for value in _values(text, name, labels):
        return value
    raise KeyError(f"{name} {labels} not in metrics")


def total(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of `name` whose labels include `labels` (0 when there is
    none): a counter over all its other labels, as every outcome of one verb."""
    return sum(_values(text, name, labels), 0.0)
