"""End to end: the real `gas serve` places pods (kube-scheduler emulator, API-server double),
a real `gas node` per node and its kubelet double admit them; every container must get
exactly the cards (and tile mask) gas wrote into its pod's annotations."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gas.core.model import parse_cards, parse_tiles
from gas.node.allocation import affinity_mask, composite_hierarchy
from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import FakeCard
from tests.support.gasproc import GasProcess
from tests.support.kubelet import Admission, response_cards
from tests.support.ledger_checks import wait_for_nodes
from tests.support.nodeproc import NodeRig
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.scheduler import SchedulerEmulator

SHARES = 10


@pytest.fixture
def cluster(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> Iterator[Callable[..., NodeRig]]:
    made: list[NodeRig] = []

    def add(name: str, cards: list[FakeCard], labels: dict[str, str] | None = None) -> NodeRig:
        numbers = ".".join(str(c.number) for c in cards)
        tiles = sum(c.tiles for c in cards)
        node = gpu_node(
            name,
            numbers,
            i915=str(SHARES * len(cards)),
            millicores=str(1000 * len(cards)),
            memory_max=f"{16 * len(cards)}Gi",
            tiles=str(tiles),
        )
        node["metadata"]["labels"].update(labels or {})
        apiserver.add_node(node)
        rig = NodeRig(apiserver, kubeconfig, name, cards, tmp_path, seed=len(made))
        made.append(rig)
        return rig

    yield add
    for rig in made:
        rig.close()


def expected(pod: dict[str, Any], index: int, cards: dict[str, FakeCard]) -> tuple[Any, ...]:
    """The cards and ZE_AFFINITY_MASK gas's annotations give container `index`."""
    notes = pod["metadata"].get("annotations") or {}
    containers = pod["spec"]["containers"]
    allocation = parse_cards(notes["gas-container-cards"], len(containers))
    mine = allocation[index]
    tiles = parse_tiles(notes.get("gas-container-tiles") or "|" * (len(containers) - 1), allocation)
    env = {e["name"]: e["value"] for e in containers[index].get("env") or []}
    mask = affinity_mask(
        tiles[index], mine, {c: cards[c].tiles for c in mine}, composite_hierarchy(env)
    )
    return tuple(sorted(mine, key=lambda c: int(c[4:]))), mask


def mismatches(apiserver: ApiServerDouble, rigs: list[NodeRig]) -> list[str]:
    """Every container whose devices are not what gas chose, as a readable line."""
    wrong = []
    for rig in rigs:
        cards = {f"card{c.number}": c for c in rig.cards}
        for admission in list(rig.kubelet.admissions.values()):
            pod = apiserver.get_pod(admission.namespace, admission.name)
            if pod is None or pod["metadata"]["uid"] != admission.uid:
                continue
            if admission.error:
                wrong.append(f"{admission.name} on {rig.node} refused: {admission.error}")
                continue
            for index, spec in enumerate(pod["spec"]["containers"]):
                got = _given(admission, spec["name"])
                want = expected(pod, index, cards)
                if got != want:
                    wrong.append(f"{admission.name}/{spec['name']} on {rig.node}: {got} != {want}")
    return wrong


def _given(admission: Admission, name: str) -> tuple[Any, ...]:
    responses = admission.responses.get(name, {})
    cards: set[str] = set()
    mask = None
    for response in responses.values():
        cards.update(response_cards(response))
        mask = response.envs.get("ZE_AFFINITY_MASK", mask)
    return tuple(sorted(cards, key=lambda c: int(c[4:]))), mask


def admitted(rigs: list[NodeRig], names: set[str], timeout: float = 30.0) -> None:
    def done() -> bool:
        seen = {a.name for r in rigs for a in list(r.kubelet.admissions.values())}
        return names <= seen

    wait_for(done, timeout=timeout, what=f"admission of {len(names)} pods")


def i915_allocatable(apiserver: ApiServerDouble, node: str) -> str | None:
    status = (apiserver.get_node(node) or {}).get("status") or {}
    value = (status.get("allocatable") or {}).get("gpu.intel.com/i915")
    return value if isinstance(value, str) else None


def bind_all(
    scheduler: SchedulerEmulator, apiserver: ApiServerDouble, names: list[str], strict: bool = True
) -> list[str]:
    """Schedule the pods concurrently, as kube-scheduler's async binding does; the names
    left unbound (a bind that lost a race for the last capacity) unless `strict`."""
    futures = [(name, scheduler.schedule("default", name)) for name in names]
    unbound = []
    for name, future in futures:
        outcome = future.result(timeout=30)
        if not outcome.bound:
            assert not strict, (outcome.pod, outcome.error, outcome.failed_nodes)
            unbound.append(name)
    return unbound


def test_features_reach_the_containers(
    apiserver: ApiServerDouble,
    gas: GasProcess,
    emulators: Callable[..., SchedulerEmulator],
    cluster: Callable[..., NodeRig],
) -> None:
    cards = [FakeCard(i, tiles=2) for i in range(6)]
    rig = cluster("n1", cards, labels={"gpu.intel.com/xe-links": "0.0-1.0_2.1-3.1"})
    rig.wait_registered()
    wait_for_nodes(gas, "n1")
    scheduler = emulators(gas)
    pods = [
        gpu_pod(
            "multi",
            container("a", i915="1", tiles="1"),
            container("sidecar"),
            container("b", i915="2", tiles="2"),
            container("c", i915="1"),
        ),
        gpu_pod(
            "same",
            container("x", i915="1", millicores="300"),
            container("y", i915="1", millicores="300"),
            annotations={"gas-same-gpu": "x,y"},
        ),
        gpu_pod(
            "linked",
            container("l", i915="2", tiles="2"),
            annotations={"gas-allocate-xelink": "true"},
        ),
        gpu_pod(
            "composite",
            {
                **container("z", i915="1", tiles="2"),
                "env": [{"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "COMPOSITE"}],
            },
        ),
    ]
    for pod in pods:
        apiserver.add_pod(pod)
    # One at a time, the most constrained first: bound concurrently, first fit can leave no
    # Xe-linked pair of free tiles for `linked` (a scheduling outcome, not this test's point).
    for name in ("linked", "composite", "multi", "same"):
        bind_all(scheduler, apiserver, [name])
    admitted([rig], {p["metadata"]["name"] for p in pods})
    assert mismatches(apiserver, [rig]) == []
    by_name = {a.name: a for a in rig.kubelet.admissions.values()}
    assert _given(by_name["same"], "x")[0] == _given(by_name["same"], "y")[0]
    # COMPOSITE hierarchy: card.tile entries
    assert "." in (_given(by_name["composite"], "z")[1] or "")


def test_order_batches_deletion_and_restarts(
    apiserver: ApiServerDouble,
    gas: GasProcess,
    emulators: Callable[..., SchedulerEmulator],
    cluster: Callable[..., NodeRig],
) -> None:
    rig = cluster("n1", [FakeCard(i) for i in range(3)])
    rig.wait_registered()
    wait_for_nodes(gas, "n1")
    scheduler = emulators(gas)

    # created p0..p7, bound in reverse, all reaching the kubelet in one batch; p3 is
    # deleted after binding, before the kubelet sees it
    rig.kubelet.paused.set()
    names = [f"p{i}" for i in range(8)]
    for name in names:
        apiserver.add_pod(gpu_pod(name, container("c", i915="1", millicores="200")))
    bind_all(scheduler, apiserver, list(reversed(names)))
    apiserver.delete_pod("default", "p3")
    rig.kubelet.paused.clear()
    admitted([rig], set(names) - {"p3"})
    assert "p3" not in {a.name for a in rig.kubelet.admissions.values()}
    assert any(len(batch) >= 7 for batch in rig.kubelet.batches)

    # pods bound, then the kubelet restarts before admitting them (its i915 capacity is 0
    # until the plugin registers again): they are admitted once it has
    rig.kubelet.paused.set()
    more = [f"q{i}" for i in range(4)]
    for name in more:
        apiserver.add_pod(gpu_pod(name, container("c", i915="1", millicores="100")))
    bind_all(scheduler, apiserver, more)
    rig.kubelet.restart()
    assert rig.kubelet.devices("gpu.intel.com/i915") == {}
    rig.wait_registered()
    # The restart published 0 devices; the next pods are schedulable once the node shows
    # them again (the kubelet writes its status after the plugin lists them).
    wait_for(lambda: i915_allocatable(apiserver, "n1") == "30", what="n1's i915 published again")
    rig.kubelet.paused.clear()
    # the agent killed and started again between pods bound and admitted
    rig.kubelet.paused.set()
    last = [f"r{i}" for i in range(4)]
    for name in last:
        apiserver.add_pod(gpu_pod(name, container("c", i915="1", millicores="100")))
    bind_all(scheduler, apiserver, last)
    rig.agent.stop(signal.SIGKILL)
    registrations = len(rig.kubelet.registrations)
    rig.agent.start()
    wait_for(lambda: len(rig.kubelet.registrations) > registrations, timeout=30, what="again")
    rig.kubelet.paused.clear()
    admitted([rig], set(more + last), timeout=60)
    assert mismatches(apiserver, [rig]) == []


def _random_pod(rng: random.Random, name: str) -> dict[str, Any]:
    kind = rng.random()
    if kind < 0.15:  # GPU containers with a plain one between
        return gpu_pod(
            name,
            container("a", i915="1", millicores=str(rng.choice((100, 200)))),
            container("side"),
            container("b", i915="1", millicores="100"),
        )
    if kind < 0.3:
        return gpu_pod(name, container("c", i915="2", millicores="200"))
    if kind < 0.4:
        return gpu_pod(
            name,
            container("x", i915="1", millicores="100"),
            container("y", i915="1", millicores="100"),
            annotations={"gas-same-gpu": "x,y"},
        )
    if kind < 0.5:  # a tile of a two-tile card: ZE_AFFINITY_MASK, FLAT or COMPOSITE
        tiled = container("t", i915="1", tiles="1", millicores="100")
        if rng.random() < 0.5:
            tiled["env"] = [{"name": "ZE_FLAT_DEVICE_HIERARCHY", "value": "COMPOSITE"}]
        return gpu_pod(name, tiled)
    return gpu_pod(name, container("c", i915="1", millicores=str(rng.choice((100, 200, 300)))))


def test_randomised_workload_has_no_mismatch(
    apiserver: ApiServerDouble,
    gas: GasProcess,
    emulators: Callable[..., SchedulerEmulator],
    cluster: Callable[..., NodeRig],
) -> None:
    seed = int(os.environ.get("GAS_NODE_SEED") or 20251)
    total = int(os.environ.get("GAS_NODE_PODS") or 500)
    rng = random.Random(seed)
    rigs = [cluster(f"n{i}", [FakeCard(c, tiles=1 + c % 2) for c in range(4)]) for i in range(3)]
    for rig in rigs:
        rig.wait_registered()
    wait_for_nodes(gas, *(r.node for r in rigs))
    scheduler = emulators(gas, seed=seed)
    created = 0
    live: list[str] = []
    deleted_early: set[str] = set()
    started = time.monotonic()
    while created < total:
        wave = [f"w{created + i}" for i in range(min(rng.randint(5, 25), total - created))]
        created += len(wave)
        order = list(wave)
        rng.shuffle(order)  # created in one order, bound in another
        for name in wave:
            apiserver.add_pod(_random_pod(rng, name))
        for name in bind_all(scheduler, apiserver, order, strict=False):
            apiserver.delete_pod("default", name)  # unbound: nothing for the node to do
            deleted_early.add(name)
        bound = [n for n in wave if n not in deleted_early]
        if bound and rng.random() < 0.3:  # deleted before (or while) the kubelet admits it
            victim = rng.choice(bound)
            apiserver.delete_pod("default", victim)
            deleted_early.add(victim)
        live += [n for n in wave if n not in deleted_early]
        # the oldest pods finish, freeing their cards for later waves
        admitted(rigs, set(live) - deleted_early, timeout=60)
        while len(live) > 30:
            done = live.pop(0)
            apiserver.set_pod_phase("default", done, "Succeeded")
            apiserver.delete_pod("default", done)
        wrong = mismatches(apiserver, rigs)
        assert not wrong, f"seed {seed}: {wrong[:10]}"
    admissions = sum(len(r.kubelet.admissions) for r in rigs)
    assert admissions >= total * 0.8, f"seed {seed}: only {admissions} of {total} admitted"
    masks = sum(
        "ZE_AFFINITY_MASK" in response.envs
        for r in rigs
        for a in r.kubelet.admissions.values()
        for by_resource in a.responses.values()
        for response in by_resource.values()
    )
    assert masks > 0, f"seed {seed}: no container was given a tile"
    took = time.monotonic() - started
    print(f"seed {seed}: {total} pods, {admissions} admitted in {took:.0f} s")


def test_an_agent_killed_while_pods_flow_hands_out_no_wrong_card(
    apiserver: ApiServerDouble,
    gas: GasProcess,
    emulators: Callable[..., SchedulerEmulator],
    cluster: Callable[..., NodeRig],
) -> None:
    """`gas node` killed while the kubelet admits a stream of pods, and started again: a
    pod admitted while it is down fails (the kubelet finds its devices unhealthy, or the
    socket gone), none gets cards other than gas's, and pods after the restart get theirs."""
    rig = cluster("n1", [FakeCard(i) for i in range(4)])
    rig.wait_registered()
    wait_for_nodes(gas, "n1")
    scheduler = emulators(gas, seed=7)
    rng = random.Random(7)
    first = [f"a{i}" for i in range(16)]
    for name in first:
        apiserver.add_pod(_random_pod(rng, name))
    pending = [(name, scheduler.schedule("default", name)) for name in first]
    wait_for(lambda: len(rig.kubelet.admissions) >= 3, what="the first admissions")
    rig.agent.stop(signal.SIGKILL)
    # Until the kubelet has seen the stream end, its old endpoint still looks healthy, and
    # wait_registered below could return on it rather than on the new registration.
    wait_for(
        lambda: not all(rig.kubelet.devices("gpu.intel.com/i915").values()),
        what="the kubelet to see the plugin gone",
    )
    rig.agent.start()
    bound = {name for name, future in pending if future.result(timeout=30).bound}
    rig.wait_registered()
    second = [f"b{i}" for i in range(8)]
    for name in second:
        apiserver.add_pod(_random_pod(rng, name))
    unbound = set(bind_all(scheduler, apiserver, second, strict=False))
    admitted([rig], bound | (set(second) - unbound), timeout=60)
    refused = [a for a in rig.kubelet.admissions.values() if a.error]
    for admission in refused:
        assert admission.name in first, (admission.name, admission.error)
        # the kubelet's or the connection's failure, never gas node's refusal
        assert "gas chose" not in admission.error, admission.error
        assert "gas cannot" not in admission.error, admission.error
    wrong = [w for w in mismatches(apiserver, [rig]) if " refused: " not in w]
    assert wrong == []
    assert all(not a.error for a in rig.kubelet.admissions.values() if a.name in second)
