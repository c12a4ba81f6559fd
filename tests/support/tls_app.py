"""A trivial Flask app served by ``gas.serving.server.serve``, for the TLS/serving tests.

Run as ``python -m tests.support.tls_app --port N [--cert C --key K [--ca CA] | --unsafe]``.
It reports which process and thread served each request, so that tests can check the
process model (one worker, app built in the worker) and that requests overlap.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

from flask import Flask, jsonify, request

from gas.httpserver.limits import Limits
from gas.serving.server import ServerSettings, serve

_state_lock = threading.Lock()
_state: dict[str, Any] = {"in_flight": 0, "served": 0}


def create_app(fail: bool = False) -> Flask:
    if fail:
        raise RuntimeError("app factory failed on purpose")
    app = Flask("tls_app")
    factory_pid = os.getpid()
    background: dict[str, int] = {}
    started = threading.Event()

    def background_job() -> None:
        # Stands in for the extender's watch threads: it must run in the worker.
        background["pid"] = os.getpid()
        started.set()
        while True:
            time.sleep(3600)

    threading.Thread(target=background_job, name="background", daemon=True).start()
    started.wait(5)

    def identity() -> dict[str, Any]:
        with _state_lock:
            in_flight = _state["in_flight"]
            served = _state["served"]
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "factory_pid": factory_pid,
            "background_pid": background.get("pid"),
            "thread": threading.get_ident(),
            "in_flight": in_flight,
            "served": served,
            "scheme": request.scheme,
        }

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify(identity())

    @app.post("/echo")
    def echo() -> Any:
        body = request.get_json(force=True, silent=True) or {}
        with _state_lock:
            _state["in_flight"] += 1
        start = time.time()
        try:
            time.sleep(float(body.get("sleep", 0)))
        finally:
            end = time.time()
            with _state_lock:
                _state["in_flight"] -= 1
                _state["served"] += 1
        return jsonify({**identity(), "start": start, "end": end, "body": body})

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--ca")
    parser.add_argument("--unsafe", action="store_true")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--graceful-timeout", type=int, default=5)
    parser.add_argument("--handshake-timeout", type=float, default=10.0)
    parser.add_argument("--exit-marker", help="file the worker writes its pid to on exit")
    parser.add_argument("--fail-in-factory", action="store_true")
    args = parser.parse_args()

    def on_worker_exit() -> None:
        if args.exit_marker:
            with open(args.exit_marker, "w") as f:
                f.write(str(os.getpid()))

    settings = ServerSettings(
        host=args.host,
        port=args.port,
        certfile=args.cert,
        keyfile=args.key,
        cafile=args.ca,
        unsafe=args.unsafe,
        threads=args.threads,
        graceful_timeout=args.graceful_timeout,
        limits=Limits(handshake_timeout=args.handshake_timeout),
        log_level="debug",
        on_worker_exit=on_worker_exit,
    )
    serve(lambda: create_app(fail=args.fail_in_factory), settings)


if __name__ == "__main__":
    main()
