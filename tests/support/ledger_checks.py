"""What a running gas's ledger holds, and whether it agrees with the cluster."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gas.tools.audit import check_invariants, drift, usage_from_pods
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.polling import wait_for


def ledger_of(gas: GasProcess) -> dict[str, Any]:
    snapshot = gas.get_json("/debug/ledger")
    assert isinstance(snapshot, dict)
    return snapshot


def wait_for_nodes(gas: GasProcess, *names: str) -> None:
    wait_for(lambda: set(names) <= set(ledger_of(gas)["nodes"]), what=f"nodes {names} in gas")


@contextmanager
def gas_serving(
    cluster: ApiServerDouble,
    directory: Path,
    tls_files: TLSFiles,
    args: Sequence[str],
    nodes: Sequence[str],
) -> Iterator[GasProcess]:
    """A gas over `cluster` (its kubeconfig and log in `directory`, `args` added), ready and
    holding `nodes` in its ledger; stopped on leaving."""
    kubeconfig = cluster.write_kubeconfig(directory / "kubeconfig")
    process = GasProcess(["--kubeConfig", kubeconfig, *args], directory / "gas.log", tls_files)
    try:
        process.wait_ready()
        wait_for_nodes(process, *nodes)
        yield process
    finally:
        process.stop()


def assert_consistent(gas: GasProcess, apiserver: ApiServerDouble) -> None:
    """The invariants (gas.tools.audit.check_invariants): no card over capacity, no pod or tile
    accounted twice, and the ledger equals what the cluster's annotations imply for bound,
    non-terminal pods plus its binds in flight (once the watch has caught up)."""
    pods = apiserver.list_pods()
    nodes = apiserver.list_nodes()
    assert check_invariants(nodes, pods) == []
    expected = usage_from_pods(pods)

    def settled() -> bool:
        ledger = ledger_of(gas)
        return not check_invariants(nodes, pods, ledger) and not drift(expected, ledger["usage"])

    try:
        wait_for(settled, timeout=10, what="ledger to match the cluster")
    except TimeoutError:
        ledger = ledger_of(gas)
        assert check_invariants(nodes, pods, ledger) == []
        assert drift(expected, ledger["usage"]) == []
