"""CPU of one reading of the node's GPU use: `gas.host.proc.scan` + `gas.host.usage.attribute`
over a /proc of 2,000 processes with 20 fds each.

    .venv/bin/python -m benchmarks.usage_scan            # 2,000 processes, 15 runs
    .venv/bin/python -m benchmarks.usage_scan --quick    # a smoke size (seconds)

The tree is a fake /proc (`tests.support.fakeproc`) laid out as the kernel lays it out: every
fd a symlink with an fdinfo beside it, most of them no GPU's (stdio, pipes, sockets,
files); one process in ten holds the GPU (a render-node client, often with a dup'd fd, on
one of two cards, i915 and xe), some of them workers forked from another with the same
clients; pods of every QoS class, and host processes. Each run is timed in process CPU
(`time.process_time`: user and system, which is where the readlinks go) with the wall
time beside it; the tree stays in the page cache between runs, as /proc is in memory.
Beside each run, the CPU of only listing every process's fds and reading every link (what
any reading must do at least: one readlink per fd), so the figure can be told from what
the machine's system calls cost.

Two readings are timed: `gas top`'s, which reads every process's fds, and the agents',
which first read each process's cgroup and leave unread the fds of a container known to
hold no GPU (it asks for none and is not privileged: its device cgroup keeps it from
opening one), here the nine in ten of the pods' containers that hold no GPU.

The goal is at most 100 ms of CPU per reading at full size. Prints figures; never fails
on time. `--json PATH` also writes them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import percentile
from gas.host.cards import Card
from gas.host.cgroups import PodContainer, pod_container
from gas.host.proc import scan
from gas.host.usage import attribute
from tests.support.fakeproc import (
    HOST_CGROUP,
    MIB,
    FakeFd,
    FakeProcess,
    cgroup_v2,
    drm_fd,
    dup,
    i915_fdinfo,
    other_fds,
    pod_cgroup,
    write_proc,
    xe_fdinfo,
)

GOAL_MS = 100.0
CARDS = (
    Card("card0", 0, "0x8086", 0, "0000:03:00.0", "renderD128", "i915", 1, 16 * 1024 * MIB),
    Card("card1", 1, "0x8086", 0, "0000:04:00.0", "renderD129", "xe", 1, 16 * 1024 * MIB),
)
QOS = ("guaranteed", "burstable", "besteffort")


def _pod_uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def _process(pid: int, index: int, fds: int) -> FakeProcess:
    """The `index`-th process: one in ten a GPU client, one in twenty a host process."""
    cgroup = (
        HOST_CGROUP
        if index % 20 == 19
        else cgroup_v2(
            pod_cgroup(_pod_uid(index // 4), f"{index // 2:064x}", qos=QOS[index % len(QOS)])
        )
    )
    table: dict[int, FakeFd] = other_fds(fds, seed=index)
    if index % 10 == 0:
        card = CARDS[(index // 10) % len(CARDS)]
        text = (
            i915_fdinfo(index, card.pci_address, local=(index % 7 + 1) * 64 * MIB)
            if card.driver == "i915"
            else xe_fdinfo(index, card.pci_address, vram=(index % 5 + 1) * 32 * MIB)
        )
        client = drm_fd(text, card.render_node or "renderD128")
        table[5] = client
        if index % 20 == 0:
            table[6] = dup(client)
    elif index % 10 == 1 and (index - 1) % 20 == 0:
        # A worker forked from the previous process: the same client, another pid.
        previous = _process(pid - 1, index - 1, fds)
        return FakeProcess(pid, previous.cgroup, previous.fds)
    return FakeProcess(pid, cgroup, table)


def build(root: Path, processes: int, fds: int) -> tuple[int, set[PodContainer]]:
    """The tree at `root`; the number of DRM fds in it, and the containers holding one (as
    the agents know them from their pods' GPU resources)."""
    made = [_process(1000 + index, index, fds) for index in range(processes)]
    write_proc(root, made)
    gpu = {
        owner
        for p in made
        if any(fd.target.startswith("/dev/dri/") for fd in p.fds.values())
        and (owner := pod_container(p.cgroup)) is not None
    }
    return sum(fd.target.startswith("/dev/dri/") for p in made for fd in p.fds.values()), gpu


def links_only(root: Path) -> None:
    """What any reading must do at least: list each process's fds and read every link."""
    for name in os.listdir(root):
        if name.isdigit():
            folder = os.open(root / name / "fd", os.O_RDONLY | os.O_DIRECTORY)
            try:
                for fd in os.listdir(folder):
                    os.readlink(fd, dir_fd=folder)
            finally:
                os.close(folder)


def _cpu_ms(work: Callable[[], object]) -> tuple[float, float]:
    gc.collect()
    started, started_wall = time.process_time(), time.perf_counter()
    work()
    return (time.process_time() - started) * 1000, (time.perf_counter() - started_wall) * 1000


def measure(processes: int, fds: int, runs: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="gas-bench-proc-") as folder:
        root = Path(folder) / "proc"
        drm, gpu = build(root, processes, fds)
        found = attribute(scan(root), CARDS)  # warms the page cache and the imports

        def skip(owner: PodContainer) -> bool:
            return owner not in gpu

        agent_found = attribute(scan(root, skip=skip), CARDS)
        assert agent_found.cards == found.cards, "the agents' reading must find the same use"
        cpu: list[float] = []
        wall: list[float] = []
        floor: list[float] = []
        agent: list[float] = []
        # Interleaved, so that a busy spell of the machine weighs on all alike.
        for _ in range(runs):
            reading, elapsed = _cpu_ms(lambda: attribute(scan(root), CARDS))
            cpu.append(reading)
            wall.append(elapsed)
            floor.append(_cpu_ms(lambda: links_only(root))[0])
            agent.append(_cpu_ms(lambda: attribute(scan(root, skip=skip), CARDS))[0])
    containers = sum(len(card.containers) for card in found.cards)
    return {
        "processes": processes,
        "fds_per_process": fds,
        "drm_fds": drm,
        "containers_using_gpus": containers,
        "runs": runs,
        "cpu_median_ms": round(statistics.median(cpu), 2),
        "cpu_p90_ms": round(percentile(cpu, 0.9), 2),
        "cpu_max_ms": round(max(cpu), 2),
        "wall_median_ms": round(statistics.median(wall), 2),
        "links_only_cpu_median_ms": round(statistics.median(floor), 2),
        "agent_cpu_median_ms": round(statistics.median(agent), 2),
        "agent_cpu_p90_ms": round(percentile(agent, 0.9), 2),
        "goal_cpu_ms": GOAL_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="benchmarks.usage_scan", description=__doc__.split("\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="smoke size: 200 processes, 3 runs")
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument("--fds", type=int, default=20, help="fds per process (20)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args()
    processes, runs = (200, 3) if args.quick else (args.processes, args.runs)
    figures = measure(processes, args.fds, runs)
    print(
        "| processes | fds each | DRM fds | containers on GPUs | runs "
        "| CPU median ms | CPU p90 ms | CPU max ms | wall median ms | links only CPU ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {figures['processes']:,} | {figures['fds_per_process']} | {figures['drm_fds']} "
        f"| {figures['containers_using_gpus']} | {figures['runs']} "
        f"| {figures['cpu_median_ms']} | {figures['cpu_p90_ms']} | {figures['cpu_max_ms']} "
        f"| {figures['wall_median_ms']} | {figures['links_only_cpu_median_ms']} |"
    )
    print(
        f"the agents' reading (containers without a GPU left unread): CPU median "
        f"{figures['agent_cpu_median_ms']} ms, p90 {figures['agent_cpu_p90_ms']} ms"
    )
    print(f"goal: at most {GOAL_MS:.0f} ms of CPU per reading of 2,000 processes x 20 fds")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
