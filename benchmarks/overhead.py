"""What one request costs gas beyond its own work: TLS, gunicorn, Flask and the JSON wire.

    .venv/bin/python -m benchmarks.overhead             # the full set (a few minutes)
    .venv/bin/python -m benchmarks.overhead --quick     # a smoke size (seconds)
    .venv/bin/python -m benchmarks.overhead --json figures.json

Through the real stack (mutual TLS, gunicorn with gas's own worker, one kept-alive
connection, latencies read at the client and the worker's CPU time per request):

- the floor: a bare WSGI callable, then a one-line Flask route, both served by
  `gas.serving.server.serve` exactly as gas is (what gunicorn and TLS cost, then Flask),
  and the bare callable under gunicorn's stock gthread worker (what gas's worker adds);
- `gas serve --demo`: `/healthz`, a filter of no node (decode, service, encode, metrics,
  decision log on an empty list), and filters of 100 and 1,000 nodes (`NodeNames` mode,
  one pod shape, then pods cycling through more shapes than gas keeps answers for).

In process, without sockets: the same app called as WSGI (Flask and gas's hooks without
gunicorn), and the wire alone on a 5,000-node cluster: decoding the filter request,
encoding its reply (about 250 kB), and the filter's service work between them.
Prints Markdown tables; never fails on time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.filters import many_shape_pods
from benchmarks.harness import (
    Client,
    CpuMeter,
    CpuWindow,
    Latencies,
    PythonClient,
    cpu_window,
    filter_body,
    gas_server,
)
from benchmarks.scenario import QUEUE_SHAPES
from benchmarks.workload import SHAPES, Shape, make_cluster, pod_object, queue_shapes
from tests.support.gasproc import TLSFiles, child_pids, free_port, make_tls_files

RAW_PATH = "/raw"
FLASK_PATH = "/flask"
OK = b'{"status":"ok"}'

Requests = list[tuple[str, str, bytes | None]]
"""(method, path, body) of requests sent one after another."""


# ---------------------------------------------------------------- the floor: a bare server


def bare_app() -> Any:
    """A Flask app with one trivial route, and in front of it (as Flask's own middleware
    hook) a bare WSGI callable answering `RAW_PATH` without Flask."""
    from flask import Flask, Response

    app = Flask("overhead")

    @app.get(FLASK_PATH)
    def trivial() -> Response:
        return Response(OK, mimetype="application/json")

    flask_call = app.wsgi_app

    def raw_first(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == RAW_PATH:
            headers = [("Content-Type", "application/json"), ("Content-Length", str(len(OK)))]
            start_response("200 OK", headers)
            return [OK]
        return flask_call(environ, start_response)

    app.wsgi_app = raw_first  # type: ignore[method-assign]
    return app


def serve_bare(port: int, tls: TLSFiles, stock: bool) -> None:
    """The bare app served by `gas.serving.server.serve`, or, `stock`, with the same
    settings by gunicorn's own gthread worker (without gas's collection of a whole request
    before a thread takes it)."""
    from gunicorn.app.base import BaseApplication  # type: ignore[import-untyped]

    from gas.serving.server import ServerSettings, build_options, serve

    settings = ServerSettings(
        host="127.0.0.1",
        port=port,
        certfile=tls.server_cert,
        keyfile=tls.server_key,
        cafile=tls.ca,
        log_level="warning",
    )
    if not stock:
        serve(bare_app, settings)

    class Stock(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in build_options(settings).items():
                self.cfg.set(key, value)
            self.cfg.set("worker_class", "gthread")

        def load(self) -> Any:
            return bare_app()

    Stock().run()


@contextmanager
def bare_server(tls: TLSFiles, stock: bool = False) -> Iterator[tuple[int, int]]:
    """(port, worker pid) of the bare app served as gas is (or by stock gthread), in its
    own process."""
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.overhead", "--serve-bare", str(port)]
    command += [tls.ca, tls.server_cert, tls.server_key, tls.client_cert, tls.client_key]
    command += ["--stock"] if stock else []
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                Client(port, tls).request("GET", RAW_PATH)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the bare server did not start") from None
                time.sleep(0.1)
        (worker,) = child_pids(process.pid)
        yield port, worker
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


# ---------------------------------------------------------------- measuring


@dataclass
class Figure:
    """One request kind: client latencies and the serving worker's CPU per request."""

    name: str
    latency: Latencies = field(default_factory=Latencies)
    cpu: CpuWindow = field(default_factory=CpuWindow)


def timed_requests(
    name: str,
    client: Client,
    meter: CpuMeter | None,
    requests: Requests,
) -> Figure:
    """The requests one after another on one connection; the first is a warm-up."""
    figure = Figure(name)
    method, path, body = requests[0]
    client.request(method, path, body)
    with cpu_window(meter, figure.cpu) as window:
        started = time.perf_counter()
        for method, path, body in requests[1:]:
            begun = time.perf_counter()
            status, data = client.request(method, path, body)
            figure.latency.add(time.perf_counter() - begun)
            if status != 200:
                raise RuntimeError(f"{name}: {method} {path} answered {status}: {data[:200]!r}")
        figure.latency.wall = time.perf_counter() - started
        window.requests = len(requests) - 1
    return figure


def filter_requests(pods: list[dict[str, Any]], names: list[str]) -> Requests:
    names_json = json.dumps(names).encode()
    return [("POST", "/scheduler/filter", filter_body(pod, names_json)) for pod in pods]


TWO_WRITES = " (head, body: 2 writes)"


def http_figures(
    nodes: int, sizes: list[int], rounds: int, directory: Path, tls: TLSFiles
) -> list[Figure]:
    """Requests one at a time on a kept-alive connection, written as kube-scheduler writes
    them (`Client`); two rows also as Python's own client writes them (`TWO_WRITES`)."""
    cluster = make_cluster(nodes, 0.5)
    names = cluster.node_names
    serial = iter(range(10**9))

    def new_pod(shape: Shape | None) -> dict[str, Any]:
        n = next(serial)
        return pod_object(f"new-{n}", f"uid-new-{n}", shape or SHAPES[1])

    def filters(count: int, shapes: Sequence[Shape] = SHAPES[1:2]) -> Requests:
        pods = many_shape_pods(new_pod, shapes, rounds)
        return filter_requests(pods, names[:count])

    figures: list[Figure] = []
    with bare_server(tls) as (port, worker):
        client = Client(port, tls)
        meter = CpuMeter(worker)
        for name, path in (("bare WSGI", RAW_PATH), ("one-line Flask route", FLASK_PATH)):
            requests: Requests = [("GET", path, None)] * (rounds + 1)
            figures.append(timed_requests(name, client, meter, requests))
        posts = [("POST", RAW_PATH, body) for _, _, body in filters(100)]
        figures.append(timed_requests("bare WSGI, POST of a 100-node filter", client, meter, posts))
        client.close()
    with bare_server(tls, stock=True) as (port, worker):
        client = Client(port, tls)
        requests = [("GET", RAW_PATH, None)] * (rounds + 1)
        name = "bare WSGI, stock gthread worker"
        figures.append(timed_requests(name, client, CpuMeter(worker), requests))
        client.close()

    with gas_server(cluster, directory, tls) as server:
        client, python_client = Client(server.port, tls), PythonClient(server.port, tls)
        meter = CpuMeter(server.worker_pid())
        healthz: Requests = [("GET", "/healthz", None)] * (rounds + 1)
        figures.append(timed_requests("gas /healthz", client, meter, healthz))
        for count in (0, 100):
            name = f"filter {count} nodes, 1 shape"
            figures.append(timed_requests(name, client, meter, filters(count)))
            name += TWO_WRITES
            figures.append(timed_requests(name, python_client, meter, filters(count)))
        for count in sizes:
            name = f"filter {count:,} nodes, 1 shape"
            if count != 100:
                figures.append(timed_requests(name, client, meter, filters(count)))
            name = f"filter {count:,} nodes, {QUEUE_SHAPES} shapes"
            many = filters(count, queue_shapes(QUEUE_SHAPES))
            figures.append(timed_requests(name, client, meter, many))
        client.close()
        python_client.close()
    return figures


# ---------------------------------------------------------------- in process


def _environ(method: str, path: str, body: bytes) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "9001",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "https",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }


def wsgi_call_ms(app: Any, method: str, path: str, bodies: list[bytes]) -> float:
    """Median milliseconds of one WSGI call of `app`, reply read, per body."""
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
        statuses.append(status)

    samples = []
    for body in bodies:
        environ = _environ(method, path, body)
        begun = time.perf_counter()
        reply = app(environ, start_response)
        b"".join(reply)
        getattr(reply, "close", lambda: None)()
        samples.append(time.perf_counter() - begun)
    if not statuses[-1].startswith("200"):
        raise RuntimeError(f"{method} {path} answered {statuses[-1]}")
    return statistics.median(samples[1:]) * 1000


def best_ms(call: Callable[[], object], repeat: int) -> float:
    """The median of `repeat` timed calls, in milliseconds."""
    samples = []
    for _ in range(repeat):
        begun = time.perf_counter()
        call()
        samples.append(time.perf_counter() - begun)
    return statistics.median(samples) * 1000


def _demo(size: int) -> tuple[Any, Any, list[str]]:
    """(ledger, started demo cluster, node names) of a generated cluster of `size` nodes."""
    from gas.cluster.demo import DemoCluster
    from gas.core.ledger import Ledger

    cluster = make_cluster(size, 0.5)
    ledger = Ledger()
    demo = DemoCluster(ledger, cluster.as_demo_file())
    demo.start()
    return ledger, demo, cluster.node_names


def app_figures(nodes: int, rounds: int) -> dict[str, float]:
    """The bare app, a one-line Flask route and gas's app, each called as WSGI."""
    import logging

    from gas.serving.extender import create_app

    # As in `gas serve`: the decision log is written (here to nowhere).
    logging.getLogger("gas.decisions").addHandler(logging.NullHandler())
    logging.getLogger("gas.decisions").setLevel(logging.INFO)
    bare = bare_app()
    figures = {
        "bare WSGI": wsgi_call_ms(bare, "GET", RAW_PATH, [b""] * rounds),
        "one-line Flask route": wsgi_call_ms(bare, "GET", FLASK_PATH, [b""] * rounds),
    }
    ledger, demo, names = _demo(nodes)
    app = create_app(ledger, demo)
    figures["gas /healthz"] = wsgi_call_ms(app, "GET", "/healthz", [b""] * rounds)
    pods = [pod_object(f"p-{i}", f"uid-p-{i}", SHAPES[1]) for i in range(rounds + 1)]
    for count in (0, 100):
        names_json = json.dumps(names[:count]).encode()
        bodies = [filter_body(pod, names_json) for pod in pods]
        figures[f"gas filter, {count} nodes"] = wsgi_call_ms(
            app, "POST", "/scheduler/filter", bodies
        )
    return {f"{name}, in process": value for name, value in figures.items()}


# A pod that fits about a third of the generated nodes: its reply names every other node
# with a reason, as a busy cluster's does.
WIRE_SHAPE = Shape("three-cards", 3, 10, 500, 0.0)


def wire_figures(nodes: int, repeat: int) -> dict[str, float]:
    """Decoding a filter request of `nodes` nodes, the service's work, encoding its reply."""
    from gas.serving import wire
    from gas.serving.service import Extender

    ledger, demo, names = _demo(nodes)
    body = filter_body(pod_object("p", "uid-p", WIRE_SHAPE), json.dumps(names).encode())
    extender = Extender(ledger, demo)
    args = wire.decode_extender_args(body)
    reply = extender.filter(args)
    encoded = wire.encode(reply.body)
    return {
        f"decode {nodes:,}-node request ({len(body) / 1000:.0f} kB)": best_ms(
            lambda: wire.decode_extender_args(body), repeat
        ),
        f"filter service, {nodes:,} nodes, kept answers": best_ms(
            lambda: extender.filter(args), repeat
        ),
        f"encode {nodes:,}-node reply ({len(encoded) / 1000:.0f} kB)": best_ms(
            lambda: wire.encode(reply.body), repeat
        ),
    }


# ---------------------------------------------------------------- report


def _fmt(value: float) -> str:
    return "n/a" if value != value else f"{value:,.3f}"


def report(http: list[Figure], inproc: dict[str, float]) -> list[str]:
    lines = [
        "| through TLS + gunicorn | p50 ms | p99 ms | worker CPU ms/req |",
        "|---|---:|---:|---:|",
    ]
    for f in http:
        row = (f.name, _fmt(f.latency.p50_ms), _fmt(f.latency.p99_ms), _fmt(f.cpu.ms_per_request))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| in process | median ms |", "|---|---:|"]
    lines += [f"| {name} | {_fmt(value)} |" for name, value in inproc.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="a smoke size")
    parser.add_argument("--rounds", type=int, default=1000, help="requests per figure")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--serve-bare", nargs=6, metavar="ARG", help=argparse.SUPPRESS)
    parser.add_argument("--stock", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_bare:
        port, *files = args.serve_bare
        serve_bare(int(port), TLSFiles(*files), args.stock)
        return 0
    rounds = 30 if args.quick else args.rounds
    nodes, sizes, wire_nodes = (200, [100], 500) if args.quick else (1000, [100, 1000], 5000)
    with tempfile.TemporaryDirectory(prefix="gas-overhead-") as tmp:
        directory = Path(tmp)
        tls = make_tls_files(directory)
        http = http_figures(nodes, sizes, rounds, directory, tls)
    inproc = app_figures(nodes, min(rounds, 300))
    inproc.update(wire_figures(wire_nodes, max(5, min(rounds, 300) // 5)))
    print(f"# gas request overhead (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)\n")
    print("\n".join(report(http, inproc)))
    if args.json:
        record = {
            "http": [
                {
                    "name": f.name,
                    "p50_ms": f.latency.p50_ms,
                    "p99_ms": f.latency.p99_ms,
                    "cpu_ms": f.cpu.ms_per_request,
                }
                for f in http
            ],
            "in_process_ms": inproc,
        }
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
