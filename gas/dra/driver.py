"""The names `gas dra` is known by: its DRA driver name, the CDI kind of its devices, the
capacity keys it publishes and the files and sockets it keeps."""

from __future__ import annotations

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
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
"""What registration offers the kubelet: only the v1 service, which kubelets 1.34 and
later speak (gas's slices need consumable capacity, 1.34 at the earliest)."""

DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_STATE_DIR = "/var/lib/gas-dra"


def registration_socket(kubelet_root: str) -> str:
    """Where the kubelet's plugin watcher finds the driver."""
    return f"{kubelet_root.rstrip('/')}/plugins_registry/{DRIVER}-reg.sock"


def dra_socket(kubelet_root: str) -> str:
    """Where the driver's DRAPlugin service listens (named to the kubelet by GetInfo)."""
    return f"{kubelet_root.rstrip('/')}/plugins/{DRIVER}/dra.sock"
