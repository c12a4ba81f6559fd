"""Transport security and secrets at the `gas serve` level (tests/test_tls_serving.py
covers the TLS policy on a test app): wrong-CA and expired client certificates, and
TLS 1.1 refused by a real `gas serve`; tokens and keys never in gas's output."""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from gas import tls
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.objects import gpu_node, gpu_pod

TOKEN = "gas-secret-token-3f9c1e7a0b5d4c2e8f61"


def _client_pair(
    directory: Path, name: str, ca_cert: Any, ca_key: Any, **validity: Any
) -> tuple[str, str]:
    cert, key = tls.issue_certificate(ca_cert, ca_key, name, server=False, client=True, **validity)
    cert_path, key_path = str(directory / f"{name}.crt"), str(directory / f"{name}.key")
    tls.write_pem(cert_path, cert)
    tls.write_pem(key_path, key, private=True)
    return cert_path, key_path


def test_gas_serve_refuses_foreign_and_expired_client_certificates(
    start_gas: Callable[..., GasProcess], tmp_path: Path
) -> None:
    ca_cert, ca_key = tls.new_ca("gas-security-ca")
    server_cert, server_key = tls.issue_certificate(
        ca_cert, ca_key, "gas", ["localhost"], ["127.0.0.1"], server=True, client=False
    )
    tls.write_pem(tmp_path / "ca.crt", ca_cert)
    tls.write_pem(tmp_path / "server.crt", server_cert)
    tls.write_pem(tmp_path / "server.key", server_key, private=True)
    good = _client_pair(tmp_path, "good", ca_cert, ca_key)
    files = TLSFiles(
        str(tmp_path / "ca.crt"),
        str(tmp_path / "server.crt"),
        str(tmp_path / "server.key"),
        *good,
    )
    gas = start_gas(["--demo"], tls=files)
    gas.wait_ready()
    other_ca, other_key = tls.new_ca("someone-else")
    foreign = _client_pair(tmp_path, "foreign", other_ca, other_key)
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    expired = _client_pair(
        tmp_path,
        "expired",
        ca_cert,
        ca_key,
        not_before=past,
        not_after=past + datetime.timedelta(days=1),
    )
    for cert in (foreign, expired):
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(gas.url + "/healthz", verify=files.ca, cert=cert, timeout=5)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(gas.url + "/healthz", verify=files.ca, timeout=5)
    assert requests.get(gas.url + "/healthz", verify=files.ca, cert=good, timeout=5).ok


def test_gas_serve_refuses_tls_1_1(gas: GasProcess, tls_files: TLSFiles) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(tls_files.ca)
    context.load_cert_chain(tls_files.client_cert, tls_files.client_key)
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    with (
        socket.create_connection(("127.0.0.1", gas.port), timeout=5) as raw,
        pytest.raises((ssl.SSLError, OSError)),
    ):
        context.wrap_socket(raw, server_hostname="localhost")


def test_tokens_keys_and_bodies_never_reach_the_log(
    start_gas: Callable[..., GasProcess], tls_files: TLSFiles, tmp_path: Path
) -> None:
    key_material = Path(tls_files.client_key).read_text()
    key_body = "".join(key_material.strip().splitlines()[1:-1])
    with ApiServerDouble() as api:
        api.add_node(gpu_node("n1", "0.1", i915="2"))
        kubeconfig = tmp_path / "kubeconfig"
        text = Path(api.write_kubeconfig(kubeconfig)).read_text()
        text = text.replace(
            "    token: dummy-token\n",
            f"    token: {TOKEN}\n"
            f"    client-certificate: {tls_files.client_cert}\n"
            f"    client-key: {tls_files.client_key}\n",
        )
        kubeconfig.write_text(text)
        gas = start_gas(["--kubeConfig", str(kubeconfig), "--v", "5"], tls=tls_files)
        gas.wait_ready()
        pod = api.add_pod(gpu_pod("p"))
        secret_header = f"Bearer {TOKEN}-request"
        gas.post(
            "/scheduler/filter", {"Pod": pod, "NodeNames": ["n1"]}, Authorization=secret_header
        )
        gas.post(
            "/scheduler/bind",
            {
                "PodName": "p",
                "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"],
                "Node": "n1",
            },
            Authorization=secret_header,
        )
        gas.post("/scheduler/filter", {"Pod": 1}, Authorization=secret_header)
        gas.post(
            "/scheduler/bind", {"PodName": "x", "PodNamespace": "x", "PodUID": "u", "Node": "n"}
        )
        output = gas.log()
    assert TOKEN not in output
    assert "Bearer" not in output
    assert key_body[:40] not in output and "PRIVATE KEY" not in output
    assert "DEBUG" in output  # --v 5 really was verbose
