"""The command-line flags of `gas.httpserver.limits.Limits`, shared by `gas serve` and
`gas webhook`."""

from __future__ import annotations

import argparse

from gas.httpserver.limits import DEFAULT_LIMITS, MIB, Limits

__all__ = ["add_limit_flags", "limits_from_args"]

_D = DEFAULT_LIMITS


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "limits on what a peer may cost (docs/serving.md)",
    )
    group.add_argument(
        "--maxConnections",
        type=int,
        default=_D.max_connections,
        help=f"connections open at once; at the bound the longest idle one is closed for "
        f"a new one ({_D.max_connections})",
    )
    group.add_argument(
        "--handshakeTimeout",
        type=float,
        default=_D.handshake_timeout,
        help=f"seconds from accept to a finished TLS handshake ({_D.handshake_timeout:g})",
    )
    group.add_argument(
        "--headerTimeout",
        type=float,
        default=_D.header_timeout,
        help=f"seconds to a request's complete head ({_D.header_timeout:g})",
    )
    group.add_argument(
        "--bodyTimeout",
        type=float,
        default=_D.body_timeout,
        help=f"seconds from a request's head to its complete body ({_D.body_timeout:g})",
    )
    group.add_argument(
        "--idleTimeout",
        type=float,
        default=_D.idle_timeout,
        help=f"seconds a connection may stay open with no request ({_D.idle_timeout:g})",
    )
    group.add_argument(
        "--writeTimeout",
        type=float,
        default=_D.write_timeout,
        help=f"seconds a peer may leave its answers unread ({_D.write_timeout:g})",
    )
    group.add_argument(
        "--maxBufferedBytes",
        type=int,
        default=_D.max_buffered_bytes,
        help=f"request bytes held in the process before the app takes them; past it the "
        f"connection holding the most is closed ({_D.max_buffered_bytes // MIB} MiB)",
    )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The limits the flags give; raises ValueError for one that makes no sense."""
    limits = Limits(
        max_connections=args.maxConnections,
        handshake_timeout=args.handshakeTimeout,
        header_timeout=args.headerTimeout,
        body_timeout=args.bodyTimeout,
        idle_timeout=args.idleTimeout,
        write_timeout=args.writeTimeout,
        max_buffered_bytes=args.maxBufferedBytes,
    )
    limits.check()
    return limits
