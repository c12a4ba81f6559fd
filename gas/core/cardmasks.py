"""Sets of a node's cards as 64-bit masks, bit i for the card in slot i, many nodes at once
(numpy arrays of masks): counting and taking the first cards of a set are then a few
operations on one number per node."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]
MaskArray = npt.NDArray[np.uint64]

_SPREAD_BYTES = np.uint64(0x0102040810204080)
"""Times a word of eight 0/1 bytes, its top byte holds byte i as bit i."""


def pack(cards: BoolArray) -> MaskArray:
    """Each row of `cards` (along its last axis, a whole number of 8 columns, at most 64)
    as a mask, bit i set when column i is: eight columns at a time, each eight-byte word
    of 0s and 1s folded into one byte by a multiplication."""
    words = np.ascontiguousarray(cards).view("<u8")
    mask = (words[..., 0] * _SPREAD_BYTES) >> np.uint64(56)
    for word in range(1, words.shape[-1]):
        mask |= ((words[..., word] * _SPREAD_BYTES) >> np.uint64(56)) << np.uint64(8 * word)
    return mask


def lowest(fit: MaskArray, count: int) -> MaskArray:
    """The lowest `count` bits set in each mask of `fit` (all of them, when fewer)."""
    one = np.uint64(1)
    chosen = fit & (~fit + one)
    if count > 1:
        rest = fit ^ chosen
        for _ in range(count - 1):
            first = rest & (~rest + one)
            chosen |= first
            rest ^= first
    return chosen


def picked(cards: tuple[str, ...], mask: int) -> tuple[str, ...]:
    """The cards of `cards` whose bit is set in `mask`."""
    return tuple(card for slot, card in enumerate(cards) if mask >> slot & 1)
