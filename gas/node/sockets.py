"""The kubelet's unix sockets `gas node` uses.

No gRPC here: `gas node`'s flags name these paths, and the command line is built without
the `node` extra installed.
"""

from __future__ import annotations

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def socket_name(resource: str) -> str:
    """`gpu.intel.com/i915` -> `gas-i915.sock`."""
    return f"gas-{resource.rsplit('/', 1)[-1]}.sock"
