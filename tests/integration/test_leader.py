"""Leader election (gas/cluster/leader.py): the state machine on a fake clock and a fake Lease
store, then real `gas serve --leaderElect` replicas against the API-server double."""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gas.cluster.leader import ElectionConfig, Elector, LeaderGatedCluster
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles
from tests.support.leases import Clock, FakeStore, Unavailable
from tests.support.ledger_checks import assert_consistent, ledger_of
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for

CONFIG = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 2.0}


def make(store: FakeStore, clock: Clock, name: str, **config: Any) -> Elector:
    wall = iter(range(10**9))
    return Elector(
        store,
        ElectionConfig(identity=name, **{**CONFIG, **config}),
        clock=clock,
        wall=lambda: f"t{next(wall)}",
    )


# ------------------------------------------------------------------ the state machine


def test_acquires_a_free_lease_and_renews_it() -> None:
    store, clock = FakeStore(), Clock()
    a = make(store, clock, "a")
    assert not a.is_leader()
    assert a.step() and a.is_leader()
    assert store.lease is not None
    assert (store.lease.holder, store.lease.duration_seconds) == ("a", 15)
    first = store.lease
    clock.advance(2)
    assert a.step()
    assert store.lease.holder == "a" and store.lease.renew_time != first.renew_time
    assert store.lease.acquire_time == first.acquire_time
    assert store.lease.transitions == first.transitions == 0
    # Renewing every retryPeriod keeps it leader long past renewDeadline.
    for _ in range(20):
        clock.advance(2)
        assert a.step() and a.is_leader()


def test_respects_a_held_unexpired_lease() -> None:
    store, clock = FakeStore(), Clock()
    a, b = make(store, clock, "a"), make(store, clock, "b")
    assert a.step()
    writes = store.writes
    for _ in range(7):  # 14 s without a renewal from a: not yet 15 s of silence
        assert not b.step() and not b.is_leader()
        clock.advance(2)
    assert store.writes == writes and store.lease is not None and store.lease.holder == "a"


def test_takes_over_an_expired_lease_after_lease_duration_of_silence() -> None:
    store, clock = FakeStore(), Clock()
    a, b = make(store, clock, "a"), make(store, clock, "b")
    assert a.step()
    assert not b.step()  # b sees a's record now
    clock.advance(9.9)
    assert a.is_leader()
    clock.advance(0.2)  # renewDeadline passed without a renewal: a has stepped down
    assert not a.is_leader()
    clock.advance(4.8)
    assert not b.step()  # 14.9 s: still a's
    clock.advance(0.2)
    assert b.step() and b.is_leader()
    assert store.lease is not None
    assert (store.lease.holder, store.lease.transitions) == ("b", 1)
    # a comes back, sees b holding it, and stays a follower.
    assert not a.step() and not a.is_leader()


def test_a_newcomer_waits_a_full_lease_duration_whatever_the_renew_time() -> None:
    """Others' renewTime is another machine's wall clock: a replica that has just started
    times the silence itself, from when it first saw the record."""
    store, clock = FakeStore(), Clock()
    a = make(store, clock, "a")
    assert a.step()
    clock.advance(100)  # a is long dead, its renewTime long past
    b = make(store, clock, "b")
    assert not b.step()
    clock.advance(14.9)
    assert not b.step()
    clock.advance(0.2)
    assert b.step()


def test_steps_down_when_renewals_fail_past_the_renew_deadline() -> None:
    store, clock = FakeStore(), Clock()
    a, b = make(store, clock, "a"), make(store, clock, "b")
    assert a.step()
    assert not b.step()
    store.fail = True
    for _ in range(4):
        clock.advance(2)
        with pytest.raises(Unavailable):
            a.step()
        assert a.is_leader()  # 8 s: within renewDeadline
    clock.advance(2.01)
    assert not a.is_leader()  # stepped down at 10 s, on the clock alone
    store.fail = False
    clock.advance(5)
    assert b.step() and b.is_leader()  # after 15 s of silence, and a had stopped at 10 s
    assert not a.step()


def test_a_renewal_that_hangs_does_not_extend_leadership() -> None:
    """The deadline counts from when the successful renewal *started*."""
    store, clock = FakeStore(), Clock()
    a = make(store, clock, "a")
    store.before = lambda: clock.advance(9)
    assert not a.step()  # acquired, but 9 s of its 10 s window went in the request
    store.before = lambda: None
    assert store.lease is not None and store.lease.holder == "a"
    assert a.step() and a.is_leader()


def test_a_lapsed_leader_whose_lease_nobody_took_renews_it() -> None:
    store, clock = FakeStore(), Clock()
    a = make(store, clock, "a")
    assert a.step()
    clock.advance(11)
    assert not a.is_leader()
    assert a.step() and a.is_leader()
    assert store.lease is not None and store.lease.transitions == 0


def test_release_on_stop_lets_a_follower_take_over_at_once() -> None:
    store, clock = FakeStore(), Clock()
    a, b = make(store, clock, "a"), make(store, clock, "b")
    assert a.step() and not b.step()
    a.stop()
    assert not a.is_leader()
    assert store.lease is not None and store.lease.holder == ""
    assert b.step() and b.is_leader()


def test_of_two_candidates_racing_for_a_free_lease_one_wins() -> None:
    store, clock = FakeStore(), Clock()
    a, b = make(store, clock, "a"), make(store, clock, "b")
    requests = 0

    def before() -> None:
        nonlocal requests
        requests += 1
        if requests == 2:  # a has read "no Lease"; b does a whole round before a writes
            store.before = lambda: None
            assert b.step()

    store.before = before
    assert not a.step()
    assert b.is_leader() and not a.is_leader()
    assert store.lease is not None and store.lease.holder == "b"


def test_only_a_synced_replica_campaigns() -> None:
    store, clock = FakeStore(), Clock()
    synced = False
    a = Elector(
        store,
        ElectionConfig(identity="a", **CONFIG),
        clock=clock,
        eligible=lambda: synced,
    )
    assert not a.step() and store.lease is None
    synced = True
    assert a.step()


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        ElectionConfig(identity="a", lease_duration=10, renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError):
        ElectionConfig(identity="a", lease_duration=15, renew_deadline=2, retry_period=2)
    with pytest.raises(ValueError):
        ElectionConfig(identity="")


@pytest.mark.parametrize("seed", range(8))
def test_never_two_leaders_in_a_long_run_with_delays_and_failures(seed: int) -> None:
    """Three replicas; requests are delayed before and after the server applies them (up
    to longer than renewDeadline), lost before, or their answers lost after. After every
    tick of the clock, at most one replica considers itself leader."""
    rng = random.Random(seed)
    store, clock = FakeStore(), Clock()
    short = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.5}
    electors = [make(store, clock, name, **short) for name in "abc"]
    leader_time = dict.fromkeys("abc", 0.0)

    def check() -> None:
        leaders = [e.identity for e in electors if e.is_leader()]
        assert len(leaders) <= 1, f"two leaders at {clock.now}: {leaders}"

    clock.watchers.append(check)

    def delay() -> None:
        roll = rng.random()
        if roll < 0.05:
            clock.advance(rng.uniform(1.0, 4.0))  # a stalled request
        elif roll < 0.6:
            clock.advance(rng.uniform(0.0, 0.2))

    def before() -> None:
        delay()
        if rng.random() < 0.05:
            raise Unavailable("lost before the server")

    def after() -> None:
        if rng.random() < 0.05:
            raise Unavailable("answer lost")
        delay()

    store.before, store.after = before, after
    for _ in range(3000):
        elector = rng.choice(electors)
        with _suppress():
            elector.step()
        check()
        step = rng.uniform(0.0, 0.3)
        for e in electors:
            if e.is_leader():
                leader_time[e.identity] += step
        clock.advance(step)
    total = sum(leader_time.values())
    assert total > 0.3 * (clock.now - 1000.0) / 3, leader_time  # progress, not just safety


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, value: object, traceback: object) -> bool:
        return kind is not None and issubclass(kind, Unavailable)  # type: ignore[arg-type]


def test_the_thread_renews_and_the_gate_follows_leadership() -> None:
    store = FakeStore()
    changes: list[bool] = []
    elector = Elector(
        store,
        ElectionConfig(identity="a", lease_duration=1.0, renew_deadline=0.6, retry_period=0.1),
        on_change=changes.append,
    )

    class Cluster:
        started = stopped = False
        sync = True

        def start(self) -> None:
            self.started = True

        def stop(self) -> None:
            self.stopped = True

        def synced(self) -> bool:
            return self.sync

        def extra(self) -> str:
            return "delegated"

    inner = Cluster()
    gated = LeaderGatedCluster(inner, elector)
    assert not gated.synced()
    gated.start()
    assert inner.started
    wait_for(gated.synced, timeout=5, what="leadership")
    inner.sync = False
    assert not gated.synced()
    inner.sync = True
    assert gated.extra() == "delegated"
    time.sleep(1.0)  # several renewals
    assert gated.synced()
    store.fail = True
    wait_for(lambda: not gated.synced(), timeout=2, what="step down")
    store.fail = False
    wait_for(gated.synced, timeout=5, what="leadership again")
    gated.stop()
    assert inner.stopped and not gated.synced()
    assert store.lease is not None and store.lease.holder == ""
    assert changes[:3] == [True, False, True] and changes[-1] is False


# ------------------------------------------------------------------ real replicas

NAMESPACE = "gas-system"
LEASE = "gas-extender"
ELECT = [
    "--leaderElect",
    f"--leaderElectNamespace={NAMESPACE}",
    "--leaseDuration=2s",
    "--renewDeadline=1500ms",
    "--retryPeriod=0.3s",
]
LEASE_DURATION = 2.0


def _status(gas: GasProcess, path: str = "/readyz") -> int:
    try:
        return gas.session.get(gas.url + path, timeout=2).status_code
    except Exception:
        return 0


def _pair(
    start_gas: Callable[..., GasProcess], kubeconfig: str, tls_files: TLSFiles
) -> tuple[GasProcess, GasProcess]:
    """Two replicas; (leader, follower) once one of them leads."""
    replicas = [start_gas(["--kubeConfig", kubeconfig, *ELECT], tls=tls_files) for _ in "ab"]

    def leader() -> GasProcess | None:
        ready = [g for g in replicas if _status(g) == 200]
        return ready[0] if len(ready) == 1 else None

    first = wait_for(leader, timeout=30, what="one ready replica")
    other = replicas[1 - replicas.index(first)]
    wait_for(lambda: _status(other, "/healthz") == 200, timeout=30, what="the follower up")
    return first, other


def _filter(gas: GasProcess, pod: dict[str, Any] | None, *nodes: str) -> Any:
    return gas.post("/scheduler/filter", {"Pod": pod, "NodeNames": list(nodes)})


def _bind(gas: GasProcess, apiserver: ApiServerDouble, name: str, node: str) -> Any:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    meta = pod["metadata"]
    return gas.post(
        "/scheduler/bind",
        {"PodName": name, "PodNamespace": "default", "PodUID": meta["uid"], "Node": node},
    )


def _schedule(gas: GasProcess, apiserver: ApiServerDouble, name: str, node: str) -> str:
    pod = apiserver.get_pod("default", name)
    reply = _filter(gas, pod, node)
    assert reply.status_code == 200, reply.text
    assert reply.json()["NodeNames"] == [node], reply.text
    response = _bind(gas, apiserver, name, node)
    assert response.status_code == 200 and response.json()["Error"] == "", response.text
    bound = apiserver.get_pod("default", name)
    assert bound is not None
    cards: str = bound["metadata"]["annotations"]["gas-container-cards"]
    return cards


def test_one_replica_leads_and_the_follower_takes_over_with_its_warm_ledger(
    apiserver: ApiServerDouble,
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
) -> None:
    # One node, two cards of one GPU each: two pods fill it, a third must not fit.
    apiserver.add_node(gpu_node("n1", "0.1", i915="2"))
    for name in ("p1", "p2", "p3"):
        apiserver.add_pod(gpu_pod(name, container(i915="1")))
    leader, follower = _pair(start_gas, kubeconfig, tls_files)
    lease = apiserver.get_lease(NAMESPACE, LEASE)
    assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 2

    # The follower answers 503 and is not ready; the leader schedules.
    assert _status(follower) == 503
    p1 = apiserver.get_pod("default", "p1")
    assert _filter(follower, p1, "n1").status_code == 503
    assert _bind(follower, apiserver, "p1", "n1").status_code == 503
    assert _schedule(leader, apiserver, "p1", "n1") == "card0"
    assert "gas_leader 1.0" in leader.session.get(leader.url + "/metrics", timeout=5).text
    assert "gas_leader 0.0" in follower.session.get(follower.url + "/metrics", timeout=5).text
    # The follower's ledger follows the watch.
    wait_for(lambda: "p1" in str(ledger_of(follower)["pods"]), what="p1 in the follower")
    # Synced now, it says why it still refuses: another replica leads (once its election
    # has read the Lease: until then, that it has not acquired it).
    refusal = "gas is synced but this replica does not answer the scheduler now: "
    holds = f"{refusal}replica {lease['spec']['holderIdentity']} holds the Lease"

    def refused() -> str:
        answer = _bind(follower, apiserver, "p2", "n1")
        assert answer.status_code == 503
        error = str(answer.json()["Error"])
        assert error in (holds, f"{refusal}this replica has not acquired the Lease yet")
        return error

    wait_for(lambda: refused() == holds, timeout=5, what="the follower naming the leader")
    readyz = follower.session.get(follower.url + "/readyz", timeout=5)
    assert (readyz.status_code, readyz.json()) == (503, {"status": holds})
    metrics = follower.session.get(follower.url + "/metrics", timeout=5).text
    assert 'gas_requests_total{outcome="inactive",verb="bind"}' in metrics

    leader.kill(signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: _status(follower) == 200, timeout=LEASE_DURATION + 5, what="takeover")
    took = time.monotonic() - killed
    assert took < LEASE_DURATION + 2.0, took
    # Warm ledger: card0 is p1's, so p2 gets card1 and p3 no card at all.
    assert _schedule(follower, apiserver, "p2", "n1") == "card1"
    p3 = apiserver.get_pod("default", "p3")
    reply = _filter(follower, p3, "n1").json()
    assert reply["NodeNames"] == [] and "n1" in reply["FailedNodes"], reply
    assert_consistent(follower, apiserver)
    lease = apiserver.get_lease(NAMESPACE, LEASE)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1


def test_a_leader_cut_off_from_the_lease_stops_answering_before_the_follower_starts(
    apiserver: ApiServerDouble,
    start_gas: Callable[..., GasProcess],
    kubeconfig: str,
    tls_files: TLSFiles,
) -> None:
    """Both /readyz are polled, alternately, as fast as they answer (a few ms per round
    on an idle machine; the largest gap between two polls of one replica is asserted
    to stay well under the 0.5 s margin between renewDeadline and leaseDuration)."""
    apiserver.add_node(gpu_node("n1", "0.1", i915="2"))
    leader, follower = _pair(start_gas, kubeconfig, tls_files)
    lease = apiserver.get_lease(NAMESPACE, LEASE)
    assert lease is not None
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            a = _status(leader)
            b = _status(follower)
            samples.append((time.monotonic(), a, b))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(0.3)
    cut = time.monotonic()
    # Only the leader's writes fail (a path fault would also stop the follower's takeover).
    apiserver.lease_cut_off.add(lease["spec"]["holderIdentity"])
    wait_for(lambda: samples[-1][2] == 200, timeout=LEASE_DURATION + 8, what="follower leads")
    time.sleep(0.3)
    stop.set()
    poller.join(timeout=5)
    # Never both ready in one sample, and the hand-over ran in order: the leader's last
    # ready sample comes before the follower's first.
    assert all(not (a == 200 and b == 200) for _, a, b in samples)
    last_leader = max(t for t, a, _ in samples if a == 200)
    first_follower = min(t for t, _, b in samples if b == 200)
    assert cut < last_leader < first_follower
    # The leader stepped down at about renewDeadline after its last renewal.
    assert last_leader - cut < 1.5 + 0.5
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(samples)]
    assert max(gaps) < 0.5, max(gaps)
    # It stays down while its renewals fail.
    assert _status(leader) == 503
    reply = _filter(leader, gpu_pod("x", container(i915="1")), "n1")
    assert reply.status_code == 503


# ------------------------------------------------------------------ flags


def test_duration_flags_take_go_durations() -> None:
    from gas.cli import build_parser

    args = build_parser().parse_args(
        ["serve", "--leaderElect", "--leaseDuration=1m30s", "--renewDeadline=1500ms"]
    )
    assert args.leaderElect is True
    assert (args.leaseDuration, args.renewDeadline, args.retryPeriod) == (90.0, 1.5, 2.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--leaseDuration=15"])


def test_leader_election_refuses_the_demo_cluster_and_bad_durations() -> None:
    from gas.cli import main

    assert main(["serve", "--demo", "--leaderElect"]) == 2
    assert main(["serve", "--demo", "--leaderElect", "--renewDeadline=20s"]) == 2
