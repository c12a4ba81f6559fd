"""A CPU-clock profile of a `gas serve` worker over each burst of `benchmarks.endtoend
--cpu-profile DIR`: this directory goes first on the PYTHONPATH of the gas it starts, so
Python imports this module at start-up, and in the worker (after gunicorn's fork) a thread
waits for the benchmark's word in DIR:

- `DIR/.start` holds a round's name: the profile of every thread begins (yappi, CPU
  clock, builtins included);
- `DIR/.stop`: it ends, and is written to `DIR/<round>.pstat` (`python -m pstats FILE`),
  `DIR/<round>.txt` (the functions by own and by total CPU) and `DIR/<round>.threads.txt`
  (CPU by thread); then `DIR/<round>.done`.

Unlike py-spy's samples (`--profile`), which count a thread waiting to run again after a
system call as busy in the frame it waits in, this counts the CPU each thread used, in
the functions it used it in. yappi's own hooks cost about twice what they measure, and
Python's calls more than C's: read its shares as an ordering, the worker's CPU
per pod from the rounds without it. Outside `gas serve` under --cpu-profile it does nothing.
"""

from __future__ import annotations

import io
import os
import pstats
import sys
import threading
import time
from pathlib import Path

_DIRECTORY = os.environ.get("GAS_BENCH_CPU_PROFILE")
_POLL_S = 0.05


def _wait_for(path: Path) -> str:
    while not path.exists():
        time.sleep(_POLL_S)
    text = path.read_text().strip()
    path.unlink()
    return text


def _profile_rounds(directory: Path) -> None:
    import yappi  # type: ignore[import-untyped]

    yappi.set_clock_type("cpu")
    while True:
        name = _wait_for(directory / ".start")
        yappi.clear_stats()
        yappi.start(builtins=True, profile_threads=True)
        _wait_for(directory / ".stop")
        yappi.stop()
        stats = yappi.get_func_stats()
        stats.save(str(directory / f"{name}.pstat"), type="pstat")
        with open(directory / f"{name}.threads.txt", "w") as out:
            yappi.get_thread_stats().print_all(out=out)
        text = io.StringIO()
        read = pstats.Stats(str(directory / f"{name}.pstat"), stream=text)
        read.sort_stats("tottime").print_stats(40)
        read.sort_stats("cumulative").print_stats(80)
        (directory / f"{name}.txt").write_text(text.getvalue())
        (directory / f"{name}.done").touch()


def _in_worker() -> None:
    assert _DIRECTORY is not None
    thread = threading.Thread(
        target=_profile_rounds, args=(Path(_DIRECTORY),), name="bench-cpu-profile", daemon=True
    )
    thread.start()


if _DIRECTORY and "serve" in sys.argv:
    os.register_at_fork(after_in_child=_in_worker)
