from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.audit import drift, over_capacity, usage_from_pods
from tests.support.apiserver import ApiServerDouble
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


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as double:
        yield double


@pytest.fixture
def kubeconfig(apiserver: ApiServerDouble, tmp_path: Path) -> str:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def gas(start_gas: Callable[..., GasProcess], kubeconfig: str, tls_files: TLSFiles) -> GasProcess:
    """gas over HTTPS with mutual TLS, against the API-server double, synced."""
    process = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    process.wait_ready()
    return process


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


def ledger_of(gas: GasProcess) -> dict[str, Any]:
    snapshot = gas.get_json("/debug/ledger")
    assert isinstance(snapshot, dict)
    return snapshot


def wait_for_nodes(gas: GasProcess, *names: str) -> None:
    wait_for(lambda: set(names) <= set(ledger_of(gas)["nodes"]), what=f"nodes {names} in gas")


def assert_consistent(gas: GasProcess, apiserver: ApiServerDouble) -> None:
    """The invariants: no card over capacity, and the ledger equals what the cluster's
    annotations imply for bound, non-terminal pods (once the watch has caught up)."""
    pods = apiserver.list_pods()
    nodes = apiserver.list_nodes()
    expected = usage_from_pods(pods)
    assert over_capacity(nodes, expected) == []

    def settled() -> bool:
        return drift(expected, ledger_of(gas)["usage"]) == []

    try:
        wait_for(settled, timeout=10, what="ledger to match the cluster")
    except TimeoutError:
        assert drift(expected, ledger_of(gas)["usage"]) == []
