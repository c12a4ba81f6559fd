"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-scheduler.

For what the API-server double cannot tell: admission webhooks, RBAC as the real authorizer
applies it, the real kube-scheduler calling gas. The binaries are those of one `Release`:
``<repo>/../shared/k8s`` (v1.28) or ``<repo>/../shared/k8s-1.37`` (v1.37), xz-compressed,
unpacked once into a cache directory and checked against their SHA256SUMS; etcd is the
system's (Debian's etcd-server). Tests take the version from the `k8s` fixture
(tests/conftest.py), which runs them once per version and skips a version whose folder is
absent.

There is no kubelet here (tests/support/realnode.py adds one), and kube-controller-manager
runs only when a test asks for it (`start_controller_manager`, 1.37): otherwise a Node is
only what a test creates, and pods are bound, never run.

    with ControlPlane(tmp_path, version=k8s.version) as plane:
        core = kubernetes.client.CoreV1Api(plane.client())
        plane.start_scheduler(CONFIG)

Every process runs in its own process group, killed as a group when the plane stops; the
logs stay in the working directory and their tails are in the error of a failed start.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import ipaddress
import json
import lzma
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if TYPE_CHECKING:
    from tests.support.gasproc import TLSFiles

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Release:
    """One Kubernetes version's binaries: a folder of ``<name>.xz`` files and SHA256SUMS."""

    version: str
    folder: Path
    # What every test on this version needs; the rest (kubelet, containerd) is asked for
    # by name through `missing(names=...)`.
    control_plane: tuple[str, ...] = ("kube-apiserver", "kube-scheduler", "kubectl")

    @property
    def id(self) -> str:
        return f"k8s-{self.version}"


RELEASES: dict[str, Release] = {
    "1.28": Release("1.28", ROOT.parent / "shared" / "k8s"),
    "1.37": Release("1.37", ROOT.parent / "shared" / "k8s-1.37"),
}
# Every version a real-binary test runs on, oldest first.
VERSIONS: tuple[str, ...] = tuple(RELEASES)
NEWEST = VERSIONS[-1]
# The node half's binaries (only 1.37's folder has them).
NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")


def release(version: str) -> Release:
    try:
        return RELEASES[version]
    except KeyError:
        raise ValueError(f"no Kubernetes {version!r} here; known: {', '.join(VERSIONS)}") from None


def etcd_path() -> str | None:
    return shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


def missing(version: str, names: Iterable[str] | None = None) -> str | None:
    """Why Kubernetes `version`'s real binaries (its control plane, or `names`) cannot run
    here (for a skip), or None when they can."""
    found = release(version)
    folder = found.folder
    if not (folder / "SHA256SUMS").is_file():
        return f"no real Kubernetes {version} binaries: {folder} is absent"
    wanted = found.control_plane if names is None else tuple(names)
    absent = [name for name in wanted if not (folder / f"{name}.xz").is_file()]
    if absent:
        return f"{folder} lacks {', '.join(n + '.xz' for n in absent)}"
    if names is None and etcd_path() is None:
        return "no etcd (Debian package etcd-server)"
    return None


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gas-k8s"


def _sums(folder: Path) -> dict[str, str]:
    sums: dict[str, str] = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0]
    return sums


def binary(name: str, version: str) -> Path:
    """Kubernetes `version`'s unpacked binary `name`, from the cache
    (~/.cache/gas-k8s/<sha256>/<name>).

    Unpacked to a temporary file, checked against SHA256SUMS and only then renamed into
    place, so that parallel test runs never see half a binary.
    """
    folder = release(version).folder
    reason = missing(version, [name])
    if reason is not None:
        raise RuntimeError(reason)
    expected = _sums(folder).get(name)
    if expected is None:
        raise RuntimeError(f"{folder / 'SHA256SUMS'} has no sum for {name}")
    target = _cache_root() / expected / name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, lzma.open(folder / f"{name}.xz") as compressed:
            while chunk := compressed.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise RuntimeError(
                f"{name}.xz unpacks to sha256 {digest.hexdigest()}, SHA256SUMS says {expected}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Process:
    """A child process in its own process group, its output in a log file."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        # KUBECONFIG of the environment must not lead a process to another cluster.
        full = dict(os.environ)
        full.pop("KUBECONFIG", None)
        full.update(env or {})
        self.popen = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with {self.popen.returncode}; log {self.log_path}:\n"
                + self.tail()
            )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the whole group, SIGKILL after `timeout`; reaps the process."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        # Whatever the leader left in its group goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)
        self._log.close()


def _pem(obj: Any) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    data: bytes = obj.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return data


class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, with a CA of its own.

    `workdir` holds the certificates, kubeconfigs, etcd's data and every process's log.
    `apiserver_args` are extra kube-apiserver flags (e.g. ``--enable-admission-plugins``).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        version: str,
        apiserver_args: Iterable[str] = (),
        ready_timeout: float = 60.0,
    ) -> None:
        self.version = release(version).version
        self.workdir = Path(workdir)
        self.apiserver_args = list(apiserver_args)
        self.ready_timeout = ready_timeout
        self.port = 0
        self.etcd_port = 0
        self.processes: list[Process] = []
        self.etcd: Process | None = None
        self.apiserver: Process | None = None
        self._ca: tuple[x509.Certificate, Any] | None = None

    # ----------------------------------------------------------------- paths and names

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        return str(self.workdir / "pki" / "ca.crt")

    @property
    def admin_kubeconfig(self) -> str:
        return str(self.workdir / "admin.kubeconfig")

    # ------------------------------------------------------------------- certificates

    def _ca_pair(self) -> tuple[x509.Certificate, Any]:
        if self._ca is None:
            raise RuntimeError("the control plane is not started")
        return self._ca

    def client_certificate(self, user: str, groups: Iterable[str] = ()) -> tuple[bytes, bytes]:
        """A client certificate (PEM) and key (PEM) for `user` in `groups` (CN and O, as
        the API server reads them), signed by the plane's CA."""
        from gas.serving import tls

        ca_cert, ca_key = self._ca_pair()
        key = tls.new_private_key("ec")
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(ca_key, hashes.SHA256())
        )
        return _pem(cert), _pem(key)

    def kubeconfig(self, name: str, user: str, groups: Iterable[str] = ()) -> str:
        """Write `<workdir>/<name>.kubeconfig`: this API server, a client certificate for
        `user` in `groups`; returns its path."""
        cert, key = self.client_certificate(user, groups)
        ca = Path(self.ca_file).read_bytes()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(ca).decode(),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": base64.b64encode(cert).decode(),
                        "client-key-data": base64.b64encode(key).decode(),
                    },
                }
            ],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": user}}],
            "current-context": "real",
        }
        path = self.workdir / f"{name}.kubeconfig"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(config, f)
        return str(path)

    def _write_pki(self) -> dict[str, str]:
        from gas.serving import tls

        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca_cert, ca_key = tls.new_ca("gas-realk8s-ca")
        self._ca = (ca_cert, ca_key)
        tls.write_pem(pki / "ca.crt", ca_cert)
        # For kube-controller-manager's certificate signer, when a test starts it.
        tls.write_pem(pki / "ca.key", ca_key, private=True)
        serving, serving_key = tls.issue_certificate(
            ca_cert,
            ca_key,
            "kube-apiserver",
            ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.0.0.1")],
            server=True,
            client=False,
        )
        tls.write_pem(pki / "apiserver.crt", serving)
        tls.write_pem(pki / "apiserver.key", serving_key, private=True)
        sa_key = tls.new_private_key("rsa")
        tls.write_pem(pki / "sa.key", sa_key, private=True)
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        admin_cert, admin_key = self.client_certificate("gas-admin", ["system:masters"])
        (pki / "admin.crt").write_bytes(admin_cert)
        fd = os.open(pki / "admin.key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(admin_key)
        return {name: str(pki / name) for name in ("apiserver.crt", "apiserver.key", "sa.key")}

    # -------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        reason = missing(self.version)
        if reason is not None:
            raise RuntimeError(reason)
        self.workdir.mkdir(parents=True, exist_ok=True)
        apiserver_bin = binary("kube-apiserver", self.version)
        pki = self._write_pki()
        etcd = etcd_path()
        assert etcd is not None
        self.etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.etcd = self._spawn(
            "etcd",
            [
                etcd,
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer_port}",
                # A test cluster: etcd's fsync per write would make it disk-bound.
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )
        self.apiserver = self._spawn(
            "kube-apiserver",
            [
                str(apiserver_bin),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--etcd-servers={etcd_url}",
                f"--tls-cert-file={pki['apiserver.crt']}",
                f"--tls-private-key-file={pki['apiserver.key']}",
                f"--client-ca-file={self.ca_file}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.workdir / 'pki' / 'sa.pub'}",
                f"--service-account-signing-key-file={pki['sa.key']}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                *self.apiserver_args,
            ],
        )
        self._write_admin_kubeconfig()
        self._wait_ready()
        self.prepare_namespace("default")

    def _write_admin_kubeconfig(self) -> None:
        pki = self.workdir / "pki"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {"server": self.url, "certificate-authority": self.ca_file},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(pki / "admin.crt"),
                        "client-key": str(pki / "admin.key"),
                    },
                }
            ],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": "admin"}}],
            "current-context": "real",
        }
        Path(self.admin_kubeconfig).write_text(yaml.safe_dump(config))

    def _spawn(
        self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Process:
        process = Process(name, command, self.workdir / f"{name}.log", env)
        self.processes.append(process)
        return process

    def admin_ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        pki = self.workdir / "pki"
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return context

    def _wait_ready(self) -> None:
        context = self.admin_ssl_context()
        deadline = time.monotonic() + self.ready_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            for process in (self.etcd, self.apiserver):
                assert process is not None
                process.check_alive()
            try:
                with urllib.request.urlopen(self.url + "/readyz", context=context, timeout=2) as r:
                    if r.status == 200:
                        return
                    last = f"{r.status}"
            except urllib.error.HTTPError as exc:
                last = f"{exc.code} {exc.read()[:2000].decode(errors='replace')}"
            except (OSError, ssl.SSLError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise TimeoutError(
            f"kube-apiserver not ready within {self.ready_timeout:g} s (last: {last});\n"
            f"kube-apiserver log:\n{_tail(self.workdir / 'kube-apiserver.log')}\n"
            f"etcd log:\n{_tail(self.workdir / 'etcd.log')}"
        )

    def request(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """One admin call to the API server: (status, decoded JSON answer)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, context=self.admin_ssl_context(), timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def prepare_namespace(self, name: str) -> None:
        """Create namespace `name` (if absent) with what kube-controller-manager would put
        in it: the `default` ServiceAccount (without which the ServiceAccount admission
        refuses every pod) and the `kube-root-ca.crt` ConfigMap (which a pod's projected
        token volume mounts)."""
        ca = Path(self.ca_file).read_text()
        objects = [
            ("/api/v1/namespaces", {"metadata": {"name": name}}),
            (f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}}),
            (
                f"/api/v1/namespaces/{name}/configmaps",
                {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca}},
            ),
        ]
        for path, body in objects:
            status, answer = self.request("POST", path, body)
            if status not in (201, 409):
                raise RuntimeError(f"POST {path}: {status} {answer}")

    def stop(self) -> None:
        # The scheduler and other clients first, etcd last.
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()

    def __enter__(self) -> ControlPlane:
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

    # --------------------------------------------------------------------- clients

    def client(self, kubeconfig: str | None = None) -> Any:
        """A `kubernetes.client.ApiClient` for the admin (or the given kubeconfig)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=kubeconfig or self.admin_kubeconfig)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        kubeconfig: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this plane (the admin unless `kubeconfig`); output as text.

        With `check`, a non-zero exit raises with kubectl's stderr in the message."""
        command = [
            str(binary("kubectl", self.version)),
            f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            *args,
        ]
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        done = subprocess.run(
            command, input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} exited with {done.returncode}:\n"
                f"{done.stderr}{done.stdout}"
            )
        return done

    # ------------------------------------------------------------------- scheduler

    def start_scheduler(
        self,
        config_yaml_text: str,
        *,
        name: str = "kube-scheduler",
        kubeconfig: str | None = None,
        args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Process:
        """Start a real kube-scheduler with this KubeSchedulerConfiguration; stopped with
        the plane (or earlier by ``.stop()``).

        Filled in where the configuration leaves them out: ``clientConnection.kubeconfig``
        (a kubeconfig for ``system:kube-scheduler``, whom the bootstrap RBAC allows what
        the scheduler does, or `kubeconfig`) and ``leaderElection.leaderElect: false``.
        It serves no HTTPS of its own (``--secure-port=0``) unless `args` says otherwise.
        """
        config = yaml.safe_load(config_yaml_text) or {}
        if not isinstance(config, dict):
            raise ValueError("a KubeSchedulerConfiguration must be a mapping")
        config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        config.setdefault("kind", "KubeSchedulerConfiguration")
        connection = config.setdefault("clientConnection", {})
        if not connection.get("kubeconfig"):
            connection["kubeconfig"] = kubeconfig or self.kubeconfig(
                f"{name}-user", "system:kube-scheduler"
            )
        config.setdefault("leaderElection", {}).setdefault("leaderElect", False)
        path = self.workdir / f"{name}.config.yaml"
        path.write_text(yaml.safe_dump(config))
        extra = list(args)
        command = [str(binary("kube-scheduler", self.version)), f"--config={path}"]
        if not any(a.startswith("--secure-port") for a in extra):
            command.append("--secure-port=0")
        if not any(a.startswith("--bind-address") for a in extra):
            command.append("--bind-address=127.0.0.1")
        command += extra
        return self._spawn(name, command, env)

    def start_controller_manager(
        self, controllers: str = "*,-nodeipam,-nodelifecycle", args: Iterable[str] = ()
    ) -> Process:
        """Start kube-controller-manager (a version whose folder has it: 1.37) as the
        cluster's admin; stopped with the plane.

        What a test without it must do by hand, it does: a namespace's `default`
        ServiceAccount and `kube-root-ca.crt`, claims from ResourceClaimTemplates and their
        release when the last pod is gone, garbage collection. By default without node IPAM
        (no pod CIDRs here) and node lifecycle (which would taint and evict the nodes a test
        POSTs, having no kubelet behind them); a test with a real kubelet may ask for it.
        """
        pki = self.workdir / "pki"
        command = [
            str(binary("kube-controller-manager", self.version)),
            f"--kubeconfig={self.admin_kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--controllers={controllers}",
            f"--root-ca-file={self.ca_file}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=false",
            f"--cluster-signing-cert-file={self.ca_file}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            *args,
        ]
        return self._spawn("kube-controller-manager", command)


def gas_extender(port: int, tls: TLSFiles, **fields: Any) -> dict[str, Any]:
    """A KubeSchedulerConfiguration `extenders` entry for gas on 127.0.0.1:`port`: every
    verb, both GPU resources, over mutual TLS with `tls`'s client certificate; `fields`
    add to or replace its keys."""
    return {
        "urlPrefix": f"https://127.0.0.1:{port}/scheduler",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "bindVerb": "bind",
        "weight": 1,
        "enableHTTPS": True,
        "nodeCacheCapable": True,
        "managedResources": [
            {"name": "gpu.intel.com/i915", "ignoredByScheduler": False},
            {"name": "gpu.intel.com/xe", "ignoredByScheduler": False},
        ],
        "tlsConfig": {"caFile": tls.ca, "certFile": tls.client_cert, "keyFile": tls.client_key},
        **fields,
    }


def add_schedulable_node(core: Any, node: dict[str, Any]) -> None:
    """Create `node` (a `kubernetes.client.CoreV1Api` in `core`) as kube-scheduler will place
    pods on it: room for pods, Ready, its hostname label, and untainted."""
    name = node["metadata"]["name"]
    for key in ("capacity", "allocatable"):
        node["status"][key].update({"cpu": "8", "memory": "32Gi", "pods": "110"})
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    core.create_node(node)
    # No kubelet lifts the not-ready taint admission puts on a new node.
    core.patch_node(name, [{"op": "remove", "path": "/spec/taints"}])
