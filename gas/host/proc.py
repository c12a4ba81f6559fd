"""The node's processes that hold a GPU open, read from `/proc`: their DRM clients, their pod
and container, and (when asked) their GAS_* environment.

A process holds a GPU through a DRM fd: `fd/<n>` links to `/dev/dri/card<N>` or
`/dev/dri/renderD<M>`, and `fdinfo/<n>` describes the client behind it
(`gas.host.fdinfo`). Its cgroup names its pod and container (`gas.host.cgroups`).

Only the link's text is read (`os.readlink`), never the file it names: under a
`--proc-root` other than `/proc` (the host's, mounted in a container), the links name the
host's device nodes, which are not this root's to open. Every other fd costs one readlink;
only a DRM fd's fdinfo is read, and a process's cgroup and environment only when it holds
one.

Processes come and go while they are read: one that is gone before its fds are listed
held nothing; one that goes (or closes an fd) after holds what was read of it, and is
marked incomplete. What was partial is said once per scan, in counts (`ProcScan.notes`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gas.host.cgroups import PodContainer, pod_container
from gas.host.fdinfo import DrmClient, parse_fdinfo

_DRM_LINK = re.compile(r"^/dev/dri/(?:card|renderD)[0-9]+$")
_DRM_PREFIX = "/dev/dri/"
_ENVIRONMENT_PREFIX = b"GAS_"


@dataclass(frozen=True)
class Process:
    pid: int
    owner: PodContainer | None
    """Its pod and container, from its cgroup; None: in no pod."""
    clients: tuple[DrmClient, ...]
    """Its DRM clients, each once however many of its fds reach it; a client that prints no
    `drm-client-id` cannot be told from another, and counts once per fd."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """Its GAS_* variables, read only when the scan is asked to; {} otherwise or when they
    could not be read."""
    complete: bool = True
    """False: part of its GPU use could not be read (it exited while read, an fdinfo was
    unreadable or garbled, its cgroup unreadable)."""


@dataclass(frozen=True)
class ProcScan:
    processes: tuple[Process, ...]
    """The processes that hold at least one DRM fd, by pid."""
    readable: bool
    """False: the proc root itself could not be listed; nothing else was read."""
    notes: tuple[str, ...] = ()
    """What was partial or odd, each said once (counts, not a line per process)."""
    complete: bool = True
    """False: some GPU use could not be read (a process incomplete, or one whose fds could
    not even be listed)."""
    unlisted: int = 0
    """Processes whose fds could not be read at all: what they hold, and on which card, is
    not known, so no card's total is."""


@dataclass
class _Tally:
    """What went wrong during one scan, counted."""

    unlisted: dict[str, int] = field(default_factory=dict)
    vanished: int = 0
    no_stats: int = 0
    no_client_id: int = 0
    garbled: int = 0
    garbled_example: str = ""
    no_cgroup: int = 0
    no_environment: int = 0
    parsed: dict[str, DrmClient | None] = field(default_factory=dict)
    """fdinfo text -> its client: a dup'd fd, or one a forked worker inherited, prints the
    same text as the fd it shares a file with, and is parsed once."""

    def notes(self) -> tuple[str, ...]:
        found = [
            f"{count} process(es) whose open files could not be listed ({why}): their GPU use "
            "is not shown"
            + (
                " (reading them needs CAP_SYS_PTRACE and the host's /proc: docs/usage.md)"
                if why == "permission denied"
                else ""
            )
            for why, count in sorted(self.unlisted.items())
        ]
        if self.vanished:
            found.append(
                f"{self.vanished} process(es) exited or closed a GPU fd while read: their use "
                "is what could be read"
            )
        if self.no_stats:
            found.append(
                f"{self.no_stats} DRM fd(s) print no usage stats (no drm-driver in their "
                "fdinfo: a kernel before 5.19?): their use is not shown"
            )
        if self.no_client_id:
            found.append(
                f"{self.no_client_id} DRM fd(s) print no drm-client-id: each counted as a "
                "client of its own"
            )
        if self.garbled:
            found.append(
                f"{self.garbled} fdinfo value(s) could not be read and were left out "
                f"(first: {self.garbled_example})"
            )
        if self.no_cgroup:
            found.append(
                f"{self.no_cgroup} process(es) whose cgroup could not be read: counted outside "
                "any pod"
            )
        if self.no_environment:
            found.append(
                f"{self.no_environment} process(es) whose environment could not be read: "
                "their GAS_* shares are not known"
            )
        return tuple(found)


_CHUNK = 65536


def _read_bytes(path: str) -> bytes | None:
    # os.read rather than open(): a file object costs more than the read itself, and a
    # scan reads a file for every GPU fd. A read shorter than asked for is the end (a proc
    # file is made whole at the first read), which spares the read that would say so.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, _CHUNK)]
        while len(chunks[-1]) == _CHUNK:
            chunks.append(os.read(fd, _CHUNK))
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_text(path: str) -> str | None:
    data = _read_bytes(path)
    return None if data is None else data.decode("utf-8", "replace")


def _environment(path: str) -> dict[str, str] | None:
    data = _read_bytes(path)
    if data is None:
        return None
    found = {}
    for item in data.split(b"\0"):
        if item.startswith(_ENVIRONMENT_PREFIX):
            name, _, value = item.partition(b"=")
            found[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return found


def _unlisted(tally: _Tally, exc: OSError) -> None:
    why = "permission denied" if isinstance(exc, PermissionError) else exc.strerror or "?"
    tally.unlisted[why] = tally.unlisted.get(why, 0) + 1


def _drm_fds(fd_dir: str, tally: _Tally) -> list[int] | None:
    """The process's DRM fds, by number; None when its fds cannot be listed (a process gone
    before that is not counted: it held nothing)."""
    try:
        # Through a descriptor of the folder, the kernel walks its path once, not once
        # per fd: most of a scan's CPU is these readlinks.
        folder = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _unlisted(tally, exc)
        return None
    try:
        names = os.listdir(folder)
        found = []
        for name in names:
            try:
                target = os.readlink(name, dir_fd=folder)
            except (FileNotFoundError, ProcessLookupError):
                continue  # closed, or exited, since it was listed: it holds nothing now
            except OSError as exc:
                # The folder of a process of the reader's own user can be listed without
                # ptrace read access; each link then needs it, and is refused.
                _unlisted(tally, exc)
                return None
            if target.startswith(_DRM_PREFIX) and _DRM_LINK.match(target) and name.isdigit():
                found.append(int(name))
        return sorted(found)
    except OSError:
        return None  # gone while listed
    finally:
        os.close(folder)


def _clients(
    base: str, pid: int, fds: list[int], tally: _Tally
) -> tuple[list[DrmClient], bool, bool]:
    """The clients behind these fds; whether all were read; whether some fd went meanwhile."""
    clients: list[DrmClient] = []
    seen: set[tuple[str, str]] = set()
    vanished = False
    complete = True
    for fd in fds:
        text = _read_text(f"{base}/fdinfo/{fd}")
        if text is None:
            vanished = True
            complete = False
            continue
        if text in tally.parsed:
            client = tally.parsed[text]
        else:
            client = tally.parsed[text] = parse_fdinfo(text)
        if client is None:
            tally.no_stats += 1
            complete = False
            continue
        if client.problems:
            if not tally.garbled:
                tally.garbled_example = f"pid {pid} fd {fd}: {client.problems[0]}"
            tally.garbled += len(client.problems)
            complete = False
        if not client.client_id:
            tally.no_client_id += 1
        elif client.key in seen:
            continue  # a dup'd fd of a client already read
        else:
            seen.add(client.key)
        clients.append(client)
    if vanished:
        tally.vanished += 1
    return clients, complete, vanished


Skip = Callable[[PodContainer], bool]
"""`skip(owner)`: True for a container known to hold no GPU device (and not privileged):
the device cgroup keeps it from opening one, so its fds need not be read."""


def _process(
    root: str, name: str, environment: bool, skip: Skip | None, tally: _Tally
) -> Process | None:
    base = f"{root}/{name}"
    cgroup = None
    if skip is not None:
        # One read of its cgroup spares a readlink per fd of every container that cannot
        # hold a GPU, most of a busy node's processes.
        cgroup = _read_text(f"{base}/cgroup")
        owner = pod_container(cgroup) if cgroup is not None else None
        if owner is not None and skip(owner):
            return None
    fds = _drm_fds(f"{base}/fd", tally)
    if not fds:
        return None
    pid = int(name)
    clients, complete, vanished = _clients(base, pid, fds, tally)
    if cgroup is None:
        cgroup = _read_text(f"{base}/cgroup")
    if cgroup is None:
        complete = False
        if not vanished:  # a process that exited is said to have once
            tally.no_cgroup += 1
    variables: dict[str, str] = {}
    if environment:
        read = _environment(f"{base}/environ")
        if read is None:
            # The use itself was read: the process stays complete, its share is unknown.
            tally.no_environment += 1
        else:
            variables = read
    owner = pod_container(cgroup) if cgroup is not None else None
    return Process(pid, owner, tuple(clients), variables, complete)


def scan(
    proc_root: str | os.PathLike[str] = "/proc",
    *,
    environment: bool = False,
    skip: Skip | None = None,
) -> ProcScan:
    """Every process under `proc_root` that holds a DRM fd; with `environment`, with its
    GAS_* variables; the containers `skip` names left unread."""
    root = os.fspath(proc_root)
    try:
        names = os.listdir(root)
    except OSError as exc:
        return ProcScan((), False, (f"cannot list {root}: {exc.strerror or exc}",), False)
    tally = _Tally()
    processes = []
    for name in names:
        if name.isascii() and name.isdigit():
            process = _process(root, name, environment, skip, tally)
            if process is not None:
                processes.append(process)
    processes.sort(key=lambda process: process.pid)
    complete = not tally.unlisted and all(process.complete for process in processes)
    unlisted = sum(tally.unlisted.values())
    return ProcScan(tuple(processes), True, tally.notes(), complete, unlisted)
