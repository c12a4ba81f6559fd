"""Hostile peers cannot stop gas (docs/serving.md): while each attack of
`tests/support/attacks.py` runs against the real `gas serve` or `gas webhook` (gunicorn,
real TLS sockets, the attack in its own process), a legitimate client on a new connection
gets a correct answer every time within PROBE_BOUND, the worker's peak memory stays within
MEMORY_BOUND of what it used before, and afterwards a filter and a bind still work and the
ledger holds exactly what was bound.

The timeouts are shortened (3 s) so that what they close is seen within an attack's
time; the defaults are tested at their edges in tests/unit/test_front.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.admission import gpu_pod as review_pod
from tests.support.admission import review_request
from tests.support.gasproc import GasProcess, TLSFiles, child_pids, free_port, make_tls_files
from tests.support.h2client import H2Client
from tests.support.promtext import total
from tests.support.webhookproc import WebhookProcess

pytestmark = pytest.mark.integration

ATTACK_SECONDS = {"never_reads": 12.0}
"""How long each attack runs (5 s unless named): a peer that never reads fills the
kernel's socket buffers (megabytes on loopback) before gas's own output backs up and its
write timeout starts. How soon they are full depends on how fast gas writes its answers:
with the suite's other worker busy, 9 s once left the webhook's write timeout (2 s) no
time to end a connection before the attacker closed it."""
PROBE_BOUND = 2.0
"""Seconds within which every legitimate request is answered, its TLS handshake included."""
MEMORY_BOUND = 160 * 1024 * 1024
"""Growth of the worker's peak RSS over its RSS before an attack: the process's buffered
bytes bound (64 MiB) and the per-connection state of every connection the attacks open."""
SHORT = ["--handshakeTimeout", "3", "--headerTimeout", "3", "--writeTimeout", "2"]

ATTACKS = [
    "idle_h2",
    "silent_tcp",
    "stalled_tls",
    "slow_heads",
    "rapid_reset",
    "unfinished_bodies",
    "control_flood",
    "never_reads",
]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("hostile-tls"))


@pytest.fixture(scope="module")
def serve(tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GasProcess]:
    log = tmp_path_factory.mktemp("hostile-serve") / "gas.log"
    process = GasProcess(["--demo", *SHORT], log, tls_files)
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def health(
    tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GasProcess, int]]:
    """`gas serve --demo` with its plain-HTTP health port, and that port."""
    log = tmp_path_factory.mktemp("hostile-health") / "gas.log"
    port = free_port()
    process = GasProcess(["--demo", "--healthPort", str(port), *SHORT], log, tls_files)
    try:
        process.wait_ready()
        yield process, port
    finally:
        process.stop()


@pytest.fixture(scope="module")
def webhook(
    tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    log = tmp_path_factory.mktemp("hostile-webhook") / "webhook.log"
    process = WebhookProcess(SHORT, log, tls_files)
    try:
        process.wait_status("/healthz", 200)
        yield process
    finally:
        process.stop()


def worker_memory(process: GasProcess) -> tuple[int, int]:
    """The worker's RSS and peak RSS (bytes), from /proc."""
    (pid,) = child_pids(process.process.pid)
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak(process: GasProcess) -> None:
    (pid,) = child_pids(process.process.pid)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def start_attack(
    name: str, port: int, tls: TLSFiles | None, certificate: bool
) -> subprocess.Popen[str]:
    """The attack `name` on `port`: over TLS trusting `tls.ca`, else over plain HTTP."""
    command = [sys.executable, "-m", "tests.support.attacks", name, str(port)]
    command += [str(ATTACK_SECONDS.get(name, 5.0)), tls.ca if tls is not None else "-"]
    if certificate and tls is not None:
        command += [tls.client_cert, tls.client_key]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def fresh_session(tls: TLSFiles, certificate: bool) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = tls.ca
    if certificate:
        session.cert = (tls.client_cert, tls.client_key)
    return session


FILTER = {
    "Pod": {
        "metadata": {"name": "probe", "namespace": "default", "uid": "probe-uid"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"gpu.intel.com/i915": "1"}}}]
        },
    },
    "NodeNames": ["demo-1card", "demo-2cards", "demo-4cards", "demo-cpu-only"],
}


def probe_serve(serve: GasProcess, tls: TLSFiles, round_: int) -> dict[str, Any]:
    """A filter on a new connection: HTTP/1.1 and h2 in turn."""
    if round_ % 2:
        with H2Client(serve.port, tls, timeout=PROBE_BOUND) as client:
            response = client.request("POST", "/scheduler/filter", json.dumps(FILTER).encode())
            assert response.status == 200
            answer: dict[str, Any] = json.loads(response.body)
            return answer
    with fresh_session(tls, True) as session:
        reply = session.post(serve.url + "/scheduler/filter", json=FILTER, timeout=PROBE_BOUND)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        return answer


def probe_webhook(webhook: WebhookProcess, tls: TLSFiles, round_: int) -> dict[str, Any]:
    """An AdmissionReview of a GPU pod on a new connection, as the API server sends it."""
    pod = review_pod("probe", {"gpu.intel.com/i915": "1"})
    with fresh_session(tls, False) as session:
        reply = session.post(
            webhook.url + "/admission/pods", json=review_request(pod), timeout=PROBE_BOUND
        )
        assert reply.status_code == 200, reply.text
        answer: dict[str, Any] = reply.json()["response"]
        return {"allowed": answer["allowed"], "patched": "patch" in answer}


def under_attack(
    name: str,
    process: GasProcess,
    tls: TLSFiles | None,
    certificate: bool,
    probe: Callable[[int], dict[str, Any]],
    port: int | None = None,
) -> tuple[dict[str, Any], list[float]]:
    """Runs the attack `name` on `port` (gas's main port by default) while `probe` asks
    on a new connection, again and again."""
    expected = probe(0)
    reset_peak(process)
    before, _ = worker_memory(process)
    attack = start_attack(name, port or process.port, tls, certificate)
    times = []
    round_ = 0
    try:
        time.sleep(0.5)  # the attack's connections first
        while attack.poll() is None:
            round_ += 1
            started = time.monotonic()
            answer = probe(round_)
            times.append(time.monotonic() - started)
            assert answer == expected, f"probe {round_} during {name}"
            time.sleep(0.1)
        out, _ = attack.communicate(timeout=30)
    finally:
        if attack.poll() is None:
            attack.kill()
            attack.wait()
    assert attack.returncode == 0
    _, peak = worker_memory(process)
    assert times, "no probe ran during the attack"
    slowest = max(times)
    assert slowest <= PROBE_BOUND, f"{name}: slowest probe {slowest:.3f} s"
    grown = peak - before
    assert grown <= MEMORY_BOUND, f"{name}: the worker's peak RSS grew {grown >> 20} MiB"
    print(
        f"{name}: {len(times)} probes, slowest {slowest * 1000:.0f} ms, "
        f"peak RSS +{grown >> 20} MiB; the attack saw {out.strip()}"
    )
    result: dict[str, Any] = json.loads(out)
    return result, times


def metrics(process: GasProcess, tls: TLSFiles, certificate: bool) -> str:
    with fresh_session(tls, certificate) as session:
        return session.get(process.url + "/metrics", timeout=5).text


def check_attack(name: str, seen: dict[str, Any], text: str, log: str) -> None:
    """What each attack must have met, beyond the others being served."""
    closed = {
        reason: total(text, "gas_connections_closed_total", reason=reason)
        for reason in ("handshake_timeout", "header_timeout", "write_timeout")
    }
    if name in ("silent_tcp", "stalled_tls"):
        assert seen["closed_by_server"] == seen["opened"]
        assert closed["handshake_timeout"] >= seen["opened"]
    elif name == "slow_heads" or (name == "idle_h2" and seen["h2"]):
        assert seen["closed_by_server"] == seen["opened"]
        assert closed["header_timeout"] >= seen["opened"]
    elif name == "rapid_reset" and seen["h2"]:
        assert seen["enhance_your_calm"] >= 1
        judged = log.count('"pod":"default/reset-me"')
        assert judged <= seen["resets_sent"] // 100, f"{judged} reset filters judged"
        assert "closed connection from 127.0.0.1" in log and "reset_flood" in log
    elif name == "unfinished_bodies" and seen["h2"]:
        # The connection's window (the app's 8 MiB body limit and 1 MiB), never more.
        assert seen["body_bytes_sent"] <= 3 * (9 * 1024 * 1024 + 65535)
    elif name == "control_flood" and seen["h2"]:
        # Each connection closed by the server, none left blocked.
        assert seen["closed_by_server"] >= seen["connections"] - 2
        assert seen["closed_by_server"] >= 2
        assert "control_flood" in log
    elif name == "never_reads":
        assert seen["requests_sent"] > 0
        assert closed["write_timeout"] >= 1


@pytest.mark.parametrize("name", ATTACKS)
def test_gas_serve_answers_others_while_attacked(
    name: str, serve: GasProcess, tls_files: TLSFiles
) -> None:
    before = serve.get_json("/debug/ledger")
    seen, _ = under_attack(name, serve, tls_files, True, lambda r: probe_serve(serve, tls_files, r))
    check_attack(name, seen, metrics(serve, tls_files, True), serve.log())
    # Afterwards: a filter and a bind work, and the ledger holds what was bound, no more.
    assert serve.get_json("/debug/ledger") == before
    uid = f"after-{name}-{uuid.uuid4().hex[:6]}"
    pod = {"metadata": {"name": f"after-{name}", "namespace": "default", "uid": uid}}
    asked = json.loads(json.dumps(FILTER))
    asked["Pod"]["metadata"] = pod["metadata"]
    filtered = serve.post("/scheduler/filter", asked).json()
    assert "demo-4cards" in filtered["NodeNames"]
    assert serve.bind(pod, "demo-4cards") == ""
    ledger = json.dumps(serve.get_json("/debug/ledger"))
    assert uid in ledger


@pytest.mark.parametrize("name", ATTACKS)
def test_gas_webhook_answers_others_while_attacked(
    name: str, webhook: WebhookProcess, tls_files: TLSFiles
) -> None:
    seen, _ = under_attack(
        name, webhook, tls_files, False, lambda r: probe_webhook(webhook, tls_files, r)
    )
    if name in ("idle_h2", "rapid_reset", "unfinished_bodies", "control_flood"):
        assert seen["h2"] is False  # the webhook offers HTTP/1.1 only
    check_attack(name, seen, metrics(webhook, tls_files, False), webhook.log())
    assert probe_webhook(webhook, tls_files, 0) == {"allowed": True, "patched": True}


HEALTH_ATTACKS = ["silent_tcp", "stalled_tls", "slow_heads", "never_reads"]


@pytest.mark.parametrize("name", HEALTH_ATTACKS)
def test_the_health_port_answers_probes_while_attacked(
    name: str, health: tuple[GasProcess, int], tls_files: TLSFiles
) -> None:
    process, port = health

    def probe(round_: int) -> dict[str, Any]:
        with requests.Session() as session:
            session.trust_env = False
            reply = session.get(f"http://127.0.0.1:{port}/healthz", timeout=PROBE_BOUND)
            return {"status": reply.status_code, "body": reply.json()}

    seen, _ = under_attack(name, process, None, False, probe, port=port)
    text = metrics(process, tls_files, True)
    if name == "silent_tcp":
        assert seen["closed_by_server"] == seen["opened"]
        # Plain HTTP: a silent connection waits for its first request's head.
        assert total(text, "gas_connections_closed_total", reason="header_timeout") >= 300
    elif name == "stalled_tls":
        # Not HTTP at all: refused at once.
        assert seen["closed_by_server"] == seen["opened"]
        assert total(text, "gas_connections_closed_total", reason="malformed") >= 300
    elif name == "never_reads":
        # Its answers are small: the kernel's socket buffers take them all for longer
        # than the attack runs, so no write timeout is reached (the main port's is).
        assert seen["requests_sent"] > 0
    else:
        check_attack(name, seen, text, process.log())
    assert probe(0) == {"status": 200, "body": {"status": "ok"}}


def test_gas_nodes_metrics_port_holds_silent_peers_without_a_thread_each() -> None:
    from gas.node.metrics import NodeMetrics

    port = free_port()
    server = NodeMetrics().serve(port, "127.0.0.1")
    socks: list[socket.socket] = []
    try:
        threads = threading.active_count()
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
        started = time.monotonic()
        with requests.Session() as session:
            session.trust_env = False
            reply = session.get(f"http://127.0.0.1:{port}/metrics", timeout=PROBE_BOUND)
        assert time.monotonic() - started <= PROBE_BOUND
        assert reply.status_code == 200
        assert "# TYPE gas_node_decisions_total counter" in reply.text
        assert "gas_open_connections 301.0" in reply.text  # the 300 and the probe's own
        assert threading.active_count() <= threads + 1  # at most the one answering thread
    finally:
        for sock in socks:
            sock.close()
        server.stop()
