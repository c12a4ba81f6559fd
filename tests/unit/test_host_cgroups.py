"""The pod and container of a process from its `/proc/<pid>/cgroup`, in every layout the
kubelet and the runtimes make: cgroup v1 and v2, the cgroupfs and systemd drivers,
containerd, CRI-O and Docker, each QoS class, under a custom cgroup root and read from
inside a cgroup namespace; and the processes of no pod."""

from __future__ import annotations

import itertools

import pytest

from gas.host.cgroups import PodContainer, pod_container
from tests.support.fakeproc import (
    HOST_CGROUP,
    SESSION_CGROUP,
    cgroup_v1,
    cgroup_v2,
    pod_cgroup,
)

UID = "5f3c8b2a-91d4-4e6f-a0b7-c2d9e8f1a3b4"
CID = "4f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0"
OWNER = PodContainer(UID, CID)
UNDERSCORED = UID.replace("-", "_")


# ---------------------------------------------------------------- the fake tree's paths


@pytest.mark.parametrize(
    ("options", "path"),
    [
        (
            {},
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice"
            f"/cri-containerd-{CID}.scope",
        ),
        (
            {"qos": "guaranteed", "runtime": "crio"},
            f"/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/crio-{CID}.scope",
        ),
        (
            {"driver": "cgroupfs", "qos": "besteffort", "runtime": "docker"},
            f"/kubepods/besteffort/pod{UID}/{CID}",
        ),
        ({"driver": "cgroupfs", "runtime": "crio"}, f"/kubepods/burstable/pod{UID}/crio-{CID}"),
        (
            {"root": "/kubelet", "qos": "besteffort"},
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
            f"/kubelet-kubepods-besteffort-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope",
        ),
        (
            {"driver": "cgroupfs", "root": "/gas-realnode-x", "qos": "guaranteed"},
            f"/gas-realnode-x/kubepods/pod{UID}/{CID}",
        ),
    ],
)
def test_the_fake_paths_are_the_kubelets(options: dict[str, str], path: str) -> None:
    # Written out as they are on real nodes, so the layouts below are not checked against
    # themselves.
    assert pod_cgroup(UID, CID, **options) == path


# ---------------------------------------------------------------- every layout


LAYOUTS = list(
    itertools.product(
        ("v1", "v1-hybrid", "v2"),
        ("systemd", "cgroupfs"),
        ("containerd", "crio", "docker"),
        ("guaranteed", "burstable", "besteffort"),
    )
)


def _file(version: str, path: str) -> str:
    if version == "v2":
        return cgroup_v2(path)
    return cgroup_v1(path, hybrid=version == "v1-hybrid")


@pytest.mark.parametrize(("version", "driver", "runtime", "qos"), LAYOUTS)
def test_every_layout_names_the_pod_and_container(
    version: str, driver: str, runtime: str, qos: str
) -> None:
    path = pod_cgroup(UID, CID, driver=driver, runtime=runtime, qos=qos)
    assert pod_container(_file(version, path)) == OWNER


@pytest.mark.parametrize("root", ["/gas-realnode-x", "/kubelet", "/a/b-c"])
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_under_a_custom_cgroup_root(root: str, driver: str) -> None:
    for qos in ("guaranteed", "burstable", "besteffort"):
        path = pod_cgroup(UID, CID, driver=driver, qos=qos, root=root)
        assert pod_container(cgroup_v2(path)) == OWNER, path


def test_a_cgroup_under_the_containers_own() -> None:
    path = pod_cgroup(UID, CID, runtime="crio", nested="container")
    assert pod_container(cgroup_v2(path)) == OWNER


def test_a_static_pods_uid_is_the_kubelets_hash() -> None:
    static = "6d2c1fa7ffe44c0a4d8d2e5c1bc2e3b1"
    for driver in ("systemd", "cgroupfs"):
        path = pod_cgroup(static, CID, driver=driver)
        assert pod_container(cgroup_v2(path)) == PodContainer(static, CID)


def test_read_from_inside_a_cgroup_namespace() -> None:
    # A reader in a container of its own cgroup namespace sees the others' paths relative
    # to its own cgroup: the cgroups above are not named.
    relative = f"0::/../../besteffort/pod{UID}/{CID}\n"
    assert pod_container(relative) == OWNER
    relative = f"0::/../../../kubepods-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n"
    assert pod_container(relative) == OWNER


def test_the_first_hierarchy_that_names_a_container_counts() -> None:
    # cgroup v1 with a hierarchy the kubelet does not manage (a `misc` left at the root).
    text = f"13:misc:/\n12:pids:/kubepods/burstable/pod{UID}/{CID}\n0::/\n"
    assert pod_container(text) == OWNER


# ---------------------------------------------------------------- no pod, no container


@pytest.mark.parametrize(
    "text",
    [
        HOST_CGROUP,
        SESSION_CGROUP,
        "0::/init.scope\n",
        "0::/\n",
        "",
        cgroup_v1("/system.slice/docker.service"),
        cgroup_v1("/user.slice/user-1000.slice/session-2.scope", hybrid=True),
        # A Docker container outside Kubernetes.
        cgroup_v2(f"/system.slice/docker-{CID}.scope"),
        # A pod-looking name outside kubepods.
        cgroup_v2(f"/system.slice/pod{UID}/{CID}"),
        # The pod's own cgroup and the kubelet's slices, in no container.
        cgroup_v2(f"/kubepods/burstable/pod{UID}"),
        cgroup_v2(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice"
        ),
        cgroup_v2("/kubepods.slice/kubepods-burstable.slice"),
        # CRI-O's monitor of a container is in the pod but in no container.
        cgroup_v2(pod_cgroup(UID, CID, runtime="crio-conmon")),
        cgroup_v1(pod_cgroup(UID, CID, driver="cgroupfs", runtime="crio-conmon")),
        # Not a container id: too short, upper case.
        cgroup_v2(f"/kubepods/burstable/pod{UID}/{CID[:12]}"),
        cgroup_v2(f"/kubepods/burstable/pod{UID}/{CID.upper()}"),
        # Not a pod UID.
        cgroup_v2(f"/kubepods/burstable/podnot-a-uid/{CID}"),
        # Garbled lines.
        "garbage\n12:memory\n::\n",
    ],
)
def test_processes_of_no_pod(text: str) -> None:
    assert pod_container(text) is None
