"""Run `gas serve` as a real process (gunicorn, one worker) for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from gas.serving.tls import KeyType


@dataclass(frozen=True)
class TLSFiles:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    @classmethod
    def named_as_gas_certs(cls, directory: Path) -> TLSFiles:
        """The files of `directory` under the names `gas certs` writes them (and Secret
        gas-tls holds them): ca.crt, tls.crt, tls.key, client.crt, client.key."""
        return cls(
            ca=str(directory / "ca.crt"),
            server_cert=str(directory / "tls.crt"),
            server_key=str(directory / "tls.key"),
            client_cert=str(directory / "client.crt"),
            client_key=str(directory / "client.key"),
        )

    def client_flags(self) -> list[str]:
        """The flags by which a gas client command (`gas inspect`) reaches gas over mutual
        TLS with these files."""
        return ["--cacert", self.ca, "--cert", self.client_cert, "--key", self.client_key]


def make_tls_files(directory: Path, key_type: KeyType = "ec") -> TLSFiles:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate."""
    from gas.serving import tls

    ca_cert, ca_key = tls.new_ca("gas-test-ca", key_type=key_type)
    server_cert, server_key = tls.issue_certificate(
        ca_cert,
        ca_key,
        "gas-test-server",
        ["localhost"],
        ["127.0.0.1"],
        server=True,
        client=False,
        key_type=key_type,
    )
    client_cert, client_key = tls.issue_certificate(
        ca_cert, ca_key, "kube-scheduler", server=False, client=True, key_type=key_type
    )
    files = TLSFiles(
        ca=str(directory / "ca.crt"),
        server_cert=str(directory / "server.crt"),
        server_key=str(directory / "server.key"),
        client_cert=str(directory / "client.crt"),
        client_key=str(directory / "client.key"),
    )
    tls.write_pem(files.ca, ca_cert)
    tls.write_pem(files.server_cert, server_cert)
    tls.write_pem(files.server_key, server_key, private=True)
    tls.write_pem(files.client_cert, client_cert)
    tls.write_pem(files.client_key, client_key, private=True)
    return files


def child_pids(pid: int) -> list[int]:
    """The live child processes of `pid` (a gunicorn arbiter's workers)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(entry))
    return children


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class GasProcess:
    """`python -m gas.cli serve ...` with the test's TLS files; stopped on exit."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        tls_files: TLSFiles | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.tls = tls_files
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "gas.cli",
            "serve",
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            *args,
        ]
        if tls_files is not None:
            command += [
                "--cert",
                tls_files.server_cert,
                "--key",
                tls_files.server_key,
                "--cacert",
                tls_files.ca,
            ]
        else:
            command += ["--unsafe"]
        self._launch(command)
        if tls_files is not None:
            self.session.cert = (tls_files.client_cert, tls_files.client_key)
            self.session.verify = tls_files.ca

    def _launch(self, command: list[str]) -> None:
        """Start `command` in its own process group, its output in `log_path`, and the
        session that speaks to it."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("KUBECONFIG", None)
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.session = requests.Session()
        # REQUESTS_CA_BUNDLE and proxy variables would override the session's own settings.
        self.session.trust_env = False
        # As kube-scheduler's Go client: no Connection field on HTTP/1.1, so that its POSTs
        # are those gas answers without gunicorn's parser (gas/httpserver/direct.py).
        del self.session.headers["Connection"]

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        self.wait_status("/readyz", 200, timeout)

    def wait_status(self, path: str, status: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gas exited with {self.process.returncode}:\n{self.log()}")
            try:
                response = self.session.get(self.url + path, timeout=2)
                if response.status_code == status:
                    return
                last = f"{response.status_code} {response.text}"
            except requests.RequestException as exc:
                last = str(exc)
            time.sleep(0.05)
        raise TimeoutError(f"{path} never answered {status} (last: {last}):\n{self.log()}")

    def get_json(self, path: str) -> object:
        response = self.session.get(self.url + path, timeout=5)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: object, **headers: str) -> requests.Response:
        return self.session.post(
            self.url + path,
            json=body,
            headers={"Content-Type": "application/json", **headers},
            timeout=10,
        )

    def bind(self, pod: dict[str, Any], node: str, uid: str | None = None) -> str:
        """POST a bind as kube-scheduler does; the reply's Error ("" when bound)."""
        meta = pod["metadata"]
        response = self.post(
            "/scheduler/bind",
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": uid or meta["uid"],
                "Node": node,
            },
        )
        assert response.status_code == 200, response.text
        error: str = response.json()["Error"]
        return error

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
        self.process.wait(timeout=30)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Quick shutdown (SIGINT) by default; graceful SIGTERM is tested on its own."""
        self.session.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.session.close()
        self._log.close()
