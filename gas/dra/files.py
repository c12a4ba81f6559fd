"""The files `gas dra` writes: CDI specs and its state, each replaced atomically (a reader,
the container runtime or `gas dra` after a crash, sees the old file or the new one, never
half of one).

Two `gas dra` may run on one node at once: during a rolling update the new pod registers
before the old one leaves, and the kubelet may call either. They share the state through
`serialize.lock` in the state directory: each prepare and unprepare holds it (an exclusive
`flock`, released by the kernel if the holder dies) and reads the state afresh under it,
so that neither decides on claims the other has recorded since.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gas.dra.state import PreparedClaim, State, StateError, decode, encode

STATE_FILE = "prepared-claims.json"
LOCK_FILE = "serialize.lock"


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
    """The prepared claims in `<state dir>/prepared-claims.json`, shared with any other
    `gas dra` of the node through `<state dir>/serialize.lock`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / STATE_FILE
        self.lock_path = Path(directory) / LOCK_FILE
        self._seen: tuple[int, int, int] | None = None
        self._loaded: dict[str, PreparedClaim] = {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the node's lock of the prepared claims (waiting for another process that
        holds it)."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def load(self) -> dict[str, PreparedClaim]:
        """The claims recorded; none when there is no file yet. OSError or StateError when
        the file is there but cannot be read: starting without it would hand out tiles
        other claims hold. A file unchanged since the last load is not read again."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            if self.path.parent.exists() and not self.path.parent.is_dir():
                raise NotADirectoryError(f"{self.path.parent} is not a directory") from None
            self._seen, self._loaded = None, {}
            return {}
        seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        if seen == self._seen:
            return dict(self._loaded)
        text = self.path.read_text(encoding="utf-8")
        try:
            loaded = decode(json.loads(text))
        except ValueError as exc:
            raise StateError(f"{self.path}: {exc}") from None
        except StateError as exc:
            raise StateError(f"{self.path}: {exc}") from None
        self._seen, self._loaded = seen, loaded
        return dict(loaded)

    def save(self, state: State) -> None:
        write_json(self.path, encode(state))
        info = os.stat(self.path)
        self._seen, self._loaded = (info.st_ino, info.st_mtime_ns, info.st_size), dict(state)


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
