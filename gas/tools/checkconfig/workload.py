"""A scheduler of gas's own, deployed as a workload (deploy/any-cluster): a
KubeSchedulerConfiguration whose profiles do not include default-scheduler, usually in a
ConfigMap, with gas beside kube-scheduler in the same pod.

That form has rules of its own. The webhook sends GPU pods to one scheduler name, which a
profile must carry. Exactly one gas may bind: gas (`--schedulerLease`) answers only while
the kube-scheduler of its own pod holds the Lease, so the scheduler must elect a leader on
that Lease, must not take the default scheduler's, and must call the gas of its own pod
(loopback). When the Deployment is given alongside, its containers' flags and
kube-scheduler's mounted files are read and the configuration is held to them; otherwise to
the defaults of deploy/any-cluster.
"""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from gas.core.admission import DEFAULT_SCHEDULER, GAS_SCHEDULER
from gas.tools.checkconfig.checker import Checker
from gas.tools.checkconfig.extenders import gas_entries
from gas.tools.checkconfig.load import LocatedMap, join_path, line_of
from gas.tools.checkconfig.values import Version, parse_version, version_text

# `gas webhook --schedulerName`'s default, and the profile of deploy/any-cluster.
WEBHOOK_SCHEDULER = GAS_SCHEDULER
# kube-scheduler's leader election defaults (kubescheduler.config.k8s.io/v1).
DEFAULT_LEASE = "kube-scheduler"
DEFAULT_LEASE_NAMESPACE = "kube-system"
GAS_PORT = 9001
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")


@dataclass(frozen=True)
class Mount:
    """A folder of kube-scheduler's container: the files it holds, when the manifest says
    (a Secret's or ConfigMap's `items`), else None."""

    path: str
    files: frozenset[str] | None


@dataclass(frozen=True)
class Workload:
    """What a Deployment given alongside says about the pods that run the scheduler."""

    name: str
    replicas: int
    # gas serve's flags: the Lease it follows (None: gas runs without --schedulerLease),
    # the namespace it reads it in, and where it listens.
    gas: bool = False
    scheduler_lease: str | None = None
    lease_namespace: str | None = None
    gas_host: str | None = None
    gas_port: int = GAS_PORT
    # gas serve's --policy (None: its default, first fit).
    policy: str | None = None
    # gas webhook's --schedulerName, if the pod runs the webhook.
    webhook_scheduler: str | None = None
    # kube-scheduler's folders, if the pod runs it.
    scheduler_mounts: tuple[Mount, ...] | None = None
    # The version of kube-scheduler's image (its tag: v1.37.2 gives 1.37), when it has one.
    scheduler_version: Version | None = None


def second_scheduler(doc: LocatedMap) -> bool:
    """True when no profile is the default scheduler: pods reach it only by naming it."""
    profiles = doc.get("profiles")
    if not isinstance(profiles, list) or not profiles:
        return False
    names = [p.get("schedulerName", DEFAULT_SCHEDULER) for p in profiles if isinstance(p, dict)]
    return DEFAULT_SCHEDULER not in names


def find_workload(documents: list[LocatedMap]) -> Workload | None:
    """The first workload among ``documents`` whose pods run `gas serve` or `gas webhook`."""
    for doc in documents:
        if doc.get("kind") not in WORKLOAD_KINDS:
            continue
        spec = _map(doc.get("spec"))
        pod = _map(_map(spec.get("template")).get("spec"))
        containers = pod.get("containers")
        if not isinstance(containers, list):
            continue
        metadata = _map(doc.get("metadata"))
        namespace = metadata.get("namespace")
        replicas = spec.get("replicas", 1)
        workload = Workload(
            name=f"{doc.get('kind')} {metadata.get('name')}",
            replicas=replicas if isinstance(replicas, int) else 1,
            lease_namespace=namespace if isinstance(namespace, str) else None,
        )
        volumes = pod.get("volumes")
        by_name = {
            str(v.get("name")): v
            for v in (volumes if isinstance(volumes, list) else [])
            if isinstance(v, dict)
        }
        for container in containers:
            if isinstance(container, dict):
                workload = _read_container(workload, container, by_name)
        if workload.gas or workload.webhook_scheduler is not None:
            return workload
    return None


def _map(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _strings(value: object) -> list[str]:
    return [str(v) for v in value if isinstance(v, (str, int))] if isinstance(value, list) else []


def _read_container(
    workload: Workload, container: dict[str, object], volumes: dict[str, dict[str, object]]
) -> Workload:
    """``workload`` with what one container tells: gas's or the webhook's flags, or
    kube-scheduler's folders."""
    args = _strings(container.get("args"))
    command = _strings(container.get("command"))
    if args and args[0] == "serve":
        flags = _flags(args[1:])
        port = GAS_PORT
        with contextlib.suppress(ValueError):
            port = int(flags.get("port", GAS_PORT))
        return replace(
            workload,
            gas=True,
            scheduler_lease=flags.get("schedulerLease") or None,
            lease_namespace=flags.get("leaderElectNamespace") or workload.lease_namespace,
            gas_host=flags.get("host"),
            gas_port=port,
            policy=flags.get("policy") or None,
        )
    if args and args[0] == "webhook":
        scheduler = _flags(args[1:]).get("schedulerName", WEBHOOK_SCHEDULER)
        return replace(workload, webhook_scheduler=scheduler)
    image = str(container.get("image", ""))
    if "kube-scheduler" in image or (command and command[0].endswith("kube-scheduler")):
        mounts = container.get("volumeMounts")
        found = [
            _mount(m, volumes.get(str(m.get("name"))) or {})
            for m in (mounts if isinstance(mounts, list) else [])
            if isinstance(m, dict) and isinstance(m.get("mountPath"), str)
        ]
        return replace(
            workload, scheduler_mounts=tuple(found), scheduler_version=_image_version(image)
        )
    return workload


def _image_version(image: str) -> Version | None:
    """The Kubernetes version of an image reference's tag (`...:v1.37.2`), if it is one."""
    name = image.split("@", 1)[0]
    tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else ""
    try:
        return parse_version(tag) if tag.startswith("v") else None
    except ValueError:
        return None


def _mount(mount: dict[str, object], volume: dict[str, object]) -> Mount:
    path = str(mount["mountPath"]).rstrip("/")
    source = _map(volume.get("secret")) or _map(volume.get("configMap"))
    items = source.get("items")
    if mount.get("subPath") or not isinstance(items, list):
        return Mount(path, None)
    return Mount(path, frozenset(str(i.get("path")) for i in items if isinstance(i, dict)))


def _flags(args: list[str]) -> dict[str, str]:
    """`--name=value` and `--name value` (one dash or two, as gas takes them)."""
    flags: dict[str, str] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("-"):
            name = arg.lstrip("-")
            if "=" in name:
                key, _, value = name.partition("=")
                flags[key] = value
            elif index + 1 < len(args) and not args[index + 1].startswith("-"):
                flags[name] = args[index + 1]
                index += 1
            else:
                flags[name] = ""
        index += 1
    return flags


def check_second_scheduler(checker: Checker, doc: LocatedMap, workload: Workload | None) -> None:
    """The rules of a scheduler of gas's own (``second_scheduler(doc)`` is true)."""
    _scheduler_name(checker, doc, workload)
    _leader_election(checker, doc, workload)
    if workload is not None:
        _scheduler_version(checker, workload)
    for index, entry in gas_entries(doc):
        _loopback(checker, entry, join_path("extenders", index), workload)
        if workload is not None and workload.scheduler_mounts is not None:
            _mounted(checker, entry, join_path("extenders", index), workload)


def check_default_profile_url(checker: Checker, doc: LocatedMap) -> None:
    """The default scheduler (a static pod on a control-plane node) calling gas on loopback
    reaches that node, where gas does not run."""
    for index, entry in gas_entries(doc):
        host = _host(entry)
        if host is not None and _is_loopback(host):
            checker.warning(
                join_path(join_path("extenders", index), "urlPrefix"),
                f"{host} is the scheduler's own loopback: right only when gas runs in the "
                "scheduler's pod (deploy/any-cluster, whose profile is not "
                "default-scheduler); a kube-scheduler static pod reaches gas through its "
                "Service (https://gas-extender.gas-system.svc:9001)",
                line_of(entry, "urlPrefix"),
            )


def _scheduler_version(checker: Checker, workload: Workload) -> None:
    """kube-scheduler's image against the cluster's version (--kubernetesVersion)."""
    cluster, scheduler = checker.version, workload.scheduler_version
    if cluster is None or scheduler is None or scheduler == cluster:
        return
    own = f"the cluster's own version (v{version_text(cluster)}.x)"
    if scheduler > cluster:
        # Measured: kube-scheduler 1.37 against kube-apiserver 1.28 lists the resource.k8s.io
        # kinds 1.28 does not serve, retries forever and binds no pod.
        checker.error(
            "",
            f"kube-scheduler in {workload.name} is v{version_text(scheduler)}, newer than "
            f"the cluster ({version_text(cluster)}), outside Kubernetes' version skew policy: it "
            "may wait for APIs the API server does not serve and schedule no pod (1.37 on "
            f"1.28 waits forever for resource.k8s.io); use {own}",
            None,
        )
    elif cluster[0] != scheduler[0] or cluster[1] - scheduler[1] > 1:
        checker.warning(
            "",
            f"kube-scheduler in {workload.name} is v{version_text(scheduler)}, more than one "
            f"minor version older than the cluster ({version_text(cluster)}), outside "
            "Kubernetes' version skew policy: it schedules without what newer versions "
            f"added (DRA claims among them); use {own}",
            None,
        )


def _scheduler_name(checker: Checker, doc: LocatedMap, workload: Workload | None) -> None:
    profiles = doc.get("profiles")
    assert isinstance(profiles, list)
    names = [p.get("schedulerName") for p in profiles if isinstance(p, LocatedMap)]
    if workload is not None and workload.webhook_scheduler is not None:
        expected = workload.webhook_scheduler
        if expected not in names:
            checker.error(
                "profiles",
                f"no profile is named {expected!r}, the schedulerName the webhook of "
                f"{workload.name} sets on GPU pods (--schedulerName): no scheduler would "
                "ever take them, and they stay Pending",
                line_of(doc, "profiles"),
            )
    elif WEBHOOK_SCHEDULER not in names:
        checker.warning(
            "profiles",
            f"no profile is named {WEBHOOK_SCHEDULER!r}, the schedulerName gas webhook sets "
            "on GPU pods by default: start it with --schedulerName set to one of "
            f"{', '.join(repr(n) for n in names)}, or GPU pods stay Pending (give the "
            "Deployment too to check its flags)",
            line_of(doc, "profiles"),
        )


def _leader_election(checker: Checker, doc: LocatedMap, workload: Workload | None) -> None:
    election = doc.get("leaderElection")
    election = election if isinstance(election, LocatedMap) else LocatedMap()
    line = line_of(doc, "leaderElection") or doc.line
    follows = workload.scheduler_lease if workload is not None else None
    who = workload.name if workload is not None else ""
    if election.get("leaderElect") is False:
        where = "leaderElection.leaderElect"
        if follows is not None:
            checker.error(
                where,
                f"false, but gas in {who} follows Lease "
                f"{follows!r} (--schedulerLease): no scheduler ever holds it, so gas answers "
                "every call with 503 and no GPU pod is scheduled",
                line_of(election, "leaderElect"),
            )
        elif workload is not None and workload.replicas > 1:
            checker.error(
                where,
                f"false with {workload.replicas} replicas of {workload.name}: each schedules "
                "and each gas binds from books of its own, so two pods can be given the "
                "same card",
                line_of(election, "leaderElect"),
            )
        elif workload is None:
            checker.warning(
                where,
                "false: run a single replica only, and gas without --schedulerLease (it "
                "would wait for a Lease nobody holds)",
                line_of(election, "leaderElect"),
            )
        return
    name = election.get("resourceName", DEFAULT_LEASE)
    namespace = election.get("resourceNamespace", DEFAULT_LEASE_NAMESPACE)
    if name == DEFAULT_LEASE and namespace == DEFAULT_LEASE_NAMESPACE:
        checker.error(
            "leaderElection.resourceName",
            f"{'missing: defaults to' if 'resourceName' not in election else 'is'} "
            f"{DEFAULT_LEASE!r} in {DEFAULT_LEASE_NAMESPACE}, the default scheduler's Lease: "
            "while one of the two schedulers holds it the other schedules nothing, so "
            "either every pod of the default scheduler or every GPU pod waits; name a "
            "Lease of its own (gas-scheduler in gas's namespace)",
            line_of(election, "resourceName") or line,
        )
        return
    if follows is not None and name != follows:
        checker.error(
            "leaderElection.resourceName",
            f"{name!r}, but gas in {who} follows Lease "
            f"{follows!r} (--schedulerLease): gas would never see its scheduler lead, and "
            "answers every call with 503",
            line_of(election, "resourceName") or line,
        )
    lease_namespace = workload.lease_namespace if workload is not None else None
    if follows is not None and lease_namespace is not None and namespace != lease_namespace:
        checker.error(
            "leaderElection.resourceNamespace",
            f"{'missing: defaults to ' if 'resourceNamespace' not in election else ''}"
            f"{namespace!r}, but gas reads Lease {follows!r} in {lease_namespace!r} (its pod's "
            "namespace, or --leaderElectNamespace)",
            line_of(election, "resourceNamespace") or line,
        )
    elif "resourceNamespace" not in election:
        checker.warning(
            "leaderElection.resourceNamespace",
            f"missing: the Lease is then in {DEFAULT_LEASE_NAMESPACE}; gas reads it in its "
            "own namespace (gas-system), where deploy/any-cluster grants it",
            line,
        )


def _loopback(checker: Checker, entry: LocatedMap, path: str, workload: Workload | None) -> None:
    host = _host(entry)
    if host is None:
        return
    where = join_path(path, "urlPrefix")
    line = line_of(entry, "urlPrefix")
    follows = workload is not None and workload.scheduler_lease is not None
    if not _is_loopback(host):
        message = (
            f"{host} is not loopback: the leading scheduler may call another pod's gas, and "
            "with --schedulerLease only the gas beside the leader answers (the others "
            "answer 503); call gas in the scheduler's own pod (https://127.0.0.1:9001/scheduler)"
        )
        if follows:
            checker.error(where, message, line)
        else:
            checker.warning(where, message, line)
        return
    if workload is None or not workload.gas:
        return
    port = urlsplit(str(entry.get("urlPrefix"))).port or 443
    if port != workload.gas_port:
        checker.error(
            where,
            f"port {port}, but gas in {workload.name} listens on {workload.gas_port} (--port)",
            line,
        )
    if workload.gas_host is not None and not (
        _is_loopback(workload.gas_host) or workload.gas_host in ("0.0.0.0", "::", "[::]")
    ):
        checker.error(
            where,
            f"gas in {workload.name} listens on {workload.gas_host} (--host), not on loopback",
            line,
        )


def _host(entry: LocatedMap) -> str | None:
    url = entry.get("urlPrefix")
    if not isinstance(url, str):
        return None
    try:
        return urlsplit(url).hostname or None
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _mounted(checker: Checker, entry: LocatedMap, path: str, workload: Workload) -> None:
    """The TLS files the extender entry names are in kube-scheduler's container."""
    config = entry.get("tlsConfig")
    if not isinstance(config, LocatedMap):
        return
    mounts = workload.scheduler_mounts or ()
    for key in ("caFile", "certFile", "keyFile"):
        file = config.get(key)
        if not isinstance(file, str) or not file:
            continue
        # The deepest mount the file is under is the one the container sees it through.
        under = sorted(
            (m for m in mounts if file.startswith(m.path + "/")), key=lambda m: -len(m.path)
        )
        if not under:
            problem = f"no volume is mounted at {file.rpartition('/')[0] or '/'}"
        elif under[0].files is not None and file[len(under[0].path) + 1 :] not in under[0].files:
            held = ", ".join(sorted(under[0].files))
            problem = f"the volume mounted at {under[0].path} holds only {held}"
        else:
            continue
        checker.error(
            join_path(join_path(path, "tlsConfig"), key),
            f"kube-scheduler in {workload.name} cannot read {file}: {problem}, so it cannot "
            "call gas",
            line_of(config, key),
        )
