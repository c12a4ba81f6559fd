"""`gas top` run as a real process (`python -m gas.cli top`) on fake /proc and sysfs trees
laid out as the kernel lays them out: an i915 and an xe card, containers in every cgroup
layout, dup'd fds and forked workers, a host process; with `--kubeconfig` against the
API-server double to name containers and read their shares; partial readings said on
stderr, and a proc root that cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gas.core.model import ANNOTATION_CARDS
from tests.support.apiserver import ApiServerDouble
from tests.support.fakeproc import (
    HOST_CGROUP,
    MIB,
    FakeProcess,
    cgroup_v1,
    cgroup_v2,
    dup,
    fork,
    gpu_fds,
    i915_fdinfo,
    pod_cgroup,
    write_proc,
    xe_fdinfo,
)
from tests.support.fakesysfs import GIB, FakeCard, write_sysfs
from tests.support.objects import container, gpu_pod

ROOT = Path(__file__).resolve().parents[2]
I915_ADDRESS, XE_ADDRESS = "0000:03:00.0", "0000:04:00.0"

# The engines of the fake trees' clients, as the kernel docs' examples print them.
I915_ENGINES = {
    "copy": {"busy": 2035071108, "total": None, "capacity": 1},
    "render": {"busy": 9288864723, "total": None, "capacity": 1},
    "video": {"busy": 0, "total": None, "capacity": 2},
    "video-enhance": {"busy": 0, "total": None, "capacity": 1},
}
XE_CLOCK = 7655183225
XE_ENGINES = {
    "bcs": {"busy": 0, "total": XE_CLOCK, "capacity": 1},
    "ccs": {"busy": 0, "total": XE_CLOCK, "capacity": 4},
    "rcs": {"busy": 28257900, "total": XE_CLOCK, "capacity": 1},
    "vcs": {"busy": 0, "total": XE_CLOCK, "capacity": 2},
    "vecs": {"busy": 0, "total": XE_CLOCK, "capacity": 2},
}


@dataclass(frozen=True)
class Tenant:
    """One container of the node and how its cgroup is laid out."""

    pod_uid: str
    container_id: str
    version: str  # v1, v1-hybrid, v2
    driver: str
    runtime: str
    qos: str
    root: str
    card: str  # i915 or xe
    memory: int
    pid: int

    def cgroup(self) -> str:
        path = pod_cgroup(
            self.pod_uid,
            self.container_id,
            driver=self.driver,
            runtime=self.runtime,
            qos=self.qos,
            root=self.root,
        )
        if self.version == "v2":
            return cgroup_v2(path)
        return cgroup_v1(path, hybrid=self.version == "v1-hybrid")

    def fdinfo(self, client_id: int) -> str:
        if self.card == "i915":
            return i915_fdinfo(client_id, I915_ADDRESS, local=self.memory)
        return xe_fdinfo(client_id, XE_ADDRESS, vram=self.memory)


def uid(n: int) -> str:
    return f"{n}0000000-0000-4000-8000-00000000000{n}"


def cid(n: int) -> str:
    return f"{n:x}" * 64


# Every driver, runtime, QoS class and cgroup version, two custom cgroup roots.
TENANTS = [
    Tenant(uid(1), cid(1), "v2", "systemd", "containerd", "burstable", "", "i915", 1 * GIB, 4021),
    Tenant(uid(2), cid(2), "v2", "systemd", "crio", "guaranteed", "", "xe", 300 * MIB, 4100),
    Tenant(uid(3), cid(3), "v1", "cgroupfs", "docker", "besteffort", "", "i915", 64 * MIB, 4200),
    Tenant(
        uid(4), cid(4), "v1-hybrid", "systemd", "docker", "burstable", "", "xe", 100 * MIB, 4300
    ),
    Tenant(
        uid(5),
        cid(5),
        "v2",
        "cgroupfs",
        "containerd",
        "guaranteed",
        "/gas-realnode-x",
        "i915",
        256 * MIB,
        4400,
    ),
    Tenant(uid(6), cid(6), "v1", "cgroupfs", "crio", "burstable", "", "xe", 32 * MIB, 4500),
    Tenant(
        uid(7),
        cid(7),
        "v2",
        "systemd",
        "containerd",
        "besteffort",
        "/kubelet",
        "i915",
        128 * MIB,
        4600,
    ),
]
FORKED_PID = 4030
HOST_PID = 977


def processes(tenants: list[Tenant], environ: dict[int, dict[str, str]]) -> list[FakeProcess]:
    made = []
    for number, tenant in enumerate(tenants, start=1):
        fds = gpu_fds(tenant.fdinfo(number))
        if number == 1:
            fds[9] = dup(fds[3])  # the same client through a dup'd fd
        process = FakeProcess(tenant.pid, tenant.cgroup(), fds, environ.get(number, {}))
        made.append(process)
        if number == 1:
            made.append(fork(process, FORKED_PID))  # and through a forked worker
    host_fds = gpu_fds(xe_fdinfo(99, XE_ADDRESS, vram=16 * MIB))
    made.append(FakeProcess(HOST_PID, HOST_CGROUP, host_fds, comm="xpu-smi"))
    # CRI-O's monitor of the second container, holding no GPU.
    conmon = cgroup_v2(pod_cgroup(uid(2), cid(2), runtime="crio-conmon", qos="guaranteed"))
    made.append(FakeProcess(4099, conmon, gpu_fds(), comm="conmon"))
    return made


def build_node(
    tmp_path: Path,
    tenants: list[Tenant] = TENANTS,
    environ: dict[int, dict[str, str]] | None = None,
) -> tuple[Path, Path]:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0), FakeCard(1, driver="xe")])
    shares = {1: {"GAS_CARD0_MEMORY_BYTES": str(4 * GIB), "GAS_CARD0_MILLICORES": "300"}}
    proc = write_proc(tmp_path / "proc", processes(tenants, shares if environ is None else environ))
    return proc, sysfs


def gas_top(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME")}
    return subprocess.run(
        [sys.executable, "-m", "gas.cli", "top", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )


def top_json(proc: Path, sysfs: Path, *args: str) -> tuple[dict[str, Any], str]:
    done = gas_top("--proc-root", str(proc), "--sysfs-root", str(sysfs), "--json", *args)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report, done.stderr


def container_entry(tenant: Tenant, pids: list[int], **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"containerID": tenant.container_id}
    if "container" in extra:
        entry["container"] = extra.pop("container")
    entry |= {"pids": pids, "memoryBytes": tenant.memory}
    entry |= extra
    entry |= {"engines": I915_ENGINES if tenant.card == "i915" else XE_ENGINES, "complete": True}
    return entry


def expected_cards(containers: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The node's two cards, with these container entries (by pod UID) on them."""
    cards = []
    for name, address, driver, kind in (
        ("card0", I915_ADDRESS, "i915", "i915"),
        ("card1", XE_ADDRESS, "xe", "xe"),
    ):
        mine = [t for t in TENANTS if t.card == kind]
        host = kind == "xe"
        cards.append(
            {
                "card": name,
                "pciAddress": address,
                "driver": driver,
                "memoryCapacityBytes": 16 * GIB,
                "memoryReported": True,
                "memoryBytes": sum(t.memory for t in mine) + (16 * MIB if host else 0),
                "pods": [
                    {"podUID": t.pod_uid, "containers": [containers[t.pod_uid]]} for t in mine
                ],
                "other": {
                    "memoryBytes": 16 * MIB if host else 0,
                    "pids": [HOST_PID] if host else [],
                    "engines": XE_ENGINES if host else {},
                    "complete": True,
                },
            }
        )
    return cards


def test_the_node_as_json(tmp_path: Path) -> None:
    proc, sysfs = build_node(tmp_path)
    report, stderr = top_json(proc, sysfs)
    first = TENANTS[0]
    containers = {t.pod_uid: container_entry(t, [t.pid]) for t in TENANTS[1:]}
    # Its client counted once, through the dup'd fd and the forked worker alike; its share
    # read from its environment.
    containers[first.pod_uid] = container_entry(
        first, [first.pid, FORKED_PID], memoryShareBytes=4 * GIB, millicoresShare=300
    )
    assert report == {"cards": expected_cards(containers), "complete": True, "notes": []}
    assert stderr == ""


def test_the_node_as_a_table(tmp_path: Path) -> None:
    proc, sysfs = build_node(tmp_path)
    done = gas_top("--proc-root", str(proc), "--sysfs-root", str(sysfs))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["CARD", "/", "CONTAINER", "PIDS", "MEMORY", "SHARE", "MILLICORES"]
    assert lines[1].split() == ["card0", I915_ADDRESS, "i915", "1.4Gi/16.0Gi"]
    assert lines[2].split() == [f"{uid(1)}/{cid(1)[:12]}", "4021,4030", "1.0Gi", "4.0Gi", "300"]
    assert lines[3].split() == [f"{uid(3)}/{cid(3)[:12]}", "4200", "64Mi", "-", "-"]
    card1 = lines.index(next(line for line in lines if line.startswith("card1")))
    assert lines[card1].split() == ["card1", XE_ADDRESS, "xe", "448Mi/16.0Gi"]
    assert lines[-1].split() == ["(outside", "any", "pod)", "977", "16Mi", "-", "-"]
    assert len(lines) == 1 + 2 + len(TENANTS) + 1
    # Aligned: every column starts where its header does.
    start = lines[0].index("PIDS")
    assert all(line[start - 2 : start] == "  " for line in lines[2:] if not line.startswith("card"))
    assert lines[2][start:].startswith("4021,4030")


def test_engines_busy_over_an_interval(tmp_path: Path) -> None:
    proc, sysfs = build_node(tmp_path)
    report, _ = top_json(proc, sysfs, "--interval", "0.2")
    assert report["intervalSeconds"] == 0.2
    card0, card1 = report["cards"]
    # The counters did not move: every class idle; xe's clock did not move either, so its
    # use cannot be told.
    trainer = card0["pods"][0]["containers"][0]
    assert trainer["utilization"] == {
        "copy": 0.0,
        "render": 0.0,
        "video": 0.0,
        "video-enhance": 0.0,
    }
    assert card1["pods"][0]["containers"][0]["utilization"] == {}
    assert card0["other"]["utilization"] == {}
    table = gas_top("--proc-root", str(proc), "--sysfs-root", str(sysfs), "--interval", "0.1")
    assert table.returncode == 0, table.stderr
    header, _, trainer_line = table.stdout.splitlines()[:3]
    assert header.rstrip().endswith("BUSY (over 0.1s)")
    assert trainer_line.rstrip().endswith("copy 0% render 0% video 0% video-enhance 0%")


def test_named_with_the_api_server(
    apiserver: ApiServerDouble, kubeconfig: str, tmp_path: Path
) -> None:
    def status(name: str, container_id: str, runtime: str = "containerd") -> dict[str, Any]:
        return {
            "phase": "Running",
            "containerStatuses": [{"name": name, "containerID": f"{runtime}://{container_id}"}],
        }

    # The DRA way: the share is in the container's environment.
    dra = gpu_pod("trainer", container("app"), namespace="ml", node="n1")
    dra["status"] = status("app", cid(1))
    # The extender way: the share is in the pod's annotation and requests.
    extender = gpu_pod(
        "infer",
        container("server", i915="1", memory_max="2Gi", millicores="200"),
        node="n1",
        annotations={ANNOTATION_CARDS: "card1"},
    )
    extender["status"] = status("server", cid(2), "cri-o")
    elsewhere = gpu_pod("far", container("app"), node="n2")
    elsewhere["status"] = status("app", cid(3))
    stored = [apiserver.add_pod(pod) for pod in (dra, extender, elsewhere)]
    uids = [pod["metadata"]["uid"] for pod in stored]
    tenants = [
        Tenant(uids[0], cid(1), "v2", "systemd", "containerd", "burstable", "", "i915", GIB, 10),
        Tenant(uids[1], cid(2), "v2", "systemd", "crio", "burstable", "", "xe", 3 * GIB, 20),
        # Not bound to n1 as far as the API server says: shown unnamed.
        Tenant(uids[2], cid(3), "v2", "systemd", "containerd", "burstable", "", "i915", MIB, 30),
    ]
    shares = {1: {"GAS_CARD0_MEMORY_BYTES": str(2 * GIB), "GAS_CARD0_MILLICORES": "250"}}
    proc, sysfs = build_node(tmp_path, tenants, shares)
    report, stderr = top_json(proc, sysfs, "--kubeconfig", kubeconfig, "--node-name", "n1")
    assert stderr == ""
    card0, card1 = report["cards"]
    assert [{k: v for k, v in pod.items() if k != "containers"} for pod in card0["pods"]] == sorted(
        [{"podUID": uids[0], "namespace": "ml", "pod": "trainer"}, {"podUID": uids[2]}],
        key=lambda pod: pod["podUID"],
    )
    trainer = next(p for p in card0["pods"] if p["podUID"] == uids[0])["containers"][0]
    assert trainer["container"] == "app"
    assert (trainer["memoryBytes"], trainer["memoryShareBytes"], trainer["millicoresShare"]) == (
        GIB,
        2 * GIB,
        250,
    )
    stranger = next(p for p in card0["pods"] if p["podUID"] == uids[2])["containers"][0]
    assert "container" not in stranger and "memoryShareBytes" not in stranger
    (server_pod,) = card1["pods"]
    assert (server_pod["namespace"], server_pod["pod"]) == ("default", "infer")
    (server,) = server_pod["containers"]
    assert server["container"] == "server"
    # Over its share: 3 GiB used of 2 GiB.
    assert (server["memoryBytes"], server["memoryShareBytes"], server["millicoresShare"]) == (
        3 * GIB,
        2 * GIB,
        200,
    )
    table = gas_top(
        "--proc-root",
        str(proc),
        "--sysfs-root",
        str(sysfs),
        "--kubeConfig",
        kubeconfig,
        "--node-name",
        "n1",
    )
    assert table.returncode == 0, table.stderr
    assert "ml/trainer/app" in table.stdout and "default/infer/server" in table.stdout


def test_kubeconfig_without_a_node_name_still_shows_the_use(
    kubeconfig: str, tmp_path: Path
) -> None:
    proc, sysfs = build_node(tmp_path)
    report, stderr = top_json(proc, sysfs, "--kubeconfig", kubeconfig)
    assert stderr == (
        "gas top: containers not named: no node name (give --node-name or set NODE_NAME)\n"
    )
    assert report["notes"] == [stderr.removeprefix("gas top: ").rstrip()]
    assert report["complete"] and len(report["cards"][0]["pods"]) == 4


def test_a_partial_reading_is_shown_and_said(tmp_path: Path) -> None:
    tenants = TENANTS[:2]
    proc, sysfs = build_node(tmp_path, tenants)
    # The first container's process closes its GPU fd between the listing and the read.
    (proc / str(tenants[0].pid) / "fdinfo" / "3").unlink()
    # The second's kernel prints no memory.
    xe = proc / str(tenants[1].pid) / "fdinfo" / "3"
    kept = ("drm-driver", "drm-pdev", "drm-client-id", "drm-cycles", "drm-total-cycles")
    lines = xe.read_text().splitlines()
    xe.write_text("".join(f"{line}\n" for line in lines if line.startswith(kept)))
    report, stderr = top_json(proc, sysfs)
    assert not report["complete"]
    assert stderr.splitlines() == [
        "gas top: 1 process(es) exited or closed a GPU fd while read: their use is what could "
        "be read",
        "gas top: card1: memory use not reported by this kernel",
    ]
    card0, card1 = report["cards"]
    # The forked worker still holds the client: read through it, marked partial.
    trainer = card0["pods"][0]["containers"][0]
    assert trainer["pids"] == [tenants[0].pid, FORKED_PID]
    assert trainer["memoryBytes"] == GIB and trainer["complete"] is False
    assert card1["memoryReported"] is False and card1["memoryBytes"] is None
    assert card1["pods"][0]["containers"][0]["memoryBytes"] is None
    # The host's client, of another kernel as it were, still says its memory.
    assert card1["other"]["memoryBytes"] == 16 * MIB
    table = gas_top("--proc-root", str(proc), "--sysfs-root", str(sysfs))
    assert table.returncode == 0
    assert "(partial)" in table.stdout and "n/a" in table.stdout
    assert table.stdout.rstrip().endswith(
        "partial result: what could not be read is said on stderr"
    )


def test_a_proc_root_that_cannot_be_read(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", [FakeCard(0)])
    done = gas_top("--proc-root", str(tmp_path / "nowhere"), "--sysfs-root", str(sysfs), "--json")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"gas top: cannot list {tmp_path / 'nowhere'}: No such file or directory\n"
    )


def test_a_node_without_cards(tmp_path: Path) -> None:
    proc = write_proc(tmp_path / "proc", [])
    report, stderr = top_json(proc, tmp_path / "no-sys")
    assert report == {
        "cards": [],
        "complete": True,
        "notes": [f"no Intel GPU card found under {tmp_path / 'no-sys'}"],
    }
    assert stderr.startswith("gas top: no Intel GPU card found")
