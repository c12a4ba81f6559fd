"""The suite's own scheduling: the files it starts first are files that exist."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONG_FILES

ROOT = Path(__file__).resolve().parents[2]


def test_every_long_file_named_first_exists() -> None:
    missing = [path for path in LONG_FILES if not (ROOT / path).is_file()]
    assert not missing, f"tests/conftest.py LONG_FILES names files that are gone: {missing}"
    assert len(set(LONG_FILES)) == len(LONG_FILES)
