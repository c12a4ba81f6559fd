"""CPU of gas's HTTP/2 serving per request, framing alone: the serving loop
(`gas.httpserver.front`) in process on a real mutual-TLS socket, a direct POST that answers at
once (on the loop's thread, as filter is), and a client (the `h2` package) sending filters
one after another on one connection. The filters cycle through distinct pod shapes and
node sets, as kube-scheduler's queue sends them, so bodies and answers vary in size as
users' do. Prints the loop thread's CPU per request (TLS, HTTP/2, the answer's
hand-over); never fails on time.

    .venv/bin/python -m benchmarks.http2_framing [--requests N] [--runs R]
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.workload import pod_object, queue_shapes
from gas.httpserver.answering import App
from gas.httpserver.connection import Listener
from gas.httpserver.front import Front, new_loop
from gas.httpserver.limits import Limits
from gas.serving import tls
from tests.support.gasproc import TLSFiles, make_tls_files
from tests.support.h2client import H2Client

# Node sets of the sizes a filter names: a small pool, a few dozen nodes, one node left.
_NODE_COUNTS = (3, 50, 12, 1, 30, 8)


def _filters() -> list[tuple[bytes, bytes]]:
    """(filter body, answer) pairs: one per queue shape, each with its own node set; the
    answer fits half the nodes and says why the others fail."""
    pairs = []
    for index, shape in enumerate(queue_shapes()):
        count = _NODE_COUNTS[index % len(_NODE_COUNTS)]
        nodes = [f"node-{(index + n) % 64}" for n in range(count)]
        pod = pod_object(f"pod-{index}", f"uid-pod-{index}", shape)
        fits, fails = nodes[: (count + 1) // 2], nodes[(count + 1) // 2 :]
        answer = {
            "NodeNames": fits,
            "FailedNodes": {n: "gpu.intel.com/memory.max: not enough on any card" for n in fails},
            "Error": "",
        }
        pairs.append(
            (
                json.dumps({"Pod": pod, "NodeNames": nodes}).encode(),
                json.dumps(answer).encode(),
            )
        )
    return pairs


_FILTERS = _filters()
_ANSWERS = dict(_FILTERS)


def _direct(path: str, body: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
    answer = _ANSWERS[body]
    return (
        "200 OK",
        [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))],
        answer,
    )


def _wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 NOT FOUND", [("Content-Length", "0")])
    return []


def run(tls_files: TLSFiles, requests: int) -> float:
    """The serving loop thread's CPU ms per filter over `requests` filters on one
    connection."""
    context = tls.server_ssl_context(
        tls_files.server_cert, tls_files.server_key, tls_files.ca, alpn_protocols=("h2",)
    )
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    pool = ThreadPoolExecutor(2)
    loop = new_loop()
    front = Front(loop, Limits(), pool, inline=frozenset({"/filter"}))
    app = App(_wsgi, _direct, 1 << 20, "https", ("127.0.0.1", port))
    loop.run_until_complete(front.listen(sock, Listener(app, lambda: context, http2=True)))
    stop = threading.Event()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(front.run(lambda: not stop.is_set()))
    )
    thread.start()
    with H2Client(port, tls_files) as client:
        client.settings()
        for body, _ in _FILTERS[:20]:  # warm the header tables
            assert client.request("POST", "/filter", body).status == 200
        assert thread.ident is not None
        filters = itertools.islice(itertools.cycle(_FILTERS), requests)
        clock = time.pthread_getcpuclockid(thread.ident)
        start = time.clock_gettime(clock)
        for body, answer in filters:
            response = client.request("POST", "/filter", body)
            assert response.status == 200 and response.body == answer
        used = time.clock_gettime(clock) - start
    stop.set()
    thread.join()
    loop.close()
    pool.shutdown()
    return used * 1000 / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        files = make_tls_files(Path(directory))
        figures = [run(files, args.requests) for _ in range(args.runs)]
    print(
        f"HTTP/2 serving loop CPU per filter ({args.requests} on one connection, "
        f"{args.runs} runs): "
        + ", ".join(f"{f:.3f}" for f in figures)
        + f" ms (min {min(figures):.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
