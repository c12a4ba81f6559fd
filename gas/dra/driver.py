"""The names `gas dra` is known by: its DRA driver name, the CDI kind of its devices, the
capacity keys it publishes and the files and sockets it keeps."""

from __future__ import annotations

import base64
import hashlib
import os

from gas.core import dra_claims

DRIVER = dra_claims.DRIVER
"""gas's own DRA driver name: a DNS subdomain distinct from Intel's driver
(`gpu.intel.com`), so a DeviceClass selecting one driver never matches the other's devices,
under the intel.com domain of the `gpu.intel.com/*` resources gas already serves."""

CDI_KIND = f"{DRIVER}/gpu"
CDI_VERSION = "0.6.0"
"""The CDI spec version declared: device nodes and environment are known from 0.3.0 on,
and containerd 2.x's CDI library reads every version up to 1.1.0."""

STANDARD = "resource.kubernetes.io"
"""The domain of the attribute names every driver shares (pciBusID, pcieRoot, numaNode)."""

MEMORY = dra_claims.CAPACITY_MEMORY
MILLICORES = dra_claims.CAPACITY_MILLICORES
TILES = dra_claims.CAPACITY_TILES

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
"""What registration offers the kubelet: the v1 DRA service, which kubelets 1.34 and later
speak (gas's slices need consumable capacity, 1.34 at the earliest), then the device health
service in both its versions. A kubelet takes the first DRA service it knows and ignores
the names it does not know; one that reads health only from plugins that offer it finds
it here, and 1.37 asks for `v1` of it whatever the list says."""

DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_STATE_DIR = "/var/lib/gas-dra"


UNIX_PATH_MAX = 107
"""The longest path a unix socket can be bound at (sun_path less its terminating NUL)."""


def _digest(text: str, size: int) -> str:
    raw = hashlib.sha256(text.encode()).digest()[:size]
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def registration_socket(kubelet_root: str, pod_uid: str = "") -> str:
    """Where the kubelet's plugin watcher finds the driver. With the pod's UID (the
    DaemonSet passes it), each pod has a socket of its own, so that during a rolling update
    the new pod registers beside the old one instead of taking its socket. A path too long
    for a unix socket names the UID by a digest of it, then the driver too."""
    folder = f"{kubelet_root.rstrip('/')}/plugins_registry"
    if not pod_uid:
        return f"{folder}/{DRIVER}-reg.sock"
    candidates = (
        f"{DRIVER}-{pod_uid}-reg.sock",
        f"{DRIVER}-{_digest(pod_uid, 8)}-reg.sock",
        f"dra-{_digest(DRIVER + chr(0) + pod_uid, 16)}-reg.sock",
    )
    for name in candidates:
        if len(os.path.join(folder, name)) <= UNIX_PATH_MAX:
            return os.path.join(folder, name)
    return os.path.join(folder, candidates[-1])


def dra_socket(kubelet_root: str, pod_uid: str = "") -> str:
    """Where the driver's DRAPlugin service listens (named to the kubelet by GetInfo):
    `dra.sock`, or `dra-<pod UID>.sock` with the pod's UID."""
    name = f"dra-{pod_uid}.sock" if pod_uid else "dra.sock"
    return f"{kubelet_root.rstrip('/')}/plugins/{DRIVER}/{name}"
