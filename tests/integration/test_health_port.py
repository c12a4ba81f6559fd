"""`gas serve --healthPort`: plain-HTTP /healthz and /readyz for kubelet's probes, which
cannot pass the main port's mutual TLS; nothing else on that port."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable

import pytest
import requests

from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles, free_port
from tests.support.objects import gpu_node, gpu_pod
from tests.support.polling import wait_for


def _plain(port: int, path: str, host: str = "127.0.0.1", method: str = "GET") -> requests.Response:
    with requests.Session() as session:
        session.trust_env = False
        return session.request(method, f"http://{host}:{port}{path}", timeout=5)


def _local_address() -> str | None:
    """An address of this machine other than loopback, as a pod's IP is; None if none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 9))  # no packet is sent: only a route is chosen
        except OSError:
            return None
        address: str = sock.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_the_health_port_answers_the_probes_as_the_main_port_does_and_nothing_else(
    apiserver: ApiServerDouble,
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In follow mode, as the scheduler profile runs it: ready once synced, although no
    Lease names this pod (its verbs answer 503)."""
    apiserver.add_node(gpu_node("n1", "0.1", i915="2"))
    held = apiserver.faults.add("GET", r"^/api/v1/pods$", ("hold", None))
    port = free_port()
    monkeypatch.setenv("POD_NAME", "sched-a")
    gas = start_gas(
        [
            "--kubeConfig",
            kubeconfig,
            "--schedulerLease=gas-scheduler",
            "--leaderElectNamespace=gas-system",
            f"--healthPort={port}",
        ],
        tls=tls_files,
    )
    # Up, but not synced while its pod list is held.
    wait_for(lambda: _answers(port, "/healthz"), timeout=30, what="the health port")
    assert _plain(port, "/healthz").json() == gas.get_json("/healthz") == {"status": "ok"}
    before = _plain(port, "/readyz")
    assert before.status_code == 503
    main = gas.session.get(gas.url + "/readyz", timeout=5)
    assert (main.status_code, main.json()) == (503, before.json())
    held.release()
    wait_for(lambda: _plain(port, "/readyz").status_code == 200, timeout=30, what="ready")
    assert _plain(port, "/readyz").json() == gas.get_json("/readyz") == {"status": "ready"}
    # Ready, yet its verbs are refused: no Lease names this pod's kube-scheduler.
    reply = gas.post("/scheduler/filter", {"Pod": gpu_pod("p"), "NodeNames": ["n1"]})
    assert reply.status_code == 503

    # Nothing else is served on the health port, whatever the method.
    for method, path in (
        ("GET", "/scheduler/filter"),
        ("POST", "/scheduler/filter"),
        ("POST", "/scheduler/bind"),
        ("GET", "/metrics"),
        ("GET", "/debug/ledger"),
        ("GET", "/"),
    ):
        response = _plain(port, path, method=method)
        assert response.status_code == 404, (method, path)
        assert "the health port serves GET /healthz and /readyz only" in response.json()["Error"]
    assert _plain(port, "/readyz", method="POST").status_code == 405  # as the main port says
    assert gas.session.post(gas.url + "/readyz", timeout=5).status_code == 405

    # kubelet probes at the pod's IP: the health port listens on every address, the main
    # port (--host 127.0.0.1) on loopback only.
    address = _local_address()
    if address is not None:
        assert _plain(port, "/readyz", host=address).status_code == 200
        with pytest.raises(requests.ConnectionError):
            requests.get(f"https://{address}:{gas.port}/readyz", verify=False, timeout=5)


def _answers(port: int, path: str) -> bool:
    try:
        return _plain(port, path).status_code == 200
    except requests.ConnectionError:
        return False


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_a_probe_without_a_client_certificate_cannot_pass_the_main_port(
    gas: GasProcess, tls_files: TLSFiles
) -> None:
    """What kubelet's HTTPS probe does (no certificate verified, none presented) fails in
    the TLS handshake of a port that demands client certificates: why --healthPort exists."""
    with requests.Session() as probe:
        probe.trust_env = False
        with pytest.raises(requests.exceptions.SSLError):
            probe.get(gas.url + "/healthz", verify=False, timeout=5)
        with pytest.raises(requests.exceptions.SSLError):
            probe.get(gas.url + "/healthz", verify=tls_files.ca, timeout=5)
    # The control: the same request with the client certificate passes.
    assert gas.session.get(gas.url + "/healthz", timeout=5).status_code == 200


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gas.cli", "serve", "--demo", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_health_port_in_use_or_out_of_range_fails_at_start() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        result = _serve(f"--healthPort={taken}")
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on the health port 0.0.0.0:{taken}" in result.stderr
    result = _serve("--healthPort=70000")
    assert result.returncode == 2, result.stderr
    assert "the health port must be between 1 and 65535, got 70000" in result.stderr
    result = _serve("--port=9555", "--healthPort=9555")
    assert result.returncode == 2, result.stderr
    assert "--healthPort must differ from --port (9555)" in result.stderr


def test_the_health_port_serves_the_demo_cluster_too(
    start_gas: Callable[..., GasProcess], tls_files: TLSFiles
) -> None:
    port = free_port()
    gas = start_gas(["--demo", f"--healthPort={port}", "--healthHost=127.0.0.1"], tls=tls_files)
    gas.wait_ready()
    assert _plain(port, "/readyz").json() == {"status": "ready"}
    address = _local_address()
    if address is not None:  # --healthHost=127.0.0.1: loopback only
        with pytest.raises(requests.ConnectionError):
            _plain(port, "/readyz", host=address)
