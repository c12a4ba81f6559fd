"""Go-style boolean flags, shared by `gas serve` and `gas webhook`.

GAS's flags are Go's: a boolean is set by `-flag` alone or `-flag=true|false`, and these
commands take them the same way so that a GAS deployment's arguments keep working.
"""

from __future__ import annotations

import argparse


def go_bool(value: str) -> bool:
    """A boolean flag's value as Go's strconv.ParseBool takes it, give or take `yes`/`on`."""
    lowered = value.lower()
    if lowered in ("1", "t", "true", "yes", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r}")


def add_go_bool(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    """A boolean flag, off unless given: `-flag` alone or `-flag=true|false`."""
    parser.add_argument(
        name, nargs="?", const=True, default=False, type=go_bool, metavar="BOOL", help=help_text
    )
