"""Running a benchmark module end to end at its smoke size, as the benchmark tests do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_quick(module: str, figures: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """Run `python -m <module> --quick --json <figures> <args>` from the repository root, without
    KUBECONFIG (gas reads it, and must talk to the benchmark's API-server double, not to a
    cluster of the environment). Returns what it printed and the figures it wrote; fails
    the test when the run fails."""
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--json", str(figures), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record: dict[str, Any] = json.loads(figures.read_text())
    return done.stdout, record
