"""One GPU card of this node, as discovery finds it and the node agent uses it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    """A DRM card: `card<number>` and the facts the node agent needs about it.

    `render_node` is the `renderD<M>` entry found under the card's device (never computed
    from the card number); `driver` is `i915` or `xe` (it decides the resource name);
    `memory` is the usable local memory in bytes over all tiles.
    """

    name: str
    number: int
    vendor: str
    numa_node: int | None
    pci_address: str = ""
    render_node: str | None = None
    driver: str = ""
    tiles: int = 1
    memory: int = 0
