"""CPU of gas's HTTP/2 serving per request, framing alone: `serve_connection` in process
on a real mutual-TLS socket, a direct POST that answers at once (in the reader's
thread), and a client (the `h2` package) sending filters one after another on one
connection. The filters cycle through distinct pod shapes and node sets, as kube-scheduler's
queue sends them, so bodies and answers vary in size as users' do. Prints the reader
thread's CPU per request; never fails on time.

    .venv/bin/python -m benchmarks.http2_framing [--requests N] [--runs R]
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import ssl
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.workload import pod_object, queue_shapes
from gas.serving import http2
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


def run(tls: TLSFiles, requests: int) -> float:
    """The reader thread's CPU ms per filter over `requests` filters on one connection."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.server_cert, tls.server_key)
    context.load_verify_locations(tls.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pool = ThreadPoolExecutor(2)
    settings = http2.Settings(
        wsgi=_wsgi,
        direct_post=_direct,
        body_limit=1 << 20,
        header_limit=8190,
        pool=pool,
        keepalive=30.0,
        alive=lambda: True,
        server=("127.0.0.1", port),
        inline=frozenset({"/filter"}),
    )

    def server() -> None:
        raw, client = listener.accept()
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = context.wrap_socket(raw, server_side=True)
        http2.serve_connection(sock, client, settings)
        sock.close()

    thread = threading.Thread(target=server)
    thread.start()
    with H2Client(port, tls) as client:
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
    thread.join()
    listener.close()
    pool.shutdown()
    return used * 1000 / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        tls = make_tls_files(Path(directory))
        figures = [run(tls, args.requests) for _ in range(args.runs)]
    print(
        f"HTTP/2 reader CPU per filter ({args.requests} on one connection, {args.runs} runs): "
        + ", ".join(f"{f:.3f}" for f in figures)
        + f" ms (min {min(figures):.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
