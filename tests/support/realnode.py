"""A real node for the node half: kubelet 1.37 and containerd 2.x, as root, on loopback.

    with realk8s.ControlPlane(tmp_path, version="1.37") as plane:
        with RealNode(plane, "gas-node-1") as node:
            node.wait_ready()          # Ready, its not-ready taint lifted
            ...                        # pods bound to it are started by the real kubelet

What it runs: containerd (its own root, state, sockets and shim socket folder in a short
temporary directory; Debian's runc; the CNI plugins `ptp` + `host-local` from
/usr/lib/cni) and the kubelet (a private `--root-dir`, the cgroupfs driver under a cgroup
root of its own, a client certificate for `system:node:<name>` in `system:nodes`). There is
no registry: a busybox image built here (`build_image_archive`) is imported with `ctr`, and
serves both as the test containers' image (`IMAGE`, `imagePullPolicy: Never`) and as the
sandbox ("pause") image.

One such node per machine at a time: the kubelet serves the device-plugin registration
socket at /var/lib/kubelet/device-plugins/kubelet.sock whatever `--root-dir` says, and
deletes every other socket there when it starts. `RealNode` holds an exclusive lock on
`LOCK_PATH` while it lives.

Stopping leaves nothing behind: the containers' processes are killed through the node's
cgroups, the shims by pid, every mount under the working directory (the containers'
rootfs, the pods' volumes, the sandboxes' network namespaces) is detached, the entries
the kubelet made in /var/lib/kubelet/device-plugins and /var/log/containers and any
KUBE-* iptables chain go, and IPv4 forwarding (which `ptp` turns on) is put back. A node
whose test process died before stopping it is cleaned up by the next one to start.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml

from tests.support import realk8s
from tests.support.fakesysfs import FakeCard

VERSION = "1.37"
IMAGE = "gas.test/busybox:1"
SANDBOX_IMAGE = "gas.test/pause:1"
BUSYBOX = Path("/bin/busybox")
CNI_BIN = Path("/usr/lib/cni")
CNI_PLUGINS = ("ptp", "host-local", "loopback")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
CONTAINER_LOGS = Path("/var/log/containers")
LOCK_PATH = Path("/tmp/gas-realnode.lock")
CGROUP_FS = Path("/sys/fs/cgroup")
DRM_MAJOR = 226
# The pods' addresses: a /24 no other network here uses.
POD_SUBNET = "10.231.77.0/24"
_MNT_DETACH = 2
NOT_ROOT = "a real kubelet and containerd need root"


def missing() -> str | None:
    """Why a real node cannot run here (for a skip), or None when it can."""
    reason = realk8s.missing(VERSION, realk8s.NODE_BINARIES)
    if reason is not None:
        return reason
    if os.geteuid() != 0:
        return NOT_ROOT
    if shutil.which("runc") is None:
        return "no runc (Debian package runc)"
    absent = [p for p in CNI_PLUGINS if not (CNI_BIN / p).is_file()]
    if absent:
        return f"no CNI plugins {', '.join(absent)} in {CNI_BIN} (containernetworking-plugins)"
    if not BUSYBOX.is_file():
        return f"no static busybox at {BUSYBOX} (Debian package busybox-static)"
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").exists():
        return "no cgroup hierarchy at /sys/fs/cgroup"
    return None


# ------------------------------------------------------------------------ the image


def skip_reason() -> str | None:
    """Why the real node cannot run here, for a skip; None when it can. CI installs the
    Debian packages and has the binaries: there only not being root excuses the tests, and
    anything else fails them."""
    reason = missing()
    if reason is not None and os.environ.get("CI") and reason != NOT_ROOT:
        import pytest

        pytest.fail(f"CI must run the real node: {reason}", pytrace=False)
    return reason


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes | None = None, **fields: Any) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uname = info.gname = "root"
    for key, value in fields.items():
        setattr(info, key, value)
    if data is not None:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _busybox_layer() -> bytes:
    """An uncompressed layer: busybox, the names the tests call it by, empty mount points."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "root"):
            _tar_member(tar, folder + "/", type=tarfile.DIRTYPE, mode=0o755)
        _tar_member(tar, "bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
        for applet in ("sh", "ls", "sleep", "cat", "echo", "stat"):
            _tar_member(tar, f"bin/{applet}", type=tarfile.SYMTYPE, linkname="busybox")
    return buffer.getvalue()


def build_image_archive(path: Path) -> Path:
    """A docker-archive tar (what `ctr images import` reads) holding `IMAGE` and
    `SANDBOX_IMAGE`, one busybox layer between them; returns `path`."""
    layer = _busybox_layer()
    layer_id = hashlib.sha256(layer).hexdigest()
    images = {
        IMAGE: ["/bin/sh"],
        # The sandbox only holds the pod's namespaces: it sleeps until killed.
        SANDBOX_IMAGE: ["/bin/sleep", "2147483647"],
    }
    manifest = []
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, f"{layer_id}/", type=tarfile.DIRTYPE, mode=0o755)
        _tar_member(tar, f"{layer_id}/layer.tar", layer, mode=0o644)
        for name, command in images.items():
            config = json.dumps(
                {
                    "architecture": "amd64",
                    "os": "linux",
                    "created": "1970-01-01T00:00:00Z",
                    "config": {"Cmd": command, "Env": ["PATH=/bin"], "WorkingDir": "/"},
                    "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
                },
                sort_keys=True,
            ).encode()
            config_name = hashlib.sha256(config).hexdigest() + ".json"
            _tar_member(tar, config_name, config, mode=0o644)
            manifest.append(
                {"Config": config_name, "RepoTags": [name], "Layers": [f"{layer_id}/layer.tar"]}
            )
        _tar_member(tar, "manifest.json", json.dumps(manifest).encode(), mode=0o644)
    return path


# ------------------------------------------------------------------ fake device nodes


def write_char_devfs(root: Path, cards: Iterable[FakeCard]) -> Path:
    """`<root>/dri/cardN` and `renderDM` as real character device nodes (DRM's major 226,
    the kernel's minors): containerd stats a device plugin's host path to make the
    container's device, so a plain file would not do. Needs root."""
    dri = root / "dri"
    dri.mkdir(parents=True, exist_ok=True)
    for card in cards:
        os.mknod(
            dri / f"card{card.number}", stat.S_IFCHR | 0o666, os.makedev(DRM_MAJOR, card.number)
        )
        if card.render_node is not None:
            minor = int(card.render_node.removeprefix("renderD"))
            os.mknod(dri / card.render_node, stat.S_IFCHR | 0o666, os.makedev(DRM_MAJOR, minor))
    return root


def card_devices(cards: Iterable[FakeCard]) -> dict[str, tuple[int, int]]:
    """The device nodes of `cards` as a container must see them: name -> (major, minor)."""
    found: dict[str, tuple[int, int]] = {}
    for card in cards:
        found[f"card{card.number}"] = (DRM_MAJOR, card.number)
        if card.render_node is not None:
            found[card.render_node] = (DRM_MAJOR, int(card.render_node.removeprefix("renderD")))
    return found


# ------------------------------------------------------------------------- the node


def _umount(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(path.encode(), _MNT_DETACH)


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or under `root`, deepest first."""
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix) or point == str(root):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def _pids_mentioning(text: str) -> list[int]:
    """Processes with `text` in one of the words of their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(text.encode() in word for word in words):
            found.append(int(entry.name))
    return found


def _pids_with(argument: str) -> list[int]:
    """Processes whose command line has `argument` as one of its words."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in words:
            found.append(int(entry.name))
    return found


def _iptables_save(tool: str) -> str:
    if shutil.which(f"{tool}-save") is None:
        return ""
    done = subprocess.run([f"{tool}-save"], capture_output=True, text=True, timeout=30)
    return done.stdout if done.returncode == 0 else ""


def _kube_chains() -> set[tuple[str, str, str]]:
    """The KUBE-* iptables chains there are now: (tool, table, chain)."""
    found = set()
    for tool in ("iptables", "ip6tables"):
        table = ""
        for line in _iptables_save(tool).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                found.add((tool, table, line[1:].split()[0]))
    return found


def _remove_chains(chains: set[tuple[str, str, str]]) -> None:
    """Remove these chains and the rules that jump to them."""
    for tool, table, chain in sorted(chains):
        rules = []
        current = ""
        for line in _iptables_save(tool).splitlines():
            if line.startswith("*"):
                current = line[1:]
            elif current == table and line.startswith("-A ") and f"-j {chain}" in line:
                rules.append(shlex.split(line)[1:])
        for rule in rules:
            subprocess.run([tool, "-t", table, "-D", *rule], capture_output=True, timeout=30)
        subprocess.run([tool, "-t", table, "-F", chain], capture_output=True, timeout=30)
    for tool, table, chain in sorted(chains):
        subprocess.run([tool, "-t", table, "-X", chain], capture_output=True, timeout=30)


class RealNode:
    """containerd and the kubelet for node `name` of `plane`, as root; see the module."""

    def __init__(
        self,
        plane: realk8s.ControlPlane,
        name: str,
        *,
        node_status_seconds: float = 2.0,
        kubelet_args: Iterable[str] = (),
        log_dir: Path | None = None,
    ) -> None:
        self.plane = plane
        self.name = name
        self.node_status_seconds = node_status_seconds
        self.kubelet_args = list(kubelet_args)
        # Short: containerd's and the CRI's unix sockets live under it (107 bytes at most).
        self.workdir = Path(tempfile.mkdtemp(prefix="gas-rn-", dir="/tmp"))
        self.cgroup_root = f"/gas-realnode-{self.workdir.name}"
        # The logs outlive the node when the caller gives them a folder.
        self.log_dir = log_dir or self.workdir
        self.containerd: realk8s.Process | None = None
        self.kubelet: realk8s.Process | None = None
        self._lock: IO[bytes] | None = None
        self._device_plugin_entries: set[str] | None = None
        self._made_var_lib_kubelet = False
        self._made_container_logs = False
        self._ip_forward: str | None = None
        self._kube_chains: set[tuple[str, str, str]] | None = None
        self.kubeconfig = ""
        self.kubelet_config = self.workdir / "kubelet.yaml"
        self.kubelet_port = 0

    # ------------------------------------------------------------------- paths

    @property
    def root_dir(self) -> Path:
        """The kubelet's `--root-dir`."""
        return self.workdir / "kubelet"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def device_plugin_dir(self) -> Path:
        return DEVICE_PLUGIN_DIR

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def cdi_dir(self) -> Path:
        """The one folder containerd reads CDI specs from (a DRA driver writes them)."""
        return self.workdir / "cdi"

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> RealNode:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        reason = missing()
        if reason is not None:
            raise RuntimeError(reason)
        LOCK_PATH.touch(exist_ok=True)
        self._lock = open(LOCK_PATH, "wb")  # noqa: SIM115 - closed in stop()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another real node (another test run): wait for it rather than share its socket.
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        self._sweep_stale()
        self._made_var_lib_kubelet = not DEVICE_PLUGIN_DIR.parent.exists()
        self._made_container_logs = not CONTAINER_LOGS.exists()
        self._device_plugin_entries = (
            set(os.listdir(DEVICE_PLUGIN_DIR)) if DEVICE_PLUGIN_DIR.is_dir() else set()
        )
        # ptp turns IPv4 forwarding on; it is put back as it was on stop.
        with contextlib.suppress(OSError):
            self._ip_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text()
        self._kube_chains = _kube_chains()
        # What to put back, for a sweep after a test process that died (`_sweep_stale`).
        (self.workdir / "machine.json").write_text(
            json.dumps(
                {
                    "var_lib_kubelet": self._made_var_lib_kubelet,
                    "container_logs": self._made_container_logs,
                    "ip_forward": self._ip_forward,
                }
            )
        )
        self._make_cgroup_root()
        self._start_containerd()
        self._import_images()
        self._write_kubelet_files()
        self.start_kubelet()

    def _sweep_stale(self) -> None:
        """Clean up after a node whose test process died before stopping it: with the lock
        held, no other node lives, so any other working directory of one is stale."""
        for folder in Path("/tmp").glob("gas-rn-*"):
            if folder == self.workdir or not (folder / "containerd.toml").is_file():
                continue
            for pid in _pids_mentioning(str(folder)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stale = RealNode.__new__(RealNode)
            stale.workdir = folder
            stale.cgroup_root = f"/gas-realnode-{folder.name}"
            stale._kill_pods()
            stale._unmount_all()
            stale._remove_cgroups()
            try:
                made = json.loads((folder / "machine.json").read_text())
            except (OSError, ValueError):
                made = {}
            stale._made_var_lib_kubelet = bool(made.get("var_lib_kubelet"))
            stale._made_container_logs = bool(made.get("container_logs"))
            stale._device_plugin_entries = set()
            stale._clean_machine_paths()
            if made.get("ip_forward"):
                with contextlib.suppress(OSError):
                    Path("/proc/sys/net/ipv4/ip_forward").write_text(made["ip_forward"])
            shutil.rmtree(folder, ignore_errors=True)

    def _make_cgroup_root(self) -> None:
        """The kubelet's `cgroupRoot`, in every v1 hierarchy, so that every process of the
        node's pods can be found (and killed) there; cpuset needs its cpus and mems
        copied from the top before anything can join it."""
        for hierarchy in self._hierarchies():
            folder = hierarchy / self.cgroup_root.lstrip("/")
            folder.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (folder / key).write_text((hierarchy / key).read_text())

    @staticmethod
    def _hierarchies() -> list[Path]:
        if (CGROUP_FS / "cgroup.controllers").exists():
            return [CGROUP_FS]
        return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())

    def _containerd_config(self) -> str:
        state = self.workdir / "state"
        runc = shutil.which("runc")
        assert runc is not None
        cni_conf = self.workdir / "cni"
        cni_conf.mkdir(exist_ok=True)
        (cni_conf / "10-gas-realnode.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "gas-realnode",
                    "plugins": [
                        {
                            "type": "ptp",
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET}]],
                                "dataDir": str(self.workdir / "cni-ipam"),
                            },
                        }
                    ],
                },
                indent=2,
            )
        )
        # The 2.x layout (version 3): CRI's runtime and image parts are plugins of their
        # own. Everything that defaults to a machine-wide path points into the workdir.
        return f"""version = 3
root = "{self.workdir / "root"}"
state = "{state}"
imports = []

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.containerd_socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.workdir / "opt"}"

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{self.workdir / "s"}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{state / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{cni_conf}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    def _start_containerd(self) -> None:
        config = self.workdir / "containerd.toml"
        config.write_text(self._containerd_config())
        # Made before containerd starts: its CDI cache watches only folders that exist.
        self.cdi_dir.mkdir(exist_ok=True)
        binary = realk8s.binary("containerd", VERSION)
        shim = realk8s.binary("containerd-shim-runc-v2", VERSION)
        # containerd finds its runc shim on PATH.
        path = f"{shim.parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        self.containerd = realk8s.Process(
            "containerd",
            [str(binary), "--config", str(config), "--log-level", "info"],
            self.log_dir / "containerd.log",
            {"PATH": path},
        )
        deadline = time.monotonic() + 30
        while not self.containerd_socket.exists():
            self.containerd.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"containerd did not listen:\n{self.containerd.tail()}")
            time.sleep(0.1)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`ctr` against this node's containerd, in the CRI's namespace."""
        command = [
            str(realk8s.binary("ctr", VERSION)),
            "--address",
            str(self.containerd_socket),
            "--namespace",
            "k8s.io",
            *args,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {done.returncode}\n{done.stderr}")
        return done

    def _import_images(self) -> None:
        archive = build_image_archive(self.workdir / "images.tar")
        self.ctr("images", "import", "--no-unpack=false", str(archive))
        listed = self.ctr("images", "ls", "-q").stdout.split()
        for name in (IMAGE, SANDBOX_IMAGE):
            if name not in listed:
                raise RuntimeError(f"{name} not imported: ctr lists {listed}")

    def _write_kubelet_files(self) -> None:
        self.kubelet_port = realk8s.free_port()
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.pod_logs.mkdir(exist_ok=True)
        self.kubeconfig = self.plane.kubeconfig(
            f"kubelet-{self.name}", f"system:node:{self.name}", ["system:nodes"]
        )
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # 1.37 refuses a cgroup v1 host unless told it may run there.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "imageServiceEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": realk8s.free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": self.plane.ca_file},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.pod_logs),
            "failSwapOn": False,
            "maxPods": 30,
            "nodeStatusUpdateFrequency": f"{self.node_status_seconds:g}s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            # A shared test machine: neither disk nor image GC may evict the test's pods
            # or the locally imported images (nothing can pull them back).
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "resolvConf": "",
            # No KUBE-* iptables chains on the machine (nothing here needs them); any the
            # kubelet makes anyway are removed on stop.
            "makeIPTablesUtilChains": False,
        }
        self.kubelet_config.write_text(yaml.safe_dump(config))

    def start_kubelet(self) -> None:
        """Start the kubelet (again, after `stop_kubelet`: a kubelet restart)."""
        if self.kubelet is not None and self.kubelet.alive():
            raise RuntimeError("the kubelet is running")
        command = [
            str(realk8s.binary("kubelet", VERSION)),
            f"--config={self.kubelet_config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.workdir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            "--v=2",
            *self.kubelet_args,
        ]
        self.kubelet = realk8s.Process("kubelet", command, self.log_dir / "kubelet.log")

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop(timeout=20)

    def restart_kubelet(self) -> None:
        self.stop_kubelet()
        self.start_kubelet()

    def kubelet_metrics(self) -> str:
        """The kubelet's own /metrics, read as the cluster's admin (its client certificate;
        the kubelet's serving certificate is its own self-signed one)."""
        import ssl
        import urllib.request

        context = self.plane.admin_ssl_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{self.kubelet_port}/metrics"
        with urllib.request.urlopen(url, context=context, timeout=30) as answer:
            text: str = answer.read().decode()
        return text

    def registered_plugins(self) -> set[str]:
        """The plugin sockets the kubelet's plugin manager holds registered (its
        `plugin_manager_total_plugins`, actual state of the world)."""
        found = set()
        for line in self.kubelet_metrics().splitlines():
            if (
                line.startswith("plugin_manager_total_plugins{")
                and 'state="actual_state_of_world"' in line
                and not line.rstrip().endswith(" 0")
            ):
                start = line.index('socket_path="') + len('socket_path="')
                found.add(line[start : line.index('"', start)])
        return found

    def logs(self) -> str:
        """The tails of the kubelet's and containerd's logs, for a failure's message."""
        parts = []
        for process in (self.kubelet, self.containerd):
            if process is not None:
                parts.append(f"--- {process.name} ({process.log_path}):\n{process.tail(60)}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ readiness

    def wait_ready(self, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until the kubelet reports the node Ready, then lift the taints admission
        put on the new Node (no node lifecycle controller runs here to do it); the Node."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for process in (self.containerd, self.kubelet):
                assert process is not None
                if not process.alive():
                    raise RuntimeError(f"{process.name} exited:\n{self.logs()}")
            status, node = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
            if status == 200:
                last = node["status"].get("conditions")
                ready = [c for c in last or [] if c["type"] == "Ready"]
                if ready and ready[0]["status"] == "True":
                    return self.untaint()
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not Ready in {timeout:g} s ({last}):\n{self.logs()}")

    def untaint(self) -> dict[str, Any]:
        """Remove the not-ready and unreachable taints from the Node (the node lifecycle
        controller's job, which does not run here); the Node as a dict."""
        from kubernetes import client

        core: Any = client.CoreV1Api(self.plane.client())
        lifted = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        for _ in range(20):
            node = core.read_node(self.name)
            taints = node.spec.taints or []
            kept = [t for t in taints if t.key not in lifted]
            if len(kept) == len(taints):
                return dict(node.to_dict())
            patch = [
                # Another writer (the kubelet) in between: read again, patch again.
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": node.metadata.resource_version,
                },
                {
                    "op": "replace",
                    "path": "/spec/taints",
                    "value": [core.api_client.sanitize_for_serialization(t) for t in kept],
                },
            ]
            with contextlib.suppress(client.ApiException):
                core.patch_node(self.name, patch)
            time.sleep(0.2)
        raise RuntimeError(f"could not lift the taints of {self.name}")

    # -------------------------------------------------------------- what runs there

    def container_pid(self, container_id: str) -> int:
        """The host pid of a running container (`containerd://<id>` or the bare id)."""
        bare = container_id.removeprefix("containerd://")
        for line in self.ctr("tasks", "ls").stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == bare and fields[2] == "RUNNING":
                return int(fields[1])
        raise LookupError(f"no running task {bare}")

    @staticmethod
    def devices_seen(pid: int) -> dict[str, tuple[int, int]]:
        """The container's /dev/dri as its own mount namespace shows it: name -> (major,
        minor) of each character device there; empty when it has no /dev/dri."""
        dri = Path(f"/proc/{pid}/root/dev/dri")
        found: dict[str, tuple[int, int]] = {}
        if not dri.is_dir():
            return found
        for entry in dri.iterdir():
            info = entry.lstat()
            if stat.S_ISCHR(info.st_mode):
                found[entry.name] = (os.major(info.st_rdev), os.minor(info.st_rdev))
        return found

    @staticmethod
    def devices_allowed(pid: int) -> set[tuple[int, int]] | None:
        """DRM devices the container's devices cgroup lets it open: (major, minor); None
        on a cgroup v2 host, whose device rules are an eBPF program with nothing to read."""
        relative = None
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "devices" in controllers.split(","):
                relative = path
        if relative is None:
            return None
        rules = (CGROUP_FS / "devices" / relative.lstrip("/") / "devices.list").read_text()
        allowed: set[tuple[int, int]] = set()
        for line in rules.splitlines():
            kind, numbers, _ = line.split()
            major, minor = numbers.split(":")
            if kind == "c" and major == str(DRM_MAJOR) and minor != "*":
                allowed.add((DRM_MAJOR, int(minor)))
        return allowed

    # ----------------------------------------------------------------- teardown

    def stop(self) -> None:
        """Stop everything and leave the machine as it was; safe to call twice."""
        try:
            if self.kubelet is not None:
                self.kubelet.stop(timeout=15)
            self._kill_pods()
            if self.containerd is not None:
                self.containerd.stop(timeout=15)
            for pid in _pids_with(str(self.containerd_socket)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._unmount_all()
            self._remove_cgroups()
            self._clean_machine_paths()
            if self._kube_chains is not None:
                _remove_chains(_kube_chains() - self._kube_chains)
            if self._ip_forward is not None:
                with contextlib.suppress(OSError):
                    Path("/proc/sys/net/ipv4/ip_forward").write_text(self._ip_forward)
            shutil.rmtree(self.workdir, ignore_errors=True)
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def _cgroup_folders(self) -> list[Path]:
        """Every cgroup folder of the node, deepest first."""
        folders: list[Path] = []
        for hierarchy in self._hierarchies():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if top.is_dir():
                folders.extend(Path(p) for p, _, _ in os.walk(top))
        return sorted(folders, key=lambda p: -len(p.parts))

    def _kill_pods(self) -> None:
        """SIGKILL every process in the node's cgroups (the pods' containers and sandboxes),
        until none is left."""
        for _ in range(50):
            pids: set[int] = set()
            for folder in self._cgroup_folders():
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _unmount_all(self) -> None:
        for _ in range(5):
            points = _mounts_under(self.workdir)
            if not points:
                return
            for point in points:
                _umount(point)

    def _remove_cgroups(self) -> None:
        for _ in range(20):
            left = []
            for folder in self._cgroup_folders():
                try:
                    folder.rmdir()
                except OSError:
                    left.append(folder)
            if not left:
                return
            time.sleep(0.1)

    def _clean_machine_paths(self) -> None:
        if self._device_plugin_entries is not None:
            if self._made_var_lib_kubelet:
                shutil.rmtree(DEVICE_PLUGIN_DIR.parent, ignore_errors=True)
            elif DEVICE_PLUGIN_DIR.is_dir():
                for entry in set(os.listdir(DEVICE_PLUGIN_DIR)) - self._device_plugin_entries:
                    with contextlib.suppress(OSError):
                        (DEVICE_PLUGIN_DIR / entry).unlink()
        if CONTAINER_LOGS.is_dir():
            for link in CONTAINER_LOGS.iterdir():
                with contextlib.suppress(OSError):
                    if link.is_symlink() and os.readlink(link).startswith(str(self.workdir)):
                        link.unlink()
            if self._made_container_logs:
                with contextlib.suppress(OSError):
                    CONTAINER_LOGS.rmdir()


class GasNode:
    """`gas node` for a `RealNode`: its device plugin in the kubelet's real device-plugin
    folder, the kubelet's pod-resources socket, the fake sysfs and the device nodes under
    `devfs`. `restart()` stops it (SIGTERM) and starts it again."""

    def __init__(
        self,
        node: RealNode,
        kubeconfig: str,
        sysfs: Path,
        devfs: Path,
        log_path: Path,
        extra: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.log_path = log_path
        # `prefix`: what it runs under (setpriv, holding a deployment's capabilities).
        self.command = [
            *prefix,
            sys.executable,
            "-m",
            "gas.cli",
            "node",
            "--node-name",
            node.name,
            "--kubeconfig",
            kubeconfig,
            "--sysfs-root",
            str(sysfs),
            "--devfs-root",
            str(devfs),
            "--device-plugin-dir",
            str(node.device_plugin_dir),
            "--pod-resources-socket",
            str(node.pod_resources_socket),
            "--metrics-port",
            "0",
            "--rescan",
            "1",
            *extra,
        ]
        self.process: realk8s.Process | None = None
        self.start()

    def start(self) -> None:
        self.process = realk8s.Process(
            "gas-node", self.command, self.log_path, {"PYTHONUNBUFFERED": "1"}
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=20)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def registrations(self) -> int:
        """How many times a plugin of it has registered with the kubelet (this log)."""
        return self.log().count("registered with the kubelet as")
