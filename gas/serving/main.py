"""`gas serve`: from the command's flags to the extender running under gunicorn.

Decided in the calling process, before gunicorn forks, so that a bad flag or file fails
at once with a clear message: which cluster to serve (Kubernetes, or the built-in demo),
the TLS files, leader election or the scheduler's Lease to follow, the extender's options,
the health port's socket. Built in the worker, after the fork (threads do not survive it):
the ledger, the cluster and its list+watch threads, the elector or follower, the Flask app.
The health port is served by the worker's serving loop beside the main port.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gas.cluster.demo import DemoCluster, load_demo_file
from gas.cluster.leader import (
    LEASE_NAME,
    ElectionConfig,
    LeaderGatedCluster,
    default_identity,
    default_namespace,
    pod_name,
)
from gas.cluster.protocol import Cluster
from gas.core.allocator import Policy
from gas.core.ledger import Ledger
from gas.serving import health, limit_flags, server, tls
from gas.serving.extender import create_app
from gas.serving.metrics import Metrics
from gas.serving.service import Options

if TYPE_CHECKING:
    from flask import Flask

    from gas.cluster.kube import KubeCluster
    from gas.cluster.leader import Leadership

# The command's own logger: its messages read as `gas`'s, whichever module says them.
log = logging.getLogger("gas")


class StartupError(Exception):
    """`gas serve` cannot start; the message says why, `status` is the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class FollowPlan:
    """--schedulerLease: the Lease kube-scheduler elects itself on, and this pod."""

    lease: str
    namespace: str
    pod: str
    retry_period: float


@dataclass(frozen=True)
class WorkerPlan:
    """What the gunicorn worker builds the extender from."""

    options: Options
    pending_grace: float
    # The demo cluster's nodes and pods, or None to serve the Kubernetes cluster.
    demo_data: dict[str, Any] | None
    kubeconfig: str | None
    # Leader election and the Lease's namespace, or None for a single replica.
    election: tuple[ElectionConfig, str] | None
    # The scheduler's Lease to follow instead, or None.
    follow: FollowPlan | None = None


def run(args: argparse.Namespace, version: str) -> int:
    """Serve until stopped (0), or the exit status when gas cannot start: 1 when there is
    no cluster's configuration or it cannot be loaded, 2 for flags that do not go together.
    `version` is gas's, for the log."""
    try:
        demo = use_demo(args)
        kubeconfig = args.kubeConfig or os.environ.get("KUBECONFIG")
        demo_data = None
        if demo:
            demo_data = load_demo(args.demoFile)
        else:
            check_kubeconfig(kubeconfig)
        cert, key = tls_files(args, demo)
        election = election_config(args, demo)
        follow = follow_config(args, demo)
        limits = limit_flags.limits_from_args(args)
        health_socket = health_listener(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    except StartupError as exc:
        log.error("%s", exc)
        return exc.status
    plan = WorkerPlan(
        extender_options(args),
        args.pendingGrace,
        demo_data,
        kubeconfig,
        election,
        follow,
    )
    worker = Worker(plan)
    host = args.host or ("127.0.0.1" if demo else "0.0.0.0")
    scheme = "http" if args.unsafe else "https"
    where = "demo cluster" if demo else "Kubernetes cluster"
    log.info("gas %s serving %s://%s:%d (%s)", version, scheme, host, args.port, where)
    settings = server.ServerSettings(
        host=host,
        port=args.port,
        certfile=None if args.unsafe else cert,
        keyfile=None if args.unsafe else key,
        cafile=None if args.unsafe else args.cacert,
        unsafe=args.unsafe,
        threads=args.threads,
        limits=limits,
        health_socket=health_socket,
        # kube-scheduler's client then carries every call on one connection instead of
        # a new mutual-TLS handshake every few pods; clients not offering h2 keep HTTP/1.1.
        http2=True,
        on_worker_exit=worker.stop,
    )
    server.serve(worker.build_app, settings)
    return 0


def use_demo(args: argparse.Namespace) -> bool:
    """--demo; otherwise a kubeconfig or a pod's service account must reach a cluster.

    Never the demo by default: a gas that lost its kubeconfig would otherwise answer
    kube-scheduler from made-up nodes."""
    if args.demo:
        return True
    if args.kubeConfig or os.environ.get("KUBECONFIG"):
        return False
    from gas.cluster.kube import in_cluster

    if in_cluster():
        return False
    raise StartupError(
        "no cluster to serve: no --kubeConfig or KUBECONFIG, and not in a pod (no in-cluster "
        "configuration); --demo serves the built-in demo cluster",
        1,
    )


def load_demo(path: str | None) -> dict[str, Any]:
    try:
        return load_demo_file(path)
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot load the demo cluster: {exc}", 1) from None


def check_kubeconfig(kubeconfig: str | None) -> None:
    """Fails here, with a clear message, rather than in the worker."""
    from gas.cluster.kube import load_api_client

    try:
        load_api_client(kubeconfig)
    except Exception as exc:
        raise StartupError(f"cannot load Kubernetes client configuration: {exc}", 1) from None


def tls_files(args: argparse.Namespace, demo: bool) -> tuple[str | None, str | None]:
    """The server's certificate and key: as given, or for the demo cluster a throwaway
    self-signed pair."""
    cert, key = args.cert, args.key
    if not args.unsafe and not (cert and key):
        if not demo:
            raise StartupError("HTTPS needs --cert and --key (or --unsafe for plain HTTP)", 2)
        cert, key = demo_certificate()
    if not args.unsafe and not args.cacert:
        log.warning("no --cacert: client certificates are not verified")
    return cert, key


def demo_certificate() -> tuple[str, str]:
    """A throwaway self-signed certificate for localhost and its key, as paths the TLS
    context loads: in memory where Linux's memfd_create allows, else in a temporary folder
    removed when gas exits."""
    cert, key = tls.self_signed_pem(["localhost"])
    if hasattr(os, "memfd_create"):
        try:
            paths = _memory_file(cert), _memory_file(key)
        except OSError as exc:
            log.debug("the demo certificate cannot be held in memory: %s", exc)
        else:
            where = paths[0].replace("/proc/self/", f"/proc/{os.getpid()}/")
            log.info(
                "demo mode: a throwaway self-signed certificate, in memory only (%s while gas "
                "runs)",
                where,
            )
            return paths
    directory = tempfile.mkdtemp(prefix="gas-demo-tls-")
    owner = os.getpid()

    def remove() -> None:
        # gunicorn's workers are forked from this process and inherit the hook: a worker's
        # exit must not take the key from the worker that replaces it. The master, this
        # process, leaves through sys.exit on SIGTERM and SIGINT too.
        if os.getpid() == owner:
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)
    paths = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
    for path, pem in zip(paths, (cert, key), strict=True):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(pem)
    log.info("demo mode: a throwaway self-signed certificate %s, removed when gas exits", paths[0])
    return paths


def _memory_file(content: bytes) -> str:
    """`content` in an anonymous file, and a path that opens it in this process and in the
    gunicorn worker forked from it, which inherits the descriptor. The file lives as long as
    a process holds it: however gas ends, even killed, it leaves no key behind."""
    # Close-on-exec, memfd_create's default: a program gas starts does not get the key.
    fd = os.memfd_create("gas-demo-tls")
    path = f"/proc/self/fd/{fd}"
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(content)
        if not os.path.exists(path):
            raise OSError(f"no {path} to open it by")
    except OSError:
        os.close(fd)
        raise
    return path


def election_config(args: argparse.Namespace, demo: bool) -> tuple[ElectionConfig, str] | None:
    """With --leaderElect: the election's timings and identity, and the Lease's namespace."""
    if not args.leaderElect:
        return None
    if demo:
        raise StartupError("--leaderElect needs a Kubernetes cluster, not the demo cluster", 2)
    try:
        config = ElectionConfig(
            identity=default_identity(),
            lease_duration=args.leaseDuration,
            renew_deadline=args.renewDeadline,
            retry_period=args.retryPeriod,
        )
    except ValueError as exc:
        raise StartupError(str(exc), 2) from None
    namespace = args.leaderElectNamespace or default_namespace()
    log.info("leader election on Lease %s/%s as %s", namespace, LEASE_NAME, config.identity)
    return config, namespace


def follow_config(args: argparse.Namespace, demo: bool) -> FollowPlan | None:
    """With --schedulerLease: the Lease, its namespace and this pod's name."""
    if not args.schedulerLease:
        return None
    if args.leaderElect:
        raise StartupError(
            "--schedulerLease and --leaderElect do not go together: with --schedulerLease "
            "gas follows kube-scheduler's own election and holds none of its own",
            2,
        )
    if demo:
        raise StartupError("--schedulerLease needs a Kubernetes cluster, not the demo cluster", 2)
    pod = pod_name()
    if not pod:
        raise StartupError("--schedulerLease needs this pod's name: set POD_NAME", 2)
    namespace = args.leaderElectNamespace or default_namespace()
    log.info(
        "following kube-scheduler's Lease %s/%s: answering while it is held by %s_*",
        namespace,
        args.schedulerLease,
        pod,
    )
    return FollowPlan(args.schedulerLease, namespace, pod, args.retryPeriod)


def health_listener(args: argparse.Namespace) -> socket.socket | None:
    """With --healthPort: its socket, bound now so that a port in use fails at start."""
    if not args.healthPort:
        return None
    if args.healthPort == args.port:
        raise StartupError(f"--healthPort must differ from --port ({args.port})", 2)
    try:
        sock = health.listen(args.healthHost, args.healthPort)
    except ValueError as exc:
        raise StartupError(str(exc), 2) from None
    except OSError as exc:
        raise StartupError(
            f"cannot listen on the health port {args.healthHost}:{args.healthPort}: {exc}", 1
        ) from None
    log.info("health port: http://%s:%d (GET /healthz, /readyz)", args.healthHost, args.healthPort)
    return sock


def extender_options(args: argparse.Namespace) -> Options:
    return Options(
        max_request_bytes=args.maxRequestBytes,
        bind_events=args.bindEvents,
        policy=Policy(
            allowlist=args.enableAllowlist,
            denylist=args.enableDenylist,
            balanced_resource=args.balancedResource,
            placement=args.policy,
        ),
    )


class Worker:
    """Builds the extender in the gunicorn worker, and stops its elector (or follower) and
    health port when the worker exits."""

    def __init__(self, plan: WorkerPlan) -> None:
        self._plan = plan
        self._electors: list[Leadership] = []

    def build_app(self) -> Flask:
        # Runs in the gunicorn worker, where the ledger and its sync threads must live.
        plan = self._plan
        ledger = Ledger(policy=plan.options.policy, pending_grace=plan.pending_grace)
        metrics = Metrics()
        cluster = self._cluster(ledger, metrics)
        cluster.start()
        ready = cluster.ready if isinstance(cluster, LeaderGatedCluster) else None
        return create_app(ledger, cluster, plan.options, metrics, ready)

    def _cluster(self, ledger: Ledger, metrics: Metrics) -> Cluster:
        plan = self._plan
        if plan.demo_data is not None:
            return DemoCluster(ledger, plan.demo_data)
        from gas.cluster.kube import KubeCluster, load_api_client

        api_client = load_api_client(plan.kubeconfig)
        cluster = KubeCluster(ledger, api_client, metrics.sync)
        if plan.follow is not None:
            return self._follower(cluster, api_client, plan.follow, metrics)
        if plan.election is None:
            return cluster
        from gas.cluster.leader import Elector, KubeLeaseStore, leader_gauge

        config, namespace = plan.election
        store = KubeLeaseStore(api_client, namespace, LEASE_NAME, config.renew_deadline)
        elector = Elector(store, config, eligible=cluster.synced, on_change=leader_gauge(metrics))
        self._electors.append(elector)
        cluster.descheduler.gate(elector.is_leader)
        return LeaderGatedCluster(cluster, elector)

    def _follower(
        self, cluster: KubeCluster, api_client: Any, follow: FollowPlan, metrics: Metrics
    ) -> LeaderGatedCluster:
        from gas.cluster.follow import SchedulerLeaseFollower
        from gas.cluster.leader import KubeLeaseStore, leader_gauge

        store = KubeLeaseStore(api_client, follow.namespace, follow.lease, follow.retry_period)
        follower = SchedulerLeaseFollower(
            store,
            follow.pod,
            lease=f"{follow.namespace}/{follow.lease}",
            retry_period=follow.retry_period,
            on_change=leader_gauge(metrics),
        )
        self._electors.append(follower)
        cluster.descheduler.gate(follower.is_leader)
        # Every synced replica is ready: kube-scheduler's pods are Ready whoever leads, and
        # a rollout waits on that.
        return LeaderGatedCluster(cluster, follower, ready_when_following=True)

    def stop(self) -> None:
        # After the last request: step down (an elector gives the Lease up, so a follower
        # takes over at once rather than after leaseDuration).
        for elector in self._electors:
            elector.stop()
