"""The no-op scheduler extender (`../shared/tools/noopext`): the ceiling of the extender way.

Its filter passes every node it is sent and its bind creates the Binding, over the same
mutual TLS as gas; nothing else. kube-scheduler registered with it shows the most any
extender can give on the machine, so `benchmarks.endtoend` runs it in gas's place, in
alternated rounds, and reports gas / no-op.

The binary ships xz-compressed beside the project; it is unpacked once (its sha256 checked)
into ~/.cache/gas-tools.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import socket
import ssl
import time
from pathlib import Path

from tests.support import realk8s
from tests.support.gasproc import TLSFiles
from tests.support.realk8s import ROOT, free_port

ARCHIVE = ROOT.parent / "shared" / "tools" / "noopext" / "noopext.xz"
SHA256 = "d2d50a7e87456682d22dd328e424deaeeb26b87cf37f467dccc08ea6bea5fdcd"
CACHE = Path.home() / ".cache" / "gas-tools"


def missing() -> str | None:
    """Why the no-op extender cannot run here; None when it can."""
    if not ARCHIVE.is_file():
        return f"no {ARCHIVE} (../shared/tools/noopext)"
    return None


def binary() -> Path:
    """The unpacked binary, checked against its published sha256."""
    target = CACHE / f"noopext-{SHA256[:12]}"
    if target.is_file():
        return target
    data = lzma.decompress(ARCHIVE.read_bytes())
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise RuntimeError(f"{ARCHIVE} unpacks to sha256 {digest}, not {SHA256}")
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.rename(target)
    return target


class NoopExtender:
    """The no-op extender on a free loopback port, serving `tls`'s server certificate and
    asking for a client certificate of its CA; its Bindings made as `kubeconfig`."""

    def __init__(self, kubeconfig: str, tls: TLSFiles, log_path: Path) -> None:
        self.tls = tls
        self.port = free_port()
        command = [str(binary()), "-addr", f"127.0.0.1:{self.port}"]
        command += ["-cert", tls.server_cert, "-key", tls.server_key, "-ca", tls.ca]
        command += ["-kubeconfig", kubeconfig]
        self.process = realk8s.Process("noopext", command, log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.tls.ca)
        context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        return context

    def counts(self) -> dict[str, int]:
        """Its requests so far: filter, bind, bindErrors."""
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw,
            self._context().wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.sendall(b"GET /counts HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"noopext /counts: {head[:200]!r}")
        counts: dict[str, int] = json.loads(body)
        return counts

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.process.check_alive()
            try:
                self.counts()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.stop()
