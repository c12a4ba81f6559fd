"""What every benchmark workload drives gas with: a kept-alive HTTPS client, `gas serve` as
a process, kube-scheduler's asynchronous binder, latency samples, and the gas worker's own
CPU time read from /proc.
"""

from __future__ import annotations

import http.client
import json
import math
import multiprocessing
import os
import signal
import ssl
import statistics
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.workload import Cluster
from tests.support.gasproc import GasProcess, TLSFiles, child_pids

BIND_CONCURRENCY = 4
"""Binds in flight at once, as kube-scheduler's binding goroutines."""


# ---------------------------------------------------------------- statistics


def percentile(samples: Sequence[float], share: float) -> float:
    """Nearest-rank percentile (`share` in 0..1) of a non-empty sample."""
    ordered = sorted(samples)
    # The smallest rank covering `share` of the samples; the slack absorbs float error
    # (0.07 * 100 is 7.000000000000001).
    rank = max(1, min(len(ordered), math.ceil(share * len(ordered) - 1e-9)))
    return ordered[rank - 1]


@dataclass
class Latencies:
    seconds: list[float] = field(default_factory=list)
    wall: float = 0.0

    def add(self, value: float) -> None:
        self.seconds.append(value)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.seconds) * 1000 if self.seconds else float("nan")

    @property
    def p99_ms(self) -> float:
        return percentile(self.seconds, 0.99) * 1000 if self.seconds else float("nan")

    @property
    def rps(self) -> float:
        return len(self.seconds) / self.wall if self.wall > 0 else float("nan")


# ---------------------------------------------------------------- gas's own CPU time


class CpuMeter:
    """CPU time (user + system, all threads) of one process, from /proc/<pid>/stat.

    The kernel keeps a process's run time to the nanosecond and reports it in clock ticks
    (10 ms), truncated: a window's figure is within one tick of the truth, so windows of
    a few hundred requests give per-request figures to a few hundredths of a millisecond.
    What gas spends is read in gas's worker, so neither the client's speed nor the API
    server's enters it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._path = f"/proc/{pid}/stat"
        self._tick = float(os.sysconf("SC_CLK_TCK"))

    def seconds(self) -> float:
        with open(self._path) as f:
            # Fields after the command name (which may hold spaces): state is field 3,
            # utime and stime fields 14 and 15.
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick


@dataclass
class CpuWindow:
    """gas's CPU time over a window of `requests` requests."""

    seconds: float = float("nan")
    requests: int = 0

    @property
    def ms_per_request(self) -> float:
        return self.seconds * 1000 / self.requests if self.requests else float("nan")


@contextmanager
def cpu_window(meter: CpuMeter | None, window: CpuWindow) -> Iterator[CpuWindow]:
    """Fill `window.seconds` with the CPU time `meter`'s process spent in the block; the
    block sets `window.requests`."""
    if meter is None:
        yield window
        return
    before = meter.seconds()
    yield window
    window.seconds = meter.seconds() - before


# ---------------------------------------------------------------- HTTPS client


GO_WRITE_BUFFER = 4096
"""kube-scheduler's HTTP client (Go's net/http) writes a request through a buffer of this
size: the head and a body that fits it in one write; a larger body fills the buffer, which
is written, and the rest goes in one more write (the transport's connection writer copies
it straight from the body)."""


class _GoWrites(http.client.HTTPSConnection):
    """Writes a request as kube-scheduler does (GO_WRITE_BUFFER). http.client writes the
    head and the body apart, two TLS records even for a small body, and gas's server then
    waits for the second before it hands the request to a thread: a round trip through
    its poller that kube-scheduler's requests do not cost."""

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if not isinstance(message_body, bytes) or encode_chunked:
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        self._buffer.extend((b"", b""))  # type: ignore[attr-defined]
        data = b"\r\n".join(self._buffer) + message_body  # type: ignore[attr-defined]
        del self._buffer[:]  # type: ignore[attr-defined]
        self.send(data[:GO_WRITE_BUFFER])
        if len(data) > GO_WRITE_BUFFER:
            self.send(data[GO_WRITE_BUFFER:])


class Client:
    """One kept-alive HTTPS connection with a client certificate, writing requests as
    kube-scheduler does (not thread-safe)."""

    connection_class: type[http.client.HTTPSConnection] = _GoWrites

    def __init__(self, port: int, tls: TLSFiles) -> None:
        context = ssl.create_default_context(cafile=tls.ca)
        context.load_cert_chain(tls.client_cert, tls.client_key)
        self._connection = self.connection_class("127.0.0.1", port, context=context, timeout=120)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            self._connection.request(method, path, body=body, headers=headers)
            response = self._connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self._connection.close()  # reconnects on the next request
            raise

    def timed_post(self, path: str, body: bytes) -> tuple[float, int, bytes]:
        start = time.perf_counter()
        status, data = self.request("POST", path, body)
        return time.perf_counter() - start, status, data

    def close(self) -> None:
        self._connection.close()


class PythonClient(Client):
    """`Client` as Python's http.client writes: the head, then the body."""

    connection_class = http.client.HTTPSConnection


def filter_body(pod: dict[str, Any], names_json: bytes) -> bytes:
    return b'{"Pod":' + json.dumps(pod).encode() + b',"NodeNames":' + names_json + b"}"


def bind_body(pod: dict[str, Any], node: str) -> bytes:
    meta = pod["metadata"]
    return json.dumps(
        {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
    ).encode()


def check_reply(data: bytes, expected: int) -> list[str]:
    """The nodes a filter reply passed; RuntimeError unless it judged all `expected`."""
    reply = json.loads(data)
    judged = len(reply["NodeNames"]) + len(reply["FailedNodes"])
    judged += len(reply["FailedAndUnresolvableNodes"])
    if judged != expected or reply.get("Error"):
        raise RuntimeError(f"malformed filter reply: {judged} of {expected} nodes judged")
    passed: list[str] = reply["NodeNames"]
    return passed


def timed_filter(
    client: Client, pod: dict[str, Any], names_json: bytes, count: int
) -> tuple[float, list[str]]:
    """One filter of `count` nodes: its latency and the nodes it passed."""
    seconds, status, data = client.timed_post("/scheduler/filter", filter_body(pod, names_json))
    if status != 200:
        raise RuntimeError(f"filter answered {status}: {data[:300]!r}")
    return seconds, check_reply(data, count)


def timed_bind(client: Client, pod: dict[str, Any], node: str) -> tuple[float, str]:
    """One bind: its latency and the reply's Error ("" when bound)."""
    seconds, status, data = client.timed_post("/scheduler/bind", bind_body(pod, node))
    error: str = json.loads(data).get("Error", "") if status == 200 else data.decode()
    return seconds, error


# ---------------------------------------------------------------- gas serve


def _proc_status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _kib(value: str) -> int:
    return int(value.split()[0]) if value else 0


@dataclass
class GasServer:
    gas: GasProcess
    startup_seconds: float

    @property
    def port(self) -> int:
        return self.gas.port

    def worker_pid(self) -> int:
        """The gunicorn worker: the one process holding gas's state and doing its work."""
        workers = child_pids(self.gas.process.pid)
        if len(workers) != 1:
            raise RuntimeError(f"expected one gunicorn worker, found {workers}")
        return workers[0]

    def worker_memory_mib(self) -> tuple[float, float]:
        """(current, peak) resident memory of the gunicorn worker, MiB."""
        for child in child_pids(self.gas.process.pid):
            status = _proc_status(child)
            if status:
                return _kib(status.get("VmRSS", "")) / 1024, _kib(status.get("VmHWM", "")) / 1024
        return float("nan"), float("nan")


@contextmanager
def gas_server(
    cluster: Cluster | None,
    directory: Path,
    tls: TLSFiles,
    threads: int = 8,
    kubeconfig: str | None = None,
) -> Iterator[GasServer]:
    """`gas serve` on the demo cluster `cluster`, or on the API server of `kubeconfig`."""
    if cluster is not None:
        demo_file = directory / "cluster.json"
        demo_file.write_text(json.dumps(cluster.as_demo_file(), separators=(",", ":")))
        source = ["--demo", "--demoFile", str(demo_file)]
    else:
        source = ["--kubeConfig", str(kubeconfig)]
    started = time.perf_counter()
    gas = GasProcess([*source, "--threads", str(threads)], directory / "gas.log", tls)
    try:
        gas.wait_ready(timeout=300)
        yield GasServer(gas, time.perf_counter() - started)
    finally:
        gas.stop(signal.SIGTERM)


# ---------------------------------------------------------------- kube-scheduler's binder


_bind_client: Client | None = None


def _bind_worker_start(port: int, tls: TLSFiles) -> None:
    global _bind_client
    _bind_client = Client(port, tls)
    # Connected (TLS handshake done) before the first timed bind, as kube-scheduler's
    # kept-alive connections are.
    _bind_client.request("GET", "/healthz")


def _bind_in_worker(body: bytes) -> tuple[float, str]:
    assert _bind_client is not None
    seconds, status, data = _bind_client.timed_post("/scheduler/bind", body)
    error: str = json.loads(data).get("Error", "") if status == 200 else data.decode()
    return seconds, error


class Binder:
    """kube-scheduler's binding cycle: binds run concurrently with the next filters.

    Binds are sent from worker processes: kube-scheduler's goroutines do not share an
    interpreter lock with its filter calls, and client threads here would (a filter's
    reply could wait on a bind thread's Python work and be measured slower)."""

    def __init__(self, port: int, tls: TLSFiles, concurrency: int) -> None:
        self._pool = ProcessPoolExecutor(
            concurrency,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_bind_worker_start,
            initargs=(port, tls),
        )
        # Every worker started and connected before anything is timed.
        list(self._pool.map(time.sleep, [0.2] * concurrency))
        self._futures: list[Future[tuple[float, str]]] = []
        self.latencies = Latencies()
        self.errors: list[str] = []

    def submit(self, pod: dict[str, Any], node: str) -> None:
        self._futures.append(self._pool.submit(_bind_in_worker, bind_body(pod, node)))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for future in self._futures:
            seconds, error = future.result()
            self.latencies.add(seconds)
            if error:
                self.errors.append(error)
