"""Unit and property tests for gas.core.quantity: exact integer quantities."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gas.core.quantity import MAX_QUANTITY, QuantityError, format_quantity, parse_quantity

MODEST = settings(max_examples=200, deadline=None)


# ---------------------------------------------------------------- accepted values


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1", 1),
        ("16", 16),
        ("+3", 3),
        ("-0", 0),
        ("1.", 1),
        ("1.0", 1),
        (".0", 0),
        ("007", 7),
        # decimal SI suffixes
        ("1k", 1000),
        ("10M", 10_000_000),
        ("8G", 8_000_000_000),
        ("2T", 2 * 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1000m", 1),
        ("2000m", 2),
        ("1000000u", 1),
        ("3000000000n", 3),
        ("1.5k", 1500),
        ("0.5G", 500_000_000),
        # binary suffixes
        ("1Ki", 1024),
        ("8Gi", 8 * 2**30),
        ("8Gi", 8_589_934_592),
        ("1.5Gi", 1_610_612_736),
        ("0.5Ki", 512),
        ("3Mi", 3 * 2**20),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("7Ei", 7 * 2**60),
        # exponents
        ("1e3", 1000),
        ("1E3", 1000),
        ("5e+2", 500),
        ("1000e-3", 1),
        ("12.5e1", 125),
        ("0e999", 0),
        # the int64 boundary itself
        ("9223372036854775807", MAX_QUANTITY),
        # whitespace around the value is tolerated (the API server trims JSON values too)
        (" 4 ", 4),
    ],
)
def test_parse_valid(text: str, expected: int) -> None:
    assert parse_quantity(text) == expected


def test_max_quantity_is_int64_max() -> None:
    assert MAX_QUANTITY == 2**63 - 1


@pytest.mark.parametrize("value", [0, 1, 16, MAX_QUANTITY])
def test_parse_accepts_plain_non_negative_int(value: int) -> None:
    assert parse_quantity(value) == value


# ---------------------------------------------------------------- rejected values


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0.5", "not a whole number"),
        ("1.5", "not a whole number"),
        (".5", "not a whole number"),
        ("500m", "not a whole number"),
        ("1m", "not a whole number"),
        ("1n", "not a whole number"),
        ("1e-3", "not a whole number"),
        ("1e-999", "not a whole number"),
        ("0.1Ki", "not a whole number"),
        ("-1", "negative"),
        ("-1Gi", "negative"),
        ("-5e2", "negative"),
        ("9223372036854775808", "too large"),
        ("8Ei", "too large"),
        ("10E", "too large"),
        ("1e19", "too large"),
        ("1e400", "too large"),
        ("1e+999", "too large"),
        ("1e1000", "out of range"),
        ("1e99999999999", "out of range"),
    ],
)
def test_parse_rejects_with_reason(text: str, words: str) -> None:
    with pytest.raises(QuantityError, match=words):
        parse_quantity(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        ".",
        "+",
        "-",
        "abc",
        "NaN",
        "nan",
        "inf",
        "Infinity",
        "1e",
        "e3",
        "1K",  # kilo is lower-case k
        "1ki",
        "1Gb",
        "1 Gi",
        "1..0",
        "1.0.0",
        "0x10",
        "1_000",
        "1,000",
        "--1",
        "+-1",
        "1e--1",
        "1e1.5",
        "1Gi5",
        "١٢",  # non-ASCII digits
        "1\x00",
    ],
)
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_parse_rejects_overly_long_string() -> None:
    with pytest.raises(QuantityError, match="too long"):
        parse_quantity("1" + "0" * 100)
    with pytest.raises(QuantityError, match="too long"):
        parse_quantity("0" * 65)


def test_parse_accepts_64_characters() -> None:
    assert parse_quantity("0" * 63 + "5") == 5


@pytest.mark.parametrize("value", [1.0, 0.5, float("nan"), float("inf"), True, False, None])
def test_parse_rejects_non_string_scalars(value: object) -> None:
    with pytest.raises(QuantityError, match="must be a string"):
        parse_quantity(value)


@pytest.mark.parametrize("value", [["1"], {"value": "1"}, b"1", (1,)])
def test_parse_rejects_containers_and_bytes(value: object) -> None:
    with pytest.raises(QuantityError, match="must be a string"):
        parse_quantity(value)


@pytest.mark.parametrize(("value", "words"), [(-1, "negative"), (2**63, "too large")])
def test_parse_rejects_out_of_range_int(value: int, words: str) -> None:
    with pytest.raises(QuantityError, match=words):
        parse_quantity(value)


def test_quantity_error_is_value_error() -> None:
    assert issubclass(QuantityError, ValueError)


# ---------------------------------------------------------------- format


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (1, "1"),
        (1000, "1000"),
        (1023, "1023"),
        (1024, "1Ki"),
        (1536, "1536"),
        (2048, "2Ki"),
        (8 * 2**30, "8Gi"),
        (3 * 2**20, "3Mi"),
        (2**40, "1Ti"),
        (2**50, "1Pi"),
        (7 * 2**60, "7Ei"),
        (2**61 + 2**10, f"{2**51 + 1}Ki"),
        (8_000_000_000, "7812500Ki"),
        (MAX_QUANTITY, str(MAX_QUANTITY)),
    ],
)
def test_format(value: int, text: str) -> None:
    assert format_quantity(value) == text


# ---------------------------------------------------------------- properties


@MODEST
@given(st.text(max_size=80))
def test_parse_arbitrary_text_only_raises_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert isinstance(value, int)
    assert not isinstance(value, bool)
    assert 0 <= value <= MAX_QUANTITY


QUANTITY_LIKE = st.builds(
    lambda sign, whole, dot, frac, suffix: f"{sign}{whole}{dot}{frac}{suffix}",
    st.sampled_from(["", "+", "-"]),
    st.text(alphabet="0123456789", max_size=22),
    st.sampled_from(["", "."]),
    st.text(alphabet="0123456789", max_size=12),
    st.one_of(
        st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E"]),
        st.sampled_from(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
        st.builds(
            lambda e, sign, digits: f"{e}{sign}{digits}",
            st.sampled_from(["e", "E"]),
            st.sampled_from(["", "+", "-"]),
            st.text(alphabet="0123456789", min_size=1, max_size=5),
        ),
    ),
)


@MODEST
@given(QUANTITY_LIKE)
def test_parse_quantity_like_text_only_raises_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert 0 <= value <= MAX_QUANTITY


@MODEST
@given(st.integers(min_value=0, max_value=MAX_QUANTITY))
def test_format_then_parse_round_trips(value: int) -> None:
    assert parse_quantity(format_quantity(value)) == value
    assert parse_quantity(str(value)) == value


@MODEST
@given(st.integers(min_value=0, max_value=2**32), st.sampled_from(["Ki", "Mi", "Gi"]))
def test_binary_suffix_is_exact(number: int, suffix: str) -> None:
    unit = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[suffix]
    assert parse_quantity(f"{number}{suffix}") == number * unit


@MODEST
@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=999))
def test_milli_units_are_whole_only_when_divisible(whole: int, remainder: int) -> None:
    assert parse_quantity(f"{whole * 1000}m") == whole
    with pytest.raises(QuantityError, match="not a whole number"):
        parse_quantity(f"{whole * 1000 + remainder}m")
