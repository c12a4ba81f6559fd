"""The files `gas dra` writes: CDI specs and its state, each replaced atomically (a reader,
the container runtime or `gas dra` after a crash, sees the old file or the new one, never
half of one)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gas.dra.state import PreparedClaim, State, StateError, decode, encode

STATE_FILE = "prepared-claims.json"


def write_json(path: Path, content: Mapping[str, Any]) -> None:
    """Write beside the target, flush to disk, rename over it, then make the rename
    itself durable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(content, out, indent=1, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class StateStore:
    """The prepared claims in `<state dir>/prepared-claims.json`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / STATE_FILE

    def load(self) -> dict[str, PreparedClaim]:
        """The claims recorded; none when there is no file yet. OSError or StateError when
        the file is there but cannot be read: starting without it would hand out tiles
        other claims hold."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self.path.parent.exists() and not self.path.parent.is_dir():
                raise NotADirectoryError(f"{self.path.parent} is not a directory") from None
            return {}
        try:
            return decode(json.loads(text))
        except ValueError as exc:
            raise StateError(f"{self.path}: {exc}") from None
        except StateError as exc:
            raise StateError(f"{self.path}: {exc}") from None

    def save(self, state: State) -> None:
        write_json(self.path, encode(state))


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
