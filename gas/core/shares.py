"""What a container holds of each card, in both ways, and what it is told of it.

A container that shares a card is given, beside the card's device nodes, one set of
environment variables per card it holds a share of: the memory, the millicores and the
tiles that are its own on that card. A workload reads them to size its pools (a framework
that would otherwise take the whole card's memory), and gas's usage reading compares a
container's real use with the same numbers. The names carry the card as the host names it
(`card1`), which is also the device node's name in the container (`/dev/dri/card1`).

    GAS_CARD1_MEMORY_BYTES=4294967296
    GAS_CARD1_MILLICORES=250
    GAS_CARD1_TILES=1

A container holding two shares of one card (two claims, or two requests of one claim) is
told their sum. `TILES` is there only for a share that holds tiles of its own; a share of
the whole card holds none.

In the extender way a container's share is read from its pod instead (`extender_shares`):
the cards of its segment of `gas-container-cards`, and its `gpu.intel.com/*` requests
divided among them as the allocator divides them (`ContainerNeed.per_card`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gas.core.model import (
    ANNOTATION_CARDS,
    TILES,
    as_mapping,
    is_card_name,
    parse_cards,
    pod_request,
)

MEMORY_RESOURCE = "gpu.intel.com/memory.max"
MILLICORES_RESOURCE = "gpu.intel.com/millicores"

PREFIX = "GAS_"
_VARIABLE = re.compile(r"^GAS_CARD(0|[1-9][0-9]{0,5})_(MEMORY_BYTES|MILLICORES|TILES)$")


@dataclass(frozen=True)
class Share:
    """What one container holds of one card."""

    memory: int = 0
    millicores: int = 0
    tiles: int = 0

    def __add__(self, other: Share) -> Share:
        return Share(
            self.memory + other.memory,
            self.millicores + other.millicores,
            self.tiles + other.tiles,
        )


def _stem(card: str) -> str:
    if not is_card_name(card):
        raise ValueError(f"{card!r} is not a card name")
    return f"{PREFIX}{card.upper()}"


def memory_variable(card: str) -> str:
    return f"{_stem(card)}_MEMORY_BYTES"


def millicores_variable(card: str) -> str:
    return f"{_stem(card)}_MILLICORES"


def tiles_variable(card: str) -> str:
    return f"{_stem(card)}_TILES"


def share_environment(card: str, share: Share) -> dict[str, str]:
    """The variables of one card's share, by name."""
    found = {
        memory_variable(card): str(share.memory),
        millicores_variable(card): str(share.millicores),
    }
    if share.tiles:
        found[tiles_variable(card)] = str(share.tiles)
    return found


def read_shares(environment: Mapping[str, str]) -> dict[str, Share]:
    """Card -> share, from a container's environment (variables of other names ignored;
    a value that is not a whole number is left out)."""
    amounts: dict[str, dict[str, int]] = {}
    for name, value in environment.items():
        match = _VARIABLE.match(name)
        if match is None:
            continue
        try:
            amount = int(value)
        except ValueError:
            continue
        amounts.setdefault(f"card{match.group(1)}", {})[match.group(2)] = amount
    return {
        card: Share(parts.get("MEMORY_BYTES", 0), parts.get("MILLICORES", 0), parts.get("TILES", 0))
        for card, parts in amounts.items()
    }


def extender_shares(pod: Mapping[str, Any]) -> dict[str, dict[str, Share]]:
    """Container name -> card -> its share, for a pod gas bound (its `gas-container-cards`
    annotation); empty for a pod gas did not place. SpecError when the pod or its
    annotation cannot be read."""
    annotations = as_mapping(as_mapping(pod.get("metadata")).get("annotations"))
    value = annotations.get(ANNOTATION_CARDS)
    if not isinstance(value, str):
        return {}
    request = pod_request(pod)
    allocation = parse_cards(value, len(request.containers))
    found: dict[str, dict[str, Share]] = {}
    for need, cards in zip(request.containers, allocation, strict=True):
        if not cards:
            continue
        per_card = need.per_card(len(cards))
        share = Share(
            per_card.get(MEMORY_RESOURCE, 0),
            per_card.get(MILLICORES_RESOURCE, 0),
            per_card.get(TILES, 0),
        )
        found[need.name] = dict.fromkeys(cards, share)
    return found
