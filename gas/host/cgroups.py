"""Which pod and container a process belongs to, read from `/proc/<pid>/cgroup`: no I/O.

The kubelet puts every container in a cgroup under its pod's, under its QoS class's, under
`kubepods` (or under a root `--cgroup-root` names), and the runtime names the container's
own. The layouts, each for cgroup v1 (`N:controllers:path`, one line per hierarchy) and v2
(`0::path`):

- the cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`, `/kubepods/besteffort/pod<uid>/
  <id>`, `/kubepods/pod<uid>/<id>` (Guaranteed);
- the systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid,
  dashes as underscores>.slice/<runtime>-<id>.scope`, Guaranteed pods directly under
  `kubepods.slice` (`kubepods-pod<uid>.slice`);
- the runtime's scope: containerd `cri-containerd-<id>.scope`, CRI-O `crio-<id>.scope` (and
  `crio-conmon-<id>.scope` for its monitor, which is no container), Docker
  `docker-<id>.scope`; under cgroupfs the bare id.

Under a `--cgroup-root` the same layouts sit lower (`/gas-realnode-x/kubepods/...`; with the
systemd driver every slice name carries the root: kind's `/kubelet.slice/kubelet-kubepods.
slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod<uid>.slice/...`). A
static pod's UID is the kubelet's 32-hex hash of its manifest. Read from inside a cgroup
namespace, the paths of other containers climb out of it (`0::/../../burstable/pod<uid>/
<id>`), and the cgroups above are not shown.

A process of no pod (the host's, a system daemon's, a static process outside kubepods) is
None; so is a pod's sandbox-level process that is in no container's cgroup.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# A static pod's UID is the kubelet's hash of its manifest: 32 hex digits, no dashes.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# Under the systemd driver every slice is named after all its ancestors, so a `--cgroup-root`
# other than `/` prefixes them (kind's `/kubelet`: `kubelet-kubepods-burstable-pod<uid>.slice`).
_POD = re.compile(
    rf"^(?:(?:[^-]+-)*kubepods(?:-(?:burstable|besteffort|guaranteed))?-)?pod({_UID})(?:\.slice)?$"
)
_KUBEPODS = re.compile(r"(?:^|-)kubepods(?:$|[-.])")
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class PodContainer:
    pod_uid: str
    """The pod's UID as the API server writes it (with dashes)."""
    container_id: str
    """The runtime's 64-hex container id (`containerStatuses[].containerID` after its
    `containerd://` or `cri-o://`)."""


def _path_owner(path: str) -> PodContainer | None:
    parts = [p for p in path.split("/") if p]
    for index, part in enumerate(parts):
        pod = _POD.match(part)
        if pod is None or index + 1 >= len(parts):
            continue
        # A path that climbs out of the reader's cgroup namespace (`/../..`, read from inside
        # a container) no longer shows the cgroups above it, `kubepods` among them.
        outside = parts[0] == ".."
        if not outside and not any(_KUBEPODS.search(p) for p in parts[: index + 1]):
            continue
        container = _CONTAINER.match(parts[index + 1])
        if container is None:
            return None
        return PodContainer(pod.group(1).replace("_", "-"), container.group(1))
    return None


@functools.lru_cache(maxsize=8192)
def pod_container(cgroup: str) -> PodContainer | None:
    """The pod and container of a process whose `/proc/<pid>/cgroup` reads `cgroup`; the
    first line that names one (every hierarchy of a container names the same). Remembered:
    a container's processes all read the same text, scan after scan."""
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        owner = _path_owner(parts[2].strip())
        if owner is not None:
            return owner
    return None
