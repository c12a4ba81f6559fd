"""Fake /proc trees laid out as the kernel lays them out, for the GPU use readers' tests and
benchmark.

    root = write_proc(tmp_path / "proc", [
        FakeProcess(4021, cgroup_v2(pod_cgroup(UID, CID)), gpu_fds(i915_fdinfo(7, ADDRESS))),
        FakeProcess(977, HOST_CGROUP, gpu_fds(xe_fdinfo(3, ADDRESS))),
    ])

Each process is `<root>/<pid>/` with `cgroup`, `environ` (NUL-separated), `comm`, `fd/<n>`
(symlinks whose target text is what the kernel shows: `/dev/dri/renderD128`, `socket:[...]`,
`pipe:[...]`; left dangling, as they are when the root is the host's /proc read from a
container) and `fdinfo/<n>`. Beside them, as in a real /proc, non-process entries
(`self`, `meminfo`, `sys/`).

The fdinfo texts follow the kernel's DRM client usage stats (Documentation/gpu/
drm-usage-stats.rst and the i915 and xe pages): i915 prints each region's `drm-total-*`,
`drm-shared-*`, `drm-active-*`, `drm-resident-*`, `drm-purgeable-*` (`system0`,
`stolen-system0` on an integrated card; `system0`, `local0`, `stolen-local0` on a discrete
one) and its engines' busy time in nanoseconds (`drm-engine-render: 9288864723 ns`, two
video engines: `drm-engine-capacity-video: 2`); xe prints regions `system`, `gtt`, `vram0`
(discrete only), `stolen`, and per engine class `drm-cycles-<class>` with
`drm-total-cycles-<class>` and, for several engines, `drm-engine-capacity-<class>`. Sizes
are printed as the kernel's `drm_print_memory_stats` prints them: in KiB or MiB when a
whole number of them, else in bytes.

The cgroup paths are the kubelet's for each driver, runtime, QoS class and cgroup root
(`pod_cgroup`), written as cgroup v2 (`cgroup_v2`) or v1 (`cgroup_v1`) files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

KIB = 1024
MIB = 1024**2
GIB = 1024**3

HOST_CGROUP = "0::/system.slice/containerd.service\n"
"""A system daemon's cgroup: no pod."""
SESSION_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"
"""A login session's process: no pod."""

_V1_CONTROLLERS = (
    "misc",
    "rdma",
    "pids",
    "hugetlb",
    "net_cls,net_prio",
    "perf_event",
    "cpu,cpuacct",
    "blkio",
    "freezer",
    "devices",
    "memory",
    "cpuset",
)


# ---------------------------------------------------------------- cgroups


def _systemd_slices(components: list[str]) -> str:
    """The systemd driver's path for a cgroup name: each component's slice is named after
    all its ancestors, dashes inside a component written as underscores."""
    escaped = [component.replace("-", "_") for component in components]
    return "/" + "/".join("-".join(escaped[: i + 1]) + ".slice" for i in range(len(escaped)))


def pod_cgroup(
    pod_uid: str,
    container_id: str,
    *,
    driver: str = "systemd",
    runtime: str = "containerd",
    qos: str = "burstable",
    root: str = "",
    nested: str = "",
) -> str:
    """The cgroup path of a container's processes, as the kubelet and the runtime make it.

    `driver`: `systemd` or `cgroupfs`; `runtime`: `containerd`, `crio`, `crio-conmon` (CRI-O's
    monitor of that container, in no container), `docker`; `qos`: `guaranteed`, `burstable`,
    `besteffort`; `root`: the kubelet's `--cgroup-root` (`/gas-realnode-x`, kind's
    `/kubelet`); `nested`: a cgroup under the container's own (`container`, as crun makes
    under CRI-O's scope)."""
    components = [part for part in root.split("/") if part]
    components.append("kubepods")
    if qos != "guaranteed":
        components.append(qos)
    components.append(f"pod{pod_uid}")
    if driver == "systemd":
        parent = _systemd_slices(components)
        scope = {
            "containerd": "cri-containerd",
            "crio": "crio",
            "crio-conmon": "crio-conmon",
            "docker": "docker",
        }[runtime]
        leaf = f"{scope}-{container_id}.scope"
    elif driver == "cgroupfs":
        parent = "/" + "/".join(components)
        # CRI-O names its cgroups under cgroupfs too; containerd and Docker use the bare id.
        leaf = {"crio": f"crio-{container_id}", "crio-conmon": f"crio-conmon-{container_id}"}.get(
            runtime, container_id
        )
    else:
        raise ValueError(f"unknown cgroup driver {driver!r}")
    path = f"{parent}/{leaf}"
    return f"{path}/{nested}" if nested else path


def cgroup_v2(path: str) -> str:
    """`/proc/<pid>/cgroup` on a cgroup v2 host: one line."""
    return f"0::{path}\n"


def cgroup_v1(path: str, *, hybrid: bool = False) -> str:
    """`/proc/<pid>/cgroup` on a cgroup v1 host: one line per hierarchy, each with the same
    path (the kubelet puts a container in every one), `name=systemd` last; `hybrid` adds
    the unified hierarchy's `0::` line."""
    count = len(_V1_CONTROLLERS) + 1
    lines = [f"{count - i}:{name}:{path}" for i, name in enumerate(_V1_CONTROLLERS)]
    lines.append(f"1:name=systemd:{path}")
    if hybrid:
        lines.append(f"0::{path}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- fdinfo


def kernel_size(amount: int) -> str:
    """A size as `drm_print_memory_stats` prints it: divided by 1024 while a whole number
    of KiB, at most to MiB (`192 KiB`, `16 MiB`, `0`, `1000`)."""
    units = ("", " KiB", " MiB")
    unit = 0
    while unit < len(units) - 1 and amount and amount % KIB == 0:
        amount //= KIB
        unit += 1
    return f"{amount}{units[unit]}"


def _fd_head(flags: str = "02100002", ino: int = 685) -> str:
    return f"pos:\t0\nflags:\t{flags}\nmnt_id:\t26\nino:\t{ino}\n"


def _region(region: str, total: int, resident: int | None = None) -> list[str]:
    resident = total if resident is None else resident
    return [
        f"drm-total-{region}:\t{kernel_size(total)}",
        f"drm-shared-{region}:\t0",
        f"drm-active-{region}:\t0",
        f"drm-resident-{region}:\t{kernel_size(resident)}",
        f"drm-purgeable-{region}:\t0",
    ]


def i915_fdinfo(
    client_id: int,
    pdev: str,
    *,
    local: int | None = None,
    system: int = 6044 * KIB,
    render_ns: int = 9288864723,
    copy_ns: int = 2035071108,
    video_ns: int = 0,
    video_enhance_ns: int = 0,
    compute_ns: int | None = None,
    memory: bool = True,
    flags: str = "02100002",
) -> str:
    """An i915 client's fdinfo. `local`: bytes in local memory, on a discrete card (None:
    an integrated card, which has no `local0`); `memory=False`: as older kernels
    print it, engines only; `compute_ns`: a card with compute engines (DG2)."""
    lines = ["drm-driver:\ti915", f"drm-pdev:\t{pdev}", f"drm-client-id:\t{client_id}"]
    if memory:
        lines += _region("system0", system)
        if local is None:
            lines += _region("stolen-system0", 0)
        else:
            lines += _region("local0", local)
            lines += _region("stolen-local0", 0)
    lines += [
        f"drm-engine-render:\t{render_ns} ns",
        f"drm-engine-copy:\t{copy_ns} ns",
        f"drm-engine-video:\t{video_ns} ns",
        "drm-engine-capacity-video:\t2",
        f"drm-engine-video-enhance:\t{video_enhance_ns} ns",
    ]
    if compute_ns is not None:
        lines += [f"drm-engine-compute:\t{compute_ns} ns", "drm-engine-capacity-compute:\t4"]
    return _fd_head(flags) + "\n".join(lines) + "\n"


XE_CAPACITY = {"rcs": 1, "bcs": 1, "vcs": 2, "vecs": 2, "ccs": 4}


def xe_fdinfo(
    client_id: int,
    pdev: str,
    *,
    vram: int | None = 23992 * KIB,
    gtt: int = 192 * KIB,
    system: int = 0,
    cycles: Mapping[str, int] | None = None,
    total_cycles: int = 7655183225,
    flags: str = "0100002",
) -> str:
    """An xe client's fdinfo. `vram`: bytes in `vram0` (None: an integrated card, which has
    none); `cycles`: busy cycles per engine class (rcs 28257900, others 0 unless said),
    each against the same `total_cycles` (the GPU's clock when read)."""
    busy = {"rcs": 28257900, "bcs": 0, "vcs": 0, "vecs": 0, "ccs": 0, **(cycles or {})}
    lines = ["drm-driver:\txe", f"drm-client-id:\t{client_id}", f"drm-pdev:\t{pdev}"]
    lines += _region("system", system)
    lines += _region("gtt", gtt)
    if vram is not None:
        lines += _region("vram0", vram)
    lines += _region("stolen", 0)
    for name, capacity in XE_CAPACITY.items():
        lines += [f"drm-cycles-{name}:\t{busy[name]}", f"drm-total-cycles-{name}:\t{total_cycles}"]
        if capacity > 1:
            lines.append(f"drm-engine-capacity-{name}:\t{capacity}")
    return _fd_head(flags) + "\n".join(lines) + "\n"


# ---------------------------------------------------------------- processes


@dataclass(frozen=True)
class FakeFd:
    target: str
    """The link's text, as `readlink` gives it."""
    fdinfo: str | None
    """`fdinfo/<n>`; None: no such file (the process closed the fd, or exited, after its
    `fd/` was listed)."""


def drm_fd(fdinfo: str | None, node: str = "renderD128") -> FakeFd:
    return FakeFd(f"/dev/dri/{node}", fdinfo)


def dup(fd: FakeFd) -> FakeFd:
    """A `dup()` of `fd`: the same open file, so the same client (its own `pos` and
    close-on-exec flag aside)."""
    text = fd.fdinfo
    if text is not None:
        text = text.replace("flags:\t02100002", "flags:\t0100002", 1)
    return FakeFd(fd.target, text)


_OTHER_TARGETS = (
    "/dev/null",
    "pipe:[{n}]",
    "pipe:[{n}]",
    "socket:[{n}]",
    "anon_inode:[eventfd]",
    "anon_inode:[eventpoll]",
    "/var/log/app/worker.log",
    "anon_inode:[timerfd]",
    "/usr/lib/x86_64-linux-gnu/libze_intel_gpu.so.1",
    "/dev/shm/model-cache (deleted)",
    "socket:[{n}]",
    "/tmp/scratch.bin",
)


def other_fds(count: int, first: int = 0, seed: int = 0) -> dict[int, FakeFd]:
    """`count` fds that are no GPU's, numbered from `first`: stdio, pipes, sockets, files."""
    found = {}
    for offset in range(count):
        n = first + offset
        target = _OTHER_TARGETS[(n + seed) % len(_OTHER_TARGETS)].format(n=40000 + seed + n)
        found[n] = FakeFd(target, _fd_head("0100002", 1000 + n))
    return found


def gpu_fds(*fdinfos: str | None, first: int = 3, other: int = 3) -> dict[int, FakeFd]:
    """The fds of a typical GPU process: stdio, then one DRM fd per fdinfo (`renderD128`),
    then `other` more that are no GPU's."""
    fds = other_fds(3)
    for offset, text in enumerate(fdinfos):
        fds[first + offset] = drm_fd(text)
    fds.update(other_fds(other, first + len(fdinfos)))
    return fds


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    cgroup: str
    """The whole `/proc/<pid>/cgroup` text (`cgroup_v2(...)`, `cgroup_v1(...)`)."""
    fds: Mapping[int, FakeFd] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=dict)
    comm: str = "worker"


def fork(process: FakeProcess, pid: int) -> FakeProcess:
    """A child `fork()` made: another pid, the same cgroup, environment and open files (so
    the same DRM clients)."""
    return replace(process, pid=pid)


def add_process(root: Path, process: FakeProcess) -> None:
    base = root / str(process.pid)
    (base / "fd").mkdir(parents=True)
    (base / "fdinfo").mkdir()
    (base / "cgroup").write_text(process.cgroup)
    (base / "comm").write_text(process.comm + "\n")
    environ = {"PATH": "/usr/local/bin:/usr/bin", "HOSTNAME": "worker-0", **process.environ}
    (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    for n, fd in process.fds.items():
        os.symlink(fd.target, base / "fd" / str(n))
        if fd.fdinfo is not None:
            (base / "fdinfo" / str(n)).write_text(fd.fdinfo)


def remove_process(root: Path, pid: int) -> None:
    """The process exits: its folder goes."""
    shutil.rmtree(root / str(pid))


def write_proc(root: Path, processes: Iterable[FakeProcess]) -> Path:
    """A /proc at `root` with these processes, `1` (init, no GPU) and a kernel thread
    (`2`, no fds) among them; returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "meminfo").write_text("MemTotal:       65536000 kB\n")
    (root / "sys" / "kernel").mkdir(parents=True)
    (root / "sys" / "kernel" / "osrelease").write_text("6.8.0\n")
    add_process(root, FakeProcess(1, "0::/init.scope\n", other_fds(4), comm="systemd"))
    add_process(root, FakeProcess(2, "0::/\n", comm="kthreadd"))
    os.symlink("1", root / "self")
    for process in processes:
        add_process(root, process)
    return root
