"""gas serve's log lines: the same text as logging's own Formatter writes, made cheaper."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator

import pytest

from gas.serving import logformat


def record(created: float, message: str = "a line") -> logging.LogRecord:
    made = logging.LogRecord("gas.decisions", logging.INFO, "x.py", 1, message, None, None)
    made.created, made.msecs = created, (created % 1) * 1000
    return made


def test_the_lines_are_those_of_the_standard_formatter() -> None:
    standard = logging.Formatter(logformat.LINE_FORMAT, logformat.DATE_FORMAT)
    seconds = logformat.SecondFormatter()
    # Within a second, across one, back to an earlier one, and far away.
    times = [1_764_216_000.1, 1_764_216_000.9, 1_764_216_001.0, 1_764_216_000.5, 86_400.0]
    for created in times:
        for message in ("first", "second"):
            assert seconds.format(record(created, message)) == standard.format(
                record(created, message)
            )
    # Another date format than the one it was made with is formatted as logging does.
    other = record(1_764_216_000.25)
    assert seconds.formatTime(other, "%H:%M") == standard.formatTime(other, "%H:%M")
    assert seconds.formatTime(other) == standard.formatTime(other)


def test_threads_formatting_at_once_each_get_their_seconds_text() -> None:
    standard = logging.Formatter(logformat.LINE_FORMAT, logformat.DATE_FORMAT)
    seconds = logformat.SecondFormatter()
    wrong: list[str] = []

    def write(base: float) -> None:
        for step in range(2_000):
            made = record(base + step % 7)
            if seconds.format(made) != standard.format(made):
                wrong.append(seconds.format(made))

    threads = [threading.Thread(target=write, args=(1_764_216_000 + i * 3,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


@pytest.fixture
def pristine_logging() -> Iterator[None]:
    """A root logger without handlers, and logging's switches and root put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    switches = logging._srcfile, logging.logThreads, logging.logMultiprocessing
    root.handlers = []
    try:
        yield
    finally:
        root.handlers, root.level = handlers, level
        logging._srcfile, logging.logThreads, logging.logMultiprocessing = switches


def test_configure_writes_the_format_to_stderr_with_lean_records(
    pristine_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    logformat.configure("info")
    captured: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, made: logging.LogRecord) -> None:
            captured.append(made)

    logging.getLogger().addHandler(Keep())
    logging.getLogger("gas.decisions").info('{"verb":"filter"}')
    logging.getLogger("gas.decisions").debug("below the level")
    (line,) = err.getvalue().splitlines()
    assert line.endswith('] [INFO] gas.decisions: {"verb":"filter"}')
    assert f"] [{captured[0].process}] [INFO]" in line
    # No caller, thread or multiprocessing name looked up: the line shows none of them.
    assert captured[0].funcName == "(unknown function)" and captured[0].lineno == 0
    assert captured[0].threadName is None and captured[0].processName is None


def test_ensure_leaves_logging_someone_set_up_and_sets_it_up_otherwise(
    pristine_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger().handlers = []  # pytest's own capture handlers, during the call
    theirs = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(theirs)
    logformat.ensure("info")
    assert logging.getLogger().handlers == [theirs]
    assert logging._srcfile is not None  # records left as the caller has them
    logging.getLogger().removeHandler(theirs)
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    logformat.ensure("info")
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler.formatter, logformat.SecondFormatter)
    assert logging._srcfile is None
