"""The log lines `gas serve` writes when nothing else set up logging, and their cost.

A decision line is written for every filter and bind (`gas.decisions`), so what logging
does per record counts: in `benchmarks.verbs` the three lines of a pod cost about 8% of
its verbs' CPU. The line holds no thread, caller or multiprocessing name, so the records
are made without looking them up (the switches the logging HOWTO lists under
"Optimization"), and the time is formatted once a second rather than once a line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

LINE_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"


class SecondFormatter(logging.Formatter):
    """`logging.Formatter` for a date format of whole seconds (time.strftime has none
    finer): each second's text is made once, and kept as one tuple, so that a thread never
    pairs one second with another's text."""

    def __init__(self, fmt: str = LINE_FORMAT, datefmt: str = DATE_FORMAT) -> None:
        super().__init__(fmt, datefmt)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if not datefmt or datefmt != self.datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        kept = self._second
        if kept[0] != second:
            kept = self._second = (second, time.strftime(datefmt, self.converter(second)))
        return kept[1]


def lean_records() -> Callable[[], None]:
    """Records made without the caller's file, line and function, the thread's name and
    the multiprocessing process name, none of which `LINE_FORMAT` shows. Global to the
    process: only for a process whose logging gas set up. Returns what puts them back."""
    was = logging._srcfile, logging.logThreads, logging.logMultiprocessing

    def restore() -> None:
        logging._srcfile, logging.logThreads, logging.logMultiprocessing = was

    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    return restore


def configure(level: str) -> None:
    """The root logger at `level`, writing `LINE_FORMAT` to stderr, with lean records."""
    handler = logging.StreamHandler()
    handler.setFormatter(SecondFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())
    lean_records()


def ensure(level: str) -> None:
    """`configure(level)` unless the process's logging is already set up (a handler on the
    root logger): a caller that set it up keeps it, as `logging.basicConfig` would."""
    if not logging.getLogger().handlers:
        configure(level)
