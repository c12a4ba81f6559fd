"""The node's GPU use read from fake /proc trees laid out as the kernel lays them out
(`gas.host.proc.scan`) and attributed to cards and containers (`gas.host.usage`): clients
reached through dup'd fds and forked workers counted once, containers sharing a card,
processes outside pods, integrated cards, and every partial reading said as such."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gas.host.cards import Card
from gas.host.cgroups import PodContainer
from gas.host.fdinfo import Engine
from gas.host.proc import ProcScan, scan
from gas.host.usage import (
    CardUse,
    ContainerUse,
    Usage,
    attribute,
    engine_utilization,
    sum_engines,
)
from tests.support.fakeproc import (
    HOST_CGROUP,
    KIB,
    MIB,
    FakeFd,
    FakeProcess,
    cgroup_v1,
    cgroup_v2,
    drm_fd,
    dup,
    fork,
    gpu_fds,
    i915_fdinfo,
    other_fds,
    pod_cgroup,
    remove_process,
    write_proc,
    xe_fdinfo,
)

I915_ADDRESS, XE_ADDRESS, IGPU_ADDRESS = "0000:03:00.0", "0000:04:00.0", "0000:00:02.0"
CARD0 = Card("card0", 0, "0x8086", 0, I915_ADDRESS, "renderD128", "i915", 1, 16 * 1024 * MIB)
CARD1 = Card("card1", 1, "0x8086", 0, XE_ADDRESS, "renderD129", "xe", 1, 16 * 1024 * MIB)
IGPU = Card("card0", 0, "0x8086", 0, IGPU_ADDRESS, "renderD128", "i915", 1, 0)

POD_A, POD_B = "0a1b2c3d-4e5f-4789-8bcd-ef0123456789", "fedcba98-7654-4321-8fed-cba987654321"
CTR_A = "a1" * 32
CTR_A2 = "a2" * 32
CTR_B = "b1" * 32
A = PodContainer(POD_A, CTR_A)
A2 = PodContainer(POD_A, CTR_A2)
B = PodContainer(POD_B, CTR_B)


def cgroup_of(owner: PodContainer, **layout: str) -> str:
    return cgroup_v2(pod_cgroup(owner.pod_uid, owner.container_id, **layout))


def only(found: Usage, card: str) -> list[ContainerUse]:
    (use,) = [c for c in found.cards if c.card == card]
    return list(use.containers)


# ---------------------------------------------------------------- a node as the kernel shows it


def node(root: Path) -> Path:
    """Two cards (an i915 and an xe one), three containers of two pods, a host process."""
    trainer = FakeProcess(
        4021,
        cgroup_of(A),
        gpu_fds(i915_fdinfo(7, I915_ADDRESS, local=1024 * MIB), other=4),
        environ={"GAS_CARD0_MEMORY_BYTES": str(4096 * MIB), "GAS_CARD0_MILLICORES": "300"},
        comm="python",
    )
    # Its data loader: a forked worker, the same client through the inherited fd.
    loader = fork(trainer, 4030)
    # A dup'd fd of the same client, and a client of its own on the xe card.
    side_fds = gpu_fds(i915_fdinfo(8, I915_ADDRESS, local=256 * MIB))
    side_fds[10] = dup(side_fds[3])
    side_fds[11] = drm_fd(xe_fdinfo(21, XE_ADDRESS, vram=300 * MIB), "renderD129")
    sidecar = FakeProcess(4100, cgroup_v1(pod_cgroup(POD_A, CTR_A2, driver="cgroupfs")), side_fds)
    other_pod = FakeProcess(
        5200,
        cgroup_of(B, runtime="crio", qos="besteffort"),
        gpu_fds(i915_fdinfo(3, I915_ADDRESS, local=64 * MIB)),
    )
    host = FakeProcess(977, HOST_CGROUP, gpu_fds(xe_fdinfo(2, XE_ADDRESS, vram=16 * MIB)))
    idle = FakeProcess(6000, cgroup_of(B), other_fds(30))
    return write_proc(root, [trainer, loader, sidecar, other_pod, host, idle])


def test_the_scan_reads_only_processes_holding_a_gpu(tmp_path: Path) -> None:
    found = scan(node(tmp_path / "proc"))
    assert found.readable and found.complete and found.notes == ()
    assert [p.pid for p in found.processes] == [977, 4021, 4030, 4100, 5200]
    by_pid = {p.pid: p for p in found.processes}
    assert by_pid[977].owner is None
    assert by_pid[4021].owner == by_pid[4030].owner == A
    assert by_pid[5200].owner == B
    # The dup'd fd is the same client: once in its process.
    assert [c.key for c in by_pid[4100].clients] == [(I915_ADDRESS, "8"), (XE_ADDRESS, "21")]
    # Its environment only when asked for.
    assert by_pid[4021].environment == {}


def test_the_environment_is_the_gas_variables_alone(tmp_path: Path) -> None:
    found = scan(node(tmp_path / "proc"), environment=True)
    by_pid = {p.pid: p for p in found.processes}
    assert by_pid[4021].environment == {
        "GAS_CARD0_MEMORY_BYTES": str(4096 * MIB),
        "GAS_CARD0_MILLICORES": "300",
    }
    assert by_pid[977].environment == {}


def test_attribution_by_card_and_container(tmp_path: Path) -> None:
    found = attribute(scan(node(tmp_path / "proc")), [CARD1, CARD0])
    assert found.complete and found.notes == ()
    assert [c.card for c in found.cards] == ["card0", "card1"]
    card0, card1 = found.cards
    assert card0.pci_address == I915_ADDRESS and card0.memory_reported
    # Sorted by pod UID, then container id; the forked worker's client counted once.
    assert [(u.pod_uid, u.container_id, u.pids, u.memory) for u in card0.containers] == [
        (POD_A, CTR_A, (4021, 4030), 1024 * MIB),
        (POD_A, CTR_A2, (4100,), 256 * MIB),
        (POD_B, CTR_B, (5200,), 64 * MIB),
    ]
    assert card0.other is None
    trainer = card0.containers[0]
    assert trainer.engines["render"] == Engine(9288864723)
    assert trainer.complete
    assert [(u.container_id, u.memory) for u in card1.containers] == [(CTR_A2, 300 * MIB)]
    assert card1.other is not None
    assert (card1.other.pod_uid, card1.other.container_id) == ("", "")
    assert (card1.other.pids, card1.other.memory) == ((977,), 16 * MIB)


def test_every_card_is_listed_even_unused(tmp_path: Path) -> None:
    root = write_proc(tmp_path / "proc", [])
    spare = Card("card2", 2, "0x8086", 0, "0000:05:00.0")
    found = attribute(scan(root), [spare, CARD1, CARD0])
    assert [(c.card, c.containers, c.other) for c in found.cards] == [
        ("card0", (), None),
        ("card1", (), None),
        ("card2", (), None),
    ]
    assert found.complete and all(c.memory_reported for c in found.cards)


def test_two_containers_on_one_card_each_count_their_own(tmp_path: Path) -> None:
    root = write_proc(
        tmp_path / "proc",
        [
            FakeProcess(300, cgroup_of(B), gpu_fds(xe_fdinfo(1, XE_ADDRESS, vram=5 * MIB))),
            FakeProcess(200, cgroup_of(A), gpu_fds(xe_fdinfo(2, XE_ADDRESS, vram=7 * MIB))),
        ],
    )
    uses = only(attribute(scan(root), [CARD1]), "card1")
    assert [(u.pod_uid, u.pids, u.memory) for u in uses] == [
        (POD_A, (200,), 7 * MIB),
        (POD_B, (300,), 5 * MIB),
    ]


def test_a_containers_clients_sum_memory_and_engines(tmp_path: Path) -> None:
    one = xe_fdinfo(1, XE_ADDRESS, vram=5 * MIB, cycles={"rcs": 100}, total_cycles=1000)
    two = xe_fdinfo(2, XE_ADDRESS, vram=7 * MIB, cycles={"rcs": 300}, total_cycles=1010)
    root = write_proc(tmp_path / "proc", [FakeProcess(200, cgroup_of(A), gpu_fds(one, two))])
    (use,) = only(attribute(scan(root), [CARD1]), "card1")
    assert use.memory == 12 * MIB
    # Busy summed; the GPU clock each read is one clock, not a sum.
    assert use.engines["rcs"] == Engine(400, 1010, 1)
    assert use.engines["vcs"] == Engine(0, 1010, 2)


def test_integrated_cards_count_system_memory(tmp_path: Path) -> None:
    i915 = i915_fdinfo(5, IGPU_ADDRESS, system=6044 * KIB)
    xe = xe_fdinfo(6, IGPU_ADDRESS, vram=None, system=2 * MIB, gtt=192 * KIB)
    root = write_proc(
        tmp_path / "proc",
        [FakeProcess(10, cgroup_of(A), gpu_fds(i915)), FakeProcess(11, cgroup_of(B), gpu_fds(xe))],
    )
    uses = only(attribute(scan(root), [IGPU]), "card0")
    assert [u.memory for u in uses] == [6044 * KIB, 2 * MIB + 192 * KIB]


def test_a_client_held_in_two_containers_counts_for_the_first(tmp_path: Path) -> None:
    shared = i915_fdinfo(9, I915_ADDRESS, local=100 * MIB)
    root = write_proc(
        tmp_path / "proc",
        [
            FakeProcess(50, cgroup_of(B), gpu_fds(shared)),
            FakeProcess(60, cgroup_of(B), gpu_fds(shared)),
            FakeProcess(40, cgroup_of(A), gpu_fds(shared)),
        ],
    )
    found = attribute(scan(root), [CARD0])
    uses = only(found, "card0")
    # pid 40 comes first: A holds it; B's processes are shown, its memory not counted again.
    assert [(u.pod_uid, u.pids, u.memory) for u in uses] == [
        (POD_A, (40,), 100 * MIB),
        (POD_B, (50, 60), 0),
    ]
    assert found.notes == (
        "1 DRM client is held by processes of two containers: each counted for the first "
        "of its processes",
    )


def test_clients_without_an_id_count_once_per_fd(tmp_path: Path) -> None:
    text = i915_fdinfo(1, I915_ADDRESS, local=10 * MIB).replace("drm-client-id:\t1\n", "")
    root = write_proc(tmp_path / "proc", [FakeProcess(7, cgroup_of(A), gpu_fds(text, text))])
    reading = scan(root)
    assert len(reading.processes[0].clients) == 2
    assert reading.notes == (
        "2 DRM fd(s) print no drm-client-id: each counted as a client of its own",
    )
    found = attribute(reading, [CARD0])
    assert [u.memory for u in only(found, "card0")] == [20 * MIB]
    assert found.complete


# ---------------------------------------------------------------- what cannot be read


def test_without_memory_keys_memory_is_unknown_and_said_once_per_card(tmp_path: Path) -> None:
    root = write_proc(
        tmp_path / "proc",
        [
            FakeProcess(101, cgroup_of(A), gpu_fds(i915_fdinfo(1, I915_ADDRESS, memory=False))),
            FakeProcess(102, cgroup_of(B), gpu_fds(i915_fdinfo(2, I915_ADDRESS, memory=False))),
            FakeProcess(103, HOST_CGROUP, gpu_fds(i915_fdinfo(3, I915_ADDRESS, memory=False))),
        ],
    )
    found = attribute(scan(root), [CARD0, CARD1])
    card0, card1 = found.cards
    assert not card0.memory_reported and card1.memory_reported
    assert [u.memory for u in card0.containers] == [None, None]
    assert card0.other is not None and card0.other.memory is None
    assert found.notes == ("card0: memory use not reported by this kernel",)
    # Engines are still read.
    assert card0.containers[0].engines["render"] == Engine(9288864723)


def test_a_process_exiting_mid_scan_is_partial(tmp_path: Path) -> None:
    # Its fd/ still lists two DRM fds, the fdinfo of one is gone already: as when the
    # process closes it (or exits) between the listing and the read.
    fds = gpu_fds(i915_fdinfo(1, I915_ADDRESS, local=10 * MIB), None)
    root = write_proc(
        tmp_path / "proc",
        [
            FakeProcess(70, cgroup_of(A), fds),
            FakeProcess(80, cgroup_of(B), gpu_fds(i915_fdinfo(2, I915_ADDRESS, local=MIB))),
        ],
    )
    reading = scan(root)
    assert reading.readable and not reading.complete
    assert [p.complete for p in reading.processes] == [False, True]
    assert reading.notes == (
        "1 process(es) exited or closed a GPU fd while read: their use is what could be read",
    )
    found = attribute(reading, [CARD0])
    assert not found.complete
    uses = only(found, "card0")
    assert [(u.memory, u.complete) for u in uses] == [(10 * MIB, False), (MIB, True)]
    assert found.notes == reading.notes


def test_a_process_gone_before_its_fds_are_listed_held_nothing(tmp_path: Path) -> None:
    root = node(tmp_path / "proc")
    remove_process(root, 5200)
    (root / "5300").mkdir()  # listed by the kernel, gone when its fd/ is opened
    found = attribute(scan(root), [CARD0, CARD1])
    assert found.complete and found.notes == ()
    assert POD_B not in {u.pod_uid for u in only(found, "card0")}


def test_only_the_gpu_fds_fdinfo_is_read(tmp_path: Path) -> None:
    root = node(tmp_path / "proc")
    for pid in (4021, 4100, 6000):
        for fdinfo in (root / str(pid) / "fdinfo").iterdir():
            target = os.readlink(root / str(pid) / "fd" / fdinfo.name)
            if not target.startswith("/dev/dri/"):
                fdinfo.unlink()
    assert scan(root).complete


@pytest.mark.parametrize(
    "target",
    [
        "/dev/dri/renderD128 (deleted)",
        "/dev/dri/by-path/pci-0000:03:00.0-render",
        "/dev/dri",
        "/dev/dri/controlD64x",
        "/host/dev/dri/renderD128",
    ],
)
def test_links_that_are_no_drm_device_node(tmp_path: Path, target: str) -> None:
    fds = {3: FakeFd(target, i915_fdinfo(1, I915_ADDRESS))}
    root = write_proc(tmp_path / "proc", [FakeProcess(9, cgroup_of(A), fds)])
    assert scan(root).processes == ()


def test_card_and_render_nodes_both_count(tmp_path: Path) -> None:
    fds = {
        3: drm_fd(i915_fdinfo(1, I915_ADDRESS, local=MIB), "card0"),
        4: drm_fd(i915_fdinfo(2, I915_ADDRESS, local=2 * MIB), "renderD128"),
    }
    root = write_proc(tmp_path / "proc", [FakeProcess(9, cgroup_of(A), fds)])
    assert [u.memory for u in only(attribute(scan(root), [CARD0]), "card0")] == [3 * MIB]


def test_garbled_values_make_a_partial_reading(tmp_path: Path) -> None:
    text = i915_fdinfo(1, I915_ADDRESS, local=MIB).replace(
        "drm-total-local0:\t1 MiB", "drm-total-local0:\t1 MB"
    )
    root = write_proc(tmp_path / "proc", [FakeProcess(12, cgroup_of(A), gpu_fds(text))])
    reading = scan(root)
    assert not reading.complete
    (note,) = reading.notes
    assert note.startswith(
        "1 fdinfo value(s) could not be read and were left out (first: pid 12 fd 3: "
        "drm-total-local0: '1 MB' is not a number"
    )
    found = attribute(reading, [CARD0])
    assert not found.complete
    (use,) = only(found, "card0")
    assert not use.complete


def test_fds_without_usage_stats(tmp_path: Path) -> None:
    # A kernel before DRM usage stats: the fdinfo of a DRM fd has no drm-driver.
    fds = gpu_fds("pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t685\n")
    root = write_proc(tmp_path / "proc", [FakeProcess(12, cgroup_of(A), fds)])
    reading = scan(root)
    (process,) = reading.processes
    assert process.clients == () and not process.complete
    assert reading.notes == (
        "1 DRM fd(s) print no usage stats (no drm-driver in their fdinfo: a kernel before "
        "5.19?): their use is not shown",
    )


def test_a_client_on_a_device_no_card_has(tmp_path: Path) -> None:
    amd = (
        "drm-driver:\tamdgpu\ndrm-pdev:\t0000:0b:00.0\ndrm-client-id:\t4\ndrm-memory-vram:\t4 KiB\n"
    )
    root = write_proc(
        tmp_path / "proc",
        [
            FakeProcess(20, cgroup_of(A), gpu_fds(i915_fdinfo(1, IGPU_ADDRESS), amd)),
            FakeProcess(21, cgroup_of(B), gpu_fds(i915_fdinfo(2, IGPU_ADDRESS))),
        ],
    )
    found = attribute(scan(root), [CARD0])
    assert only(found, "card0") == []
    assert found.notes == (
        "2 DRM clients of driver i915 on 0000:00:02.0, which is none of the cards read: not shown",
        "1 DRM client of driver amdgpu on 0000:0b:00.0, which is none of the cards read: not shown",
    )
    # Nothing of the cards given was left unread.
    assert found.complete


def test_an_unreadable_proc_root(tmp_path: Path) -> None:
    for root in (tmp_path / "missing", write_file(tmp_path / "a-file")):
        reading = scan(root)
        assert reading == ProcScan((), False, reading.notes, False)
        (note,) = reading.notes
        assert note.startswith(f"cannot list {root}: ")
        found = attribute(reading, [CARD0])
        assert not found.complete and found.notes == reading.notes
        assert [(c.card, c.containers) for c in found.cards] == [("card0", ())]


def write_file(path: Path) -> Path:
    path.write_text("not a folder\n")
    return path


def test_a_process_whose_fds_cannot_be_listed(tmp_path: Path) -> None:
    root = node(tmp_path / "proc")
    fd = root / "6000" / "fd"
    for link in fd.iterdir():
        link.unlink()
    fd.rmdir()
    fd.write_text("")  # not a folder: listing it fails as a permission refused would
    reading = scan(root)
    assert not reading.complete
    assert reading.notes == (
        "1 process(es) whose open files could not be listed (Not a directory): their GPU use "
        "is not shown",
    )
    assert not attribute(reading, [CARD0, CARD1]).complete


def test_an_unreadable_cgroup_counts_outside_pods(tmp_path: Path) -> None:
    root = write_proc(
        tmp_path / "proc", [FakeProcess(12, cgroup_of(A), gpu_fds(i915_fdinfo(1, I915_ADDRESS)))]
    )
    (root / "12" / "cgroup").unlink()
    reading = scan(root)
    assert reading.processes[0].owner is None and not reading.complete
    assert "1 process(es) whose cgroup could not be read: counted outside any pod" in reading.notes
    found = attribute(reading, [CARD0])
    assert found.cards[0].other is not None and not found.cards[0].other.complete


def test_an_unreadable_environment_leaves_the_use_complete(tmp_path: Path) -> None:
    root = write_proc(
        tmp_path / "proc", [FakeProcess(12, cgroup_of(A), gpu_fds(i915_fdinfo(1, I915_ADDRESS)))]
    )
    environ = root / "12" / "environ"
    environ.unlink()
    environ.mkdir()  # reading it fails
    reading = scan(root, environment=True)
    assert reading.processes[0].environment == {} and reading.complete
    assert reading.notes == (
        "1 process(es) whose environment could not be read: their GAS_* shares are not known",
    )


# ---------------------------------------------------------------- engine use over an interval


def test_engine_utilization_between_two_readings(tmp_path: Path) -> None:
    def reading(folder: str, render_ns: int, rcs: int, total: int, extra: bool) -> Usage:
        processes = [
            FakeProcess(
                10,
                cgroup_of(A),
                gpu_fds(
                    i915_fdinfo(1, I915_ADDRESS, render_ns=render_ns, copy_ns=0),
                    xe_fdinfo(5, XE_ADDRESS, cycles={"rcs": rcs}, total_cycles=total),
                ),
            ),
            FakeProcess(11, HOST_CGROUP, gpu_fds(xe_fdinfo(6, XE_ADDRESS, total_cycles=total))),
        ]
        if extra:
            # A client that opened between the two readings, in nanoseconds and in cycles.
            processes.append(
                FakeProcess(
                    12,
                    cgroup_of(B),
                    gpu_fds(
                        i915_fdinfo(2, I915_ADDRESS, render_ns=500_000_000, copy_ns=0),
                        xe_fdinfo(7, XE_ADDRESS, cycles={"rcs": 50}, total_cycles=total),
                    ),
                )
            )
        return attribute(scan(write_proc(tmp_path / folder, processes)), [CARD0, CARD1])

    before = reading("before", 1_000_000_000, 1000, 10_000, extra=False)
    after = reading("after", 1_500_000_000, 1500, 12_000, extra=True)
    busy = engine_utilization(before, after, 2.0)
    assert busy[("card0", POD_A, CTR_A)]["render"] == pytest.approx(0.25)
    assert busy[("card0", POD_A, CTR_A)]["copy"] == 0.0
    assert busy[("card1", POD_A, CTR_A)]["rcs"] == pytest.approx(0.25)
    # The new i915 client's busy time was all spent since: 0.5 s of 2 s.
    assert busy[("card0", POD_B, CTR_B)]["render"] == pytest.approx(0.25)
    # The new xe client's start on the GPU clock is not known: left out.
    assert "rcs" not in busy[("card1", POD_B, CTR_B)]
    assert busy[("card1", "", "")]["rcs"] == 0.0


def _one_container(clients: dict[tuple[str, str], dict[str, Engine]]) -> Usage:
    container = ContainerUse(POD_A, CTR_A, (1,), 0, sum_engines(clients.values()), True, clients)
    return Usage((CardUse("card1", XE_ADDRESS, (container,), None, True),), (), True)


def test_each_client_is_compared_with_itself() -> None:
    one, two = (XE_ADDRESS, "1"), (XE_ADDRESS, "2")
    # Two clients of one container, each busy half the time: the whole engine.
    before = _one_container({one: {"rcs": Engine(0, 1000)}, two: {"rcs": Engine(0, 1000)}})
    after = _one_container({one: {"rcs": Engine(500, 2000)}, two: {"rcs": Engine(500, 2000)}})
    assert engine_utilization(before, after, 1.0) == {("card1", POD_A, CTR_A): {"rcs": 1.0}}
    # A client closed between the readings takes its busy time with it: the other's is
    # still read right (the container's sums would say 0.1).
    before = _one_container({one: {"rcs": Engine(0, 1000)}, two: {"rcs": Engine(400, 1000)}})
    after = _one_container({one: {"rcs": Engine(500, 2000)}})
    assert engine_utilization(before, after, 1.0) == {("card1", POD_A, CTR_A): {"rcs": 0.5}}


def test_a_process_gone_while_read_is_said_once(tmp_path: Path) -> None:
    # Its fd/ listed a GPU fd; by the time its fdinfo and cgroup are read, all is gone.
    root = write_proc(tmp_path / "proc", [FakeProcess(70, cgroup_of(A), gpu_fds(None))])
    (root / "70" / "cgroup").unlink()
    reading = scan(root)
    assert not reading.complete
    assert reading.notes == (
        "1 process(es) exited or closed a GPU fd while read: their use is what could be read",
    )
