"""The benchmark runner runs end to end at its smoke size and prints well-formed tables.

Only the shape of the output is checked: figures depend on the machine, and speed goals
belong to the benchmarks, not to the tests.
"""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from benchmarks import kubewire
from benchmarks.harness import GO_WRITE_BUFFER, Client, PythonClient
from tests.support.benchrun import run_quick
from tests.support.gasproc import TLSFiles


def tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables of `text`: rows of cells, the separator row left out."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(set(cell) <= set("-:") for cell in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def number(cell: str) -> float:
    return float(cell.replace(",", "").removesuffix("%"))


def test_quick_run_prints_every_table(tmp_path: Path) -> None:
    stdout, report = run_quick("benchmarks.run", tmp_path / "figures.json")
    found = tables(stdout)
    headers = [table[0] for table in found]
    assert [h[:3] for h in headers] == [
        ["nodes", "cards", "pods"],
        ["nodes", "occupancy", "1-shape p50 ms"],
        ["nodes", "pods", "binds"],
        ["nodes", "pods", "ready s"],
        ["observe_pod s", "replace_pods s", "total s"],
    ], stdout

    http, workloads, api = found[:3]
    assert "filter p99 ms" in http[0] and "bind p99 ms" in http[0] and "bind/s" in http[0]
    assert len(http) == len(workloads) == len(api) == 2  # the one quick scenario
    for column in ("64-shape p99 ms", "interleaved filter p99 ms", "lone bind CPU ms"):
        assert column in workloads[0]
    for column in ("cold bind p99 ms", "CPU ms/bind", "writes/bind", "Events/bind"):
        assert column in api[0]
    for table in found:
        for row in table[1:]:
            assert len(row) == len(table[0]), row
            for cell in row:
                assert number(cell) >= 0, (table[0], row)
    assert "calls/s" in stdout

    assert set(report) >= {
        "scenarios",
        "api_binds",
        "production_memory",
        "rebuild",
        "allocator_calls_per_s",
    }
    scenario = report["scenarios"][0]
    assert scenario["nodes"] == 50
    assert scenario["filter_p99_ms"] >= scenario["filter_p50_ms"] > 0
    for workload in ("one_shape_filter", "many_shape_filter", "interleaved_filter"):
        assert scenario[f"{workload}_p99_ms"] >= scenario[f"{workload}_p50_ms"] > 0
    assert scenario["many_shapes"] == 64
    # CPU is read in clock ticks: a smoke-sized window may show none.
    assert scenario["one_shape_filter_cpu_ms"] >= 0
    binds = report["api_binds"][0]
    assert binds["nodes"] == 50 and binds["binds"] == binds["cold_binds"] == 20
    assert binds["errors"] == 0
    assert binds["bind_p99_ms"] >= binds["bind_p50_ms"] > 0
    assert binds["cold_bind_p99_ms"] >= binds["cold_bind_p50_ms"] > 0
    # Counted at the API server: each bind wrote exactly one Binding.
    assert binds["bindings_per_bind"] == 1
    assert binds["writes_per_bind"] >= 1
    assert report["rebuild"]["pods"] > 0


def test_the_benchmark_client_writes_requests_as_kube_scheduler_does(tls_files: TLSFiles) -> None:
    # What gas's server receives, one TLS record per write: the head and a small body
    # together; a large one as Go's buffer full, then the rest. (Python's own client
    # writes the head and the body apart.)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files.server_cert, tls_files.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    records: list[list[int]] = []

    def serve(count: int) -> None:
        conn, _ = listener.accept()
        with context.wrap_socket(conn, server_side=True) as tls:
            for _ in range(count):
                sizes: list[int] = []
                data = b""
                while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + int(
                    data.split(b"Content-Length: ")[1].split(b"\r\n")[0]
                ):
                    chunk = tls.recv(65536)
                    sizes.append(len(chunk))
                    data += chunk
                records.append(sizes)
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    for make, count in ((Client, 2), (PythonClient, 1)):
        server = threading.Thread(target=serve, args=(count,))
        server.start()
        client = make(port, tls_files)
        assert client.request("POST", "/scheduler/bind", b'{"PodName":"p"}') == (200, b"{}")
        if count == 2:
            client.request("POST", "/scheduler/filter", b"x" * 10_000)
        client.close()
        server.join(timeout=30)
    listener.close()
    small, large, python = records
    assert len(small) == 1
    assert large[0] == GO_WRITE_BUFFER and len(large) == 2
    assert len(python) == 2


def test_the_api_path_benchmark_sees_every_event_and_bind() -> None:
    # benchmarks.kubewire at a smoke size: each figure is CPU the watch thread or the
    # binding caller really spent on what it measures (none is left at zero).
    figures = kubewire.measure(pods=4, runs=1)
    assert set(figures) >= {"gpu_added_ms", "gpu_bound_ms", "bind_ms", "status_only_ms"}
    assert all(value > 0 for value in figures.values()), figures
