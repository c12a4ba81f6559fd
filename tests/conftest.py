from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.gasproc import GasProcess, TLSFiles, make_tls_files


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def start_gas(tmp_path: Path) -> Iterator[Callable[..., GasProcess]]:
    """Start `gas serve` processes; all are stopped when the test ends."""
    started: list[GasProcess] = []

    def start(args: list[str], tls: TLSFiles | None = None, port: int | None = None) -> GasProcess:
        process = GasProcess(args, tmp_path / f"gas-{len(started)}.log", tls, port)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
