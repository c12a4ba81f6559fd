"""The command-line flags of `gas.httpserver.limits.Limits`, shared by `gas serve` and
`gas webhook`."""

from __future__ import annotations

import argparse

from gas.httpserver.limits import DEFAULT_LIMITS, MIB, Limits

__all__ = ["add_limit_flags", "limits_from_args"]

# Flag, the Limits field it sets, and what it bounds (its default is appended).
_FLAGS: tuple[tuple[str, str, str], ...] = (
    (
        "maxConnections",
        "max_connections",
        "connections open at once; at the bound the longest idle one is closed for a new one",
    ),
    ("handshakeTimeout", "handshake_timeout", "seconds from accept to a finished TLS handshake"),
    ("headerTimeout", "header_timeout", "seconds to a request's complete head"),
    ("bodyTimeout", "body_timeout", "seconds from a request's head to its complete body"),
    ("idleTimeout", "idle_timeout", "seconds a connection may stay open with no request"),
    ("writeTimeout", "write_timeout", "seconds a peer may leave its answers unread"),
    (
        "maxBufferedBytes",
        "max_buffered_bytes",
        "request bytes and unread answers held in the process; past it the connection "
        "holding the most is closed",
    ),
)


def _shown(value: float) -> str:
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        return f"{value // MIB} MiB"
    return f"{value:g}"


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("limits on what a peer may cost (docs/serving.md)")
    for flag, field, text in _FLAGS:
        default = getattr(DEFAULT_LIMITS, field)
        group.add_argument(
            f"--{flag}", type=type(default), default=default, help=f"{text} ({_shown(default)})"
        )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The limits the flags give; raises ValueError for one that makes no sense."""
    limits = Limits(**{field: getattr(args, flag) for flag, field, _ in _FLAGS})
    try:
        limits.check()
    except ValueError as exc:
        message = str(exc)
        for flag, field, _ in _FLAGS:
            message = message.replace(field, f"--{flag}")
        raise ValueError(message) from None
    return limits
