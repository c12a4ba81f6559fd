"""Run `gas webhook` as a real process (gunicorn, one worker, HTTPS) for integration tests.

It speaks to its clients as the API server's webhook client does: HTTPS checked against
the CA, no client certificate, no `Connection` field. The rest (readiness, stopping, the
log) is `GasProcess`'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.gasproc import GasProcess, TLSFiles, free_port


class WebhookProcess(GasProcess):
    """`python -m gas.cli webhook --cert --key ...` on 127.0.0.1; `tls.server_cert` and
    `tls.server_key` are its certificate, `tls.ca` what the session trusts."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        tls_files: TLSFiles,
        port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.port = port or free_port()
        self.tls = tls_files
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "gas.cli",
            "webhook",
            "--port",
            str(self.port),
            "--host",
            host,
            "--cert",
            tls_files.server_cert,
            "--key",
            tls_files.server_key,
            *args,
        ]
        self._launch(command)
        self.session.verify = tls_files.ca
