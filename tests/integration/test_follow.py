"""`gas serve --schedulerLease`: two real gas processes, one per scheduler pod, follow the
Lease that the test writes as kube-scheduler's leader election writes it, against the
API-server double. Only the gas whose pod's scheduler holds the Lease binds; at a crash
hand-over the old one stops before the new one starts, and each pod is bound once."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import pytest

from gas.cluster.follow import RECHECK_INTERVAL
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.objects import binding_args, gpu_node, gpu_pod
from tests.support.polling import wait_for

NAMESPACE = "gas-system"
LEASE = "gas-scheduler"
DURATION = 3  # leaseDurationSeconds, whole seconds as kube-scheduler writes it
RENEW_EVERY = 0.5  # kube-scheduler's retryPeriod, shortened as the duration is
FOLLOW = [
    f"--schedulerLease={LEASE}",
    f"--leaderElectNamespace={NAMESPACE}",
    "--retryPeriod=300ms",
]


# renewTime as the API server stores it (RFC 3339, microseconds, Z).
MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class SchedulerLease:
    """kube-scheduler's side of the Lease, through the official client over HTTP: create
    it, renew it as its holder every RENEW_EVERY on a thread, stop renewing (a crash), and
    take it over as another holder."""

    def __init__(self, kubeconfig: str) -> None:
        client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        # Typed loosely: the bodies are plain dicts, as client-go's JSON is.
        self._api: Any = kubernetes.client.CoordinationV1Api(client)
        self.holder = ""
        self.renewed_at = 0.0  # time.time() of the last renewal's renewTime
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self, holder: str) -> None:
        moment = datetime.now(UTC)
        now = moment.strftime(MICRO_TIME)
        try:
            old = self._api.read_namespaced_lease(LEASE, NAMESPACE)
        except kubernetes.client.ApiException as exc:
            assert exc.status == 404
            old = None
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NAMESPACE},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": DURATION,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        if old is None:
            self._api.create_namespaced_lease(NAMESPACE, body)
        else:
            body["metadata"]["resourceVersion"] = old.metadata.resource_version
            same = old.spec.holder_identity == holder
            transitions = old.spec.lease_transitions or 0
            body["spec"]["leaseTransitions"] = transitions + (not same)
            if same and old.spec.acquire_time is not None:
                body["spec"]["acquireTime"] = old.spec.acquire_time.strftime(MICRO_TIME)
            self._api.replace_namespaced_lease(LEASE, NAMESPACE, body)
        self.holder = holder
        self.renewed_at = moment.timestamp()

    def hold(self, holder: str) -> None:
        """Acquire (or take over) as `holder` and renew on a thread."""
        self.crash()
        self._write(holder)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, args=(self._stop,), daemon=True)
        self._thread.start()

    def _renew(self, stop: threading.Event) -> None:
        while not stop.wait(RENEW_EVERY):
            self._write(self.holder)

    def release(self) -> None:
        """Stop renewing and give the Lease up, as kube-scheduler does on SIGTERM (client-go's
        release: no holder)."""
        self.crash()
        self._write("")

    def crash(self) -> None:
        """Stop renewing without releasing, as a kube-scheduler that dies."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


@dataclass(frozen=True)
class Answer:
    started: float
    ended: float
    status: int
    error: str


def _start(
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    monkeypatch: pytest.MonkeyPatch,
    pod: str,
    *extra: str,
) -> GasProcess:
    # As the downward API sets it in the pod; the process takes the environment it starts with.
    monkeypatch.setenv("POD_NAME", pod)
    return start_gas(["--kubeConfig", kubeconfig, *FOLLOW, *extra], tls=tls_files)


def _bind(gas: GasProcess, pod: dict[str, Any], node: str) -> Answer:
    started = time.monotonic()
    try:
        response = gas.post("/scheduler/bind", binding_args(pod, node))
        status = response.status_code
        error = str(response.json().get("Error", ""))
    except Exception as exc:  # a sample that got no answer is no answer
        status, error = 0, str(exc)
    return Answer(started, time.monotonic(), status, error)


def _bind_both(
    a: GasProcess, b: GasProcess, pod: dict[str, Any], node: str
) -> tuple[Answer, Answer]:
    """The same bind sent to both at once."""
    answers: dict[str, Answer] = {}

    def send(key: str, gas: GasProcess) -> None:
        answers[key] = _bind(gas, pod, node)

    threads = [threading.Thread(target=send, args=item) for item in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers["a"], answers["b"]


def test_only_the_gas_of_the_lease_holder_binds_and_a_crash_hands_over_in_order(
    apiserver: ApiServerDouble,
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kube-scheduler that does not know who leads sends every bind to both gas at once
    (two threads, the same pod): in no round do both answer, and no pod is bound twice."""
    nodes = [f"n{i}" for i in range(16)]
    for name in nodes:
        apiserver.add_node(gpu_node(name, "0.1.2.3.4.5.6.7", i915="8"))
    a = _start(start_gas, kubeconfig, tls_files, monkeypatch, "sched-a")
    b = _start(start_gas, kubeconfig, tls_files, monkeypatch, "sched-b")
    # Every synced replica is ready, the one that may not bind too; before the Lease exists.
    a.wait_ready()
    b.wait_ready()
    lease = SchedulerLease(kubeconfig)
    lease.hold(f"sched-a_{uuid.uuid4()}")

    rounds: list[tuple[str, Answer, Answer]] = []
    stop = threading.Event()
    count = iter(range(10**6))

    def drive() -> None:
        while not stop.is_set():
            name = f"p{next(count)}"
            pod = apiserver.add_pod(gpu_pod(name))
            node = nodes[len(rounds) % len(nodes)]
            rounds.append((name, *_bind_both(a, b, pod, node)))
            stop.wait(0.1)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        time.sleep(1.5)
        lease.crash()
        crashed = lease.renewed_at
        # sched-b's client-go takes the Lease a full leaseDuration after it last saw it
        # change, and it polls every retryPeriod: here, a little after renewTime + duration.
        while time.time() < crashed + DURATION + 0.3:
            time.sleep(0.02)
        took_over = time.monotonic()
        lease.hold(f"sched-b_{uuid.uuid4()}")
        time.sleep(1.5)
    finally:
        stop.set()
        driver.join(timeout=30)
        lease.crash()

    assert rounds, "no bind was sent"
    # Never both in one round.
    assert not [name for name, x, y in rounds if x.status == 200 and y.status == 200]
    by_a = [x for _, x, _ in rounds if x.status == 200]
    by_b = [y for _, _, y in rounds if y.status == 200]
    assert by_a and by_b, rounds
    # Every other answer is the follower's 503.
    assert {x.status for _, x, _ in rounds} <= {200, 503}
    assert {y.status for _, _, y in rounds} <= {200, 503}
    # In order: a's last answer ended before b's first began, and b answered only once its
    # scheduler held the Lease.
    assert max(x.ended for x in by_a) < min(y.started for y in by_b)
    assert max(x.ended for x in by_a) < took_over
    # a kept answering on its last reading until close to the Lease's end, not beyond.
    crashed_mono = time.monotonic() - (time.time() - crashed)
    last_a = max(x.started for x in by_a)
    assert crashed_mono + 1.5 < last_a < crashed_mono + DURATION + 0.1, last_a - crashed_mono
    # b answered within its verbs' reading interval of its scheduler taking the Lease
    # (this driver sends b verbs before that, which a scheduler does not: see the next test).
    assert min(y.started for y in by_b) - took_over < RECHECK_INTERVAL + 0.3
    # a refuses from then on.
    assert all(x.status == 503 for _, x, _ in rounds if x.started > took_over)
    # Every answered bind bound its pod, each pod once, by one Binding.
    bound = [name for name, x, y in rounds if 200 in (x.status, y.status)]
    assert all(
        (x.error if x.status == 200 else y.error) == ""
        for _, x, y in rounds
        if 200 in (x.status, y.status)
    )
    bindings = [p for m, p in apiserver.requests if m == "POST" and p.endswith("/binding")]
    assert sorted(bindings) == sorted(f"/api/v1/namespaces/default/pods/{n}/binding" for n in bound)
    for name, _, _ in rounds:
        stored = apiserver.get_pod("default", name)
        assert stored is not None
        assert bool(stored["spec"].get("nodeName")) == (name in bound), name
    # gas_leader follows the Lease.
    metrics = {g: g.session.get(g.url + "/metrics", timeout=5).text for g in (a, b)}
    assert "gas_leader 0.0" in metrics[a] and "gas_leader 1.0" in metrics[b]
    assert "is held by sched-b_" in a.log()


def test_a_graceful_release_hands_over_at_the_next_verb(
    apiserver: ApiServerDouble,
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-scheduler releases its Lease on SIGTERM (empty holder); the other scheduler
    takes it at its next retry and its gas answers its first verb."""
    apiserver.add_node(gpu_node("n1", "0.1", i915="2"))
    lease = SchedulerLease(kubeconfig)
    lease.hold(f"sched-a_{uuid.uuid4()}")
    try:
        a = _start(start_gas, kubeconfig, tls_files, monkeypatch, "sched-a", "--retryPeriod=10s")
        b = _start(start_gas, kubeconfig, tls_files, monkeypatch, "sched-b", "--retryPeriod=10s")
        a.wait_ready()
        b.wait_ready()
        p1 = apiserver.add_pod(gpu_pod("p1"))
        p2 = apiserver.add_pod(gpu_pod("p2"))
        wait_for(lambda: _bind(a, p1, "n1").status == 200, timeout=15, what="a answering")
        refused = _bind(b, p2, "n1")
        # Synced but not the scheduler's gas: it says so, never that it is not synced.
        assert refused.status == 503
        assert refused.error.startswith(
            "gas is synced but this replica does not answer the scheduler now: "
            f"the Lease is held by {lease.holder}, not by this pod (sched-b)"
        ), refused.error
        # A scheduler calls its gas only once it leads; this test's call above was made
        # before, so the reading it caused must be older than the verbs' interval.
        time.sleep(RECHECK_INTERVAL)
        lease.release()
        lease.hold(f"sched-b_{uuid.uuid4()}")
        # b reads the Lease only every 10 s on its own; the verb reads it at once.
        answer = _bind(b, p2, "n1")
        assert (answer.status, answer.error) == (200, "")
    finally:
        lease.crash()


def test_follow_mode_refuses_leader_election_and_the_demo_cluster(
    kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    from gas.cli import main

    both = ["--kubeConfig", kubeconfig, "--unsafe", "--schedulerLease", LEASE, "--leaderElect"]
    assert main(["serve", *both]) == 2
    assert "--schedulerLease and --leaderElect do not go together" in caplog.text
    assert main(["serve", "--demo", "--schedulerLease", LEASE]) == 2
    assert "--schedulerLease needs a Kubernetes cluster" in caplog.text
