"""Running a process with the rights a manifest gives gas's agents: `setpriv` as root,
every capability dropped but the ones the agent's container adds."""

from __future__ import annotations

import yaml

from tests.support.realk8s import ROOT


def deployed_capabilities(manifest: str) -> list[str]:
    """The `setpriv ... --` prefix for root holding only the capabilities `manifest`'s
    DaemonSet container adds (every other dropped, as the manifest drops ALL)."""
    for document in yaml.safe_load_all((ROOT / manifest).read_text()):
        if document and document["kind"] == "DaemonSet":
            (container,) = document["spec"]["template"]["spec"]["containers"]
            capabilities = container["securityContext"]["capabilities"]
            assert capabilities["drop"] == ["ALL"], manifest
            kept = ",".join(f"+{name.lower()}" for name in capabilities["add"])
            return ["setpriv", "--bounding-set", f"-all,{kept}", "--inh-caps", "-all", "--"]
    raise AssertionError(f"no DaemonSet in {manifest}")
