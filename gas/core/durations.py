"""Go duration strings (`time.ParseDuration`, which `metav1.Duration` and GAS's flags use).

One parser for both readers: `gas serve`'s duration flags and `gas check-config`'s
`httpTimeout` rule. Pure: no I/O.
"""

from __future__ import annotations

import re

NANOSECONDS_PER_SECOND = 1_000_000_000

DEFAULT_PENDING_GRACE = 120.0
"""Seconds after which a Binding whose outcome was unknown can no longer land: twice the
API server's default request timeout (60 s), which bounds how late it can still write.
Here rather than in gas.core.ledger, which uses it, so that the `gas` command's parser
(`--pendingGrace`) does not load the ledger and numpy into every gas process (`gas node`
too)."""

# Go spells microseconds `us`, `µs` (U+00B5) or `μs` (U+03BC).
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": NANOSECONDS_PER_SECOND,
    "m": 60 * NANOSECONDS_PER_SECOND,
    "h": 3_600 * NANOSECONDS_PER_SECOND,
}


def parse_go_duration(text: str) -> int | None:
    """Nanoseconds of a Go duration string (`10s`, `1m30s`, `500ms`, `-5s`, `0`), else None."""
    body = text.strip()
    sign = 1
    if body[:1] in "+-" and body:
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return 0
    if not body:
        return None
    total = 0.0
    position = 0
    for match in _PART.finditer(body):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(body):
        return None
    return sign * int(total)


def format_seconds(nanoseconds: int) -> str:
    """`10s`, `0.5s`: a duration as whole or fractional seconds."""
    if nanoseconds % NANOSECONDS_PER_SECOND == 0:
        return f"{nanoseconds // NANOSECONDS_PER_SECOND}s"
    return f"{nanoseconds / NANOSECONDS_PER_SECOND:g}s"
