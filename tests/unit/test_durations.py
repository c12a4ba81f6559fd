"""Go duration strings (gas.core.durations), as check-config and the serve flags read them."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gas.cli import _duration
from gas.core.durations import format_seconds, parse_go_duration

SECOND = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("10s", 10 * SECOND),
        ("1m30s", 90 * SECOND),
        ("1.5s", 1_500_000_000),
        (".5s", 500_000_000),
        ("2.s", 2 * SECOND),
        ("500ms", 500_000_000),
        ("2h", 7200 * SECOND),
        ("1h2m3s4ms5us6ns", 3723 * SECOND + 4_005_006),
        # Go's three spellings of microseconds: ASCII, MICRO SIGN, GREEK SMALL LETTER MU.
        ("7us", 7_000),
        ("7\u00b5s", 7_000),
        ("7\u03bcs", 7_000),
        ("0", 0),
        ("-0", 0),
        ("-5s", -5 * SECOND),
        ("+5s", 5 * SECOND),
        (" 10s\n", 10 * SECOND),
    ],
)
def test_go_durations_are_read(text: str, nanoseconds: int) -> None:
    assert parse_go_duration(text) == nanoseconds


@pytest.mark.parametrize(
    "text",
    ["", " ", "-", "15", "1.5", "s", "10 s", "1s 2s", "10S", "1d", "1x", "--5s", "1e3s", "٣s"],
)
def test_what_go_refuses_is_not_a_duration(text: str) -> None:
    assert parse_go_duration(text) is None


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from("hms")), min_size=1))
@settings(max_examples=200, deadline=None)
def test_parts_add_up(parts: list[tuple[int, str]]) -> None:
    unit = {"h": 3600 * SECOND, "m": 60 * SECOND, "s": SECOND}
    text = "".join(f"{number}{name}" for number, name in parts)
    assert parse_go_duration(text) == sum(number * unit[name] for number, name in parts)


def test_format_seconds() -> None:
    assert format_seconds(10 * SECOND) == "10s"
    assert format_seconds(300_000_000) == "0.3s"
    assert format_seconds(0) == "0s"


def test_the_serve_flags_take_positive_durations_in_seconds() -> None:
    assert _duration("1m30s") == 90.0
    assert _duration("1500ms") == 1.5
    assert _duration("250\u00b5s") == 0.00025
    for bad in ("15", "fast", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
            _duration(bad)
    for not_positive in ("0", "0s", "-5s"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a positive duration"):
            _duration(not_positive)
