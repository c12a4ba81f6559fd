"""The README's node demo (`./scripts/run-node-demo.sh`) runs and every container gets the
cards gas chose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_node_demo_gives_every_container_the_cards_gas_chose() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.node_demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.endswith((" yes", " NO"))]
    containers = [line for line in rows if "/" in line.split()[0]]
    assert len(containers) == 6 and all(line.endswith(" yes") for line in containers), rows
    # The pod no card can hold says why, node by node: gas's filter where the node's total
    # would have let it through (two 8Gi cards, 16Gi), kube-scheduler's own where not.
    lines = done.stdout.splitlines()
    at = lines.index("scheduled too-big: unschedulable (waits)")
    why = {}
    for line in lines[at + 1 :]:
        if not line.startswith("  "):
            break
        node, reason = line.strip().split(": ", 1)
        why[node] = reason
    assert why == {
        "gpu-node-1": "gpu: container needs more gpu.intel.com/memory.max per card than a card "
        "has (gas's filter: no card of the node could hold it, even idle)",
        "gpu-node-2": "Insufficient gpu.intel.com/memory.max (kube-scheduler: the node's total)",
    }, lines[at : at + 4]
    # The two-tile card's container gets both tiles in its mask.
    (tiled,) = [line for line in containers if line.startswith("tiled/solver")]
    assert tiled.split()[1:5] == ["gpu-node-2", "card0", "card0", "0,1"]
    assert "HANDED-OUT" in done.stdout
