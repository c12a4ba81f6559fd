"""Kubernetes resource quantities as exact integers.

GPU resources are counted in whole units (cards, bytes, millicores), so a quantity is
accepted only when it denotes a non-negative whole number that fits in a signed 64-bit
integer, the range the API server itself accepts for extended resources. Anything else is
an error with a message that names the problem: reading a bad value as 0 (as GAS does)
would let a pod ask for "1.5" memory and get none accounted.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_QUANTITY = 2**63 - 1

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(
    r"^(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<bin>[KMGTPE]i)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)
# A longer exponent could only describe a value far outside the int64 range, and computing
# 10**exp for it would cost unbounded time and memory.
_MAX_EXPONENT_DIGITS = 3


class QuantityError(ValueError):
    """A quantity that is malformed, fractional, negative or too large."""


def parse_quantity(value: object) -> int:
    """Return the exact integer a quantity denotes, or raise QuantityError."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string, not {value!r}")
    if isinstance(value, int):
        return _check_range(Fraction(value), str(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantity must be a string, not {type(value).__name__}")
    text = value.strip()
    if len(text) > 64:
        raise QuantityError(f"quantity {text[:20]!r}... is too long")
    match = _PATTERN.match(text)
    if match is None or (not match.group("int") and not match.group("frac")):
        raise QuantityError(f"quantity {text!r} is not a valid Kubernetes quantity")
    digits = match.group("int") or "0"
    fraction_digits = match.group("frac") or ""
    number = Fraction(int(digits + fraction_digits), 10 ** len(fraction_digits))
    if match.group("sign") == "-":
        number = -number
    if match.group("bin"):
        number *= _BINARY[match.group("bin")]
    elif match.group("exp") is not None:
        exponent = match.group("exp")
        if len(exponent.lstrip("+-")) > _MAX_EXPONENT_DIGITS:
            raise QuantityError(f"quantity {text!r} is out of range")
        number *= Fraction(10) ** int(exponent)
    else:
        number *= _DECIMAL[match.group("dec") or ""]
    return _check_range(number, text)


def _check_range(number: Fraction, text: str) -> int:
    if number < 0:
        raise QuantityError(f"quantity {text!r} is negative")
    if number.denominator != 1:
        raise QuantityError(f"quantity {text!r} is not a whole number")
    if number > MAX_QUANTITY:
        raise QuantityError(f"quantity {text!r} is too large")
    return int(number)


def format_quantity(value: int) -> str:
    """Render an integer compactly with a binary suffix when it divides evenly."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
