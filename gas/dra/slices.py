"""This node's ResourceSlice, computed from its cards: no I/O.

One pool per node, named after the node, in one slice; one device per card, named after
the card (`card0`), shareable (`allowMultipleAllocations`) with three consumable
capacities. kube-scheduler keeps the books of each card from these numbers; the request
policies decide what a claim consumes when it names no amount, and round what it names so
that what is left of a card stays usable (docs/dra.md, "Request policies").

A card kept whole (`exclusive-cards`) is published without `allowMultipleAllocations` and
without request policies (the API allows them only on shareable devices): one claim takes
it all. A card that is not fit to be used carries a taint (`UNHEALTHY_TAINT`, its value the
reason) that keeps new claims off it, and with the NoExecute effect evicts the pods on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The request policies, shared with the webhook that rounds pods' asks to them.
from gas.core.dra_claims import MEMORY_STEP as MEMORY_STEP  # also read from here
from gas.core.dra_claims import (
    MILLICORES_PER_CARD,
    MILLICORES_STEP,
    UNHEALTHY_TAINT,
    exclusive_cards,
)
from gas.core.model import SpecError, xe_link_groups
from gas.core.quantity import QuantityError, format_quantity, parse_quantity
from gas.dra.driver import DRIVER, MEMORY, MILLICORES, STANDARD, TILES
from gas.host.cards import Card

TAINT_EFFECTS = ("NoExecute", "NoSchedule")

SHARES_BY_DEFAULT = 10
"""A claim that names no memory or millicores takes a tenth of the card: ten such claims
fill it, as ten `gpu.intel.com/i915` shares of a card do under `gas node` by default."""

KNOWN_MODELS: Mapping[str, str] = {
    "0x56c0": "Data Center GPU Flex 170",
    "0x56c1": "Data Center GPU Flex 140",
    "0x0bd5": "Data Center GPU Max 1550",
    "0x0bda": "Data Center GPU Max 1100",
    "0x56a0": "Arc A770",
    "0x56a1": "Arc A750",
    "0xe20b": "Arc B580",
    "0xe20c": "Arc B570",
}


@dataclass(frozen=True)
class PciFacts:
    """What the slice says of a card beyond what discovery reads: its PCI device id
    (`0x56c0`) and its PCIe root complex (`pci0000:00`); "" when unknown."""

    device_id: str = ""
    pcie_root: str = ""


@dataclass(frozen=True)
class Published:
    """How one card is published: its facts, whether claims may share it, and the reason
    it is tainted (empty: not tainted)."""

    card: Card
    facts: PciFacts = field(default_factory=PciFacts)
    shareable: bool = True
    taint: str = ""
    xe_link_group: int | None = None


@dataclass(frozen=True)
class CardState:
    """What the slice says of a card besides its facts: whether it is fit to be used (and
    if not, why, a label value), and whether prepared claims share it now."""

    card: Card
    healthy: bool = True
    reason: str = ""
    shared: bool = False


def published(
    states: Sequence[CardState],
    facts: Mapping[str, PciFacts],
    labels: Mapping[str, str],
) -> tuple[list[Published], list[str]]:
    """How each card is published given the node's labels, and notes for the log: a
    malformed label (ignored), a card labelled exclusive that claims share now (kept
    shareable until they are gone, as kube-scheduler would otherwise see one card held by
    several claims that it may no longer share)."""
    notes: list[str] = []
    names = [state.card.name for state in states]
    try:
        groups = xe_link_groups(labels, names)
    except SpecError as exc:
        notes.append(f"no Xe Link groups published: {exc}")
        groups = {}
    try:
        exclusive = exclusive_cards(labels)
    except SpecError as exc:
        notes.append(f"every card published shareable: {exc}")
        exclusive = frozenset()
    found = []
    for state in states:
        name = state.card.name
        whole = name in exclusive
        if whole and state.shared:
            notes.append(
                f"{name} is labelled exclusive but claims share it now: it stays shareable "
                "until they are gone"
            )
            whole = False
        found.append(
            Published(
                state.card,
                facts.get(name, PciFacts()),
                shareable=not whole,
                taint="" if state.healthy else (state.reason or "Unhealthy"),
                xe_link_group=groups.get(name),
            )
        )
    return found, notes


def plain(cards: Sequence[Card], facts: Mapping[str, PciFacts]) -> list[Published]:
    """Every card shareable and healthy, as a node without labels publishes them."""
    return [Published(card, facts.get(card.name, PciFacts())) for card in cards]


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def _string(value: str) -> dict[str, Any]:
    return {"string": value}


def _int(value: int) -> dict[str, Any]:
    return {"int": value}


def attributes(
    card: Card, facts: PciFacts, xe_link_group: int | None = None
) -> dict[str, dict[str, Any]]:
    """The card's attributes: the standard ones other drivers' devices can be matched
    against (`matchAttribute`), then gas's own, in the driver's domain (unqualified).
    `xeLinkGroup` (cards joined by Xe Link share it) only on linked cards, so that
    `matchAttribute: gpu.gas.intel.com/xeLinkGroup` keeps unlinked cards out."""
    found: dict[str, dict[str, Any]] = {}
    if card.pci_address:
        found[f"{STANDARD}/pciBusID"] = _string(card.pci_address)
    if facts.pcie_root:
        found[f"{STANDARD}/pcieRoot"] = _string(facts.pcie_root)
    if card.numa_node is not None:
        found[f"{STANDARD}/numaNode"] = _int(card.numa_node)
    found["cardIndex"] = _int(card.number)
    if facts.device_id:
        found["pciDeviceId"] = _string(facts.device_id)
        model = KNOWN_MODELS.get(facts.device_id)
        if model:
            found["model"] = _string(model)
    if card.driver:
        found["driver"] = _string(card.driver)
    found["tileCount"] = _int(card.tiles)
    if xe_link_group is not None:
        found["xeLinkGroup"] = _int(xe_link_group)
    return found


def _steps_below(amount: int, step: int) -> int:
    return amount - amount % step


def memory_capacity(memory: int) -> dict[str, Any]:
    """The card's memory with its policy: min and step one MEMORY_STEP, default a tenth of
    the card in whole steps (at least one). A card too small for two steps (the API
    requires min + step <= value) is published without a policy: a claim then consumes
    what it asks, or the whole card."""
    value: dict[str, Any] = {"value": format_quantity(memory)}
    if memory < 2 * MEMORY_STEP:
        return value
    default = max(MEMORY_STEP, _steps_below(memory // SHARES_BY_DEFAULT, MEMORY_STEP))
    value["requestPolicy"] = {
        "default": format_quantity(default),
        "validRange": {
            "min": format_quantity(MEMORY_STEP),
            "step": format_quantity(MEMORY_STEP),
        },
    }
    return value


def millicores_capacity() -> dict[str, Any]:
    return {
        "value": str(MILLICORES_PER_CARD),
        "requestPolicy": {
            "default": str(MILLICORES_PER_CARD // SHARES_BY_DEFAULT),
            "validRange": {"min": str(MILLICORES_STEP), "step": str(MILLICORES_STEP)},
        },
    }


def tiles_capacity(tiles: int) -> dict[str, Any]:
    """Tiles default to none: a claim that names no tiles shares the whole card and gets
    no tile mask; one that names n gets n tiles no other tile-asking claim holds."""
    return {
        "value": str(tiles),
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
    }


def device(
    card: Card,
    facts: PciFacts,
    xe_link_group: int | None = None,
    *,
    shareable: bool = True,
    taint: str = "",
    effect: str = "NoExecute",
) -> dict[str, Any]:
    capacity = {
        MEMORY: memory_capacity(card.memory),
        MILLICORES: millicores_capacity(),
        TILES: tiles_capacity(card.tiles),
    }
    found: dict[str, Any] = {
        "name": card.name,
        "attributes": attributes(card, facts, xe_link_group),
    }
    if shareable:
        found["capacity"] = capacity
        found["allowMultipleAllocations"] = True
    else:
        found["capacity"] = {name: {"value": c["value"]} for name, c in capacity.items()}
    if taint:
        found["taints"] = [{"key": UNHEALTHY_TAINT, "value": taint, "effect": effect}]
    return found


def slice_spec(
    node: str,
    published: Sequence[Published],
    generation: int,
    effect: str = "NoExecute",
) -> dict[str, Any]:
    """The spec of the node's one slice; a node without cards keeps an empty slice, so
    consumers see the pool as present and empty rather than the driver as absent."""
    ordered = sorted(published, key=lambda p: p.card.number)
    return {
        "driver": DRIVER,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "nodeName": node,
        "devices": [
            device(
                p.card,
                p.facts,
                p.xe_link_group,
                shareable=p.shareable,
                taint=p.taint,
                effect=effect,
            )
            for p in ordered
        ],
    }


def resource_slice(
    node: str,
    node_uid: str,
    published: Sequence[Published],
    generation: int,
    effect: str = "NoExecute",
) -> dict[str, Any]:
    """The whole object; owned by the Node, so it goes with the node."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": slice_spec(node, published, generation, effect),
    }


def keep_taint_times(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
    """Carry each taint's `timeAdded` over from the stored slice to `desired` (in place):
    the API server stamps a taint when it first stores it, and a NoExecute toleration's
    seconds count from then, so a rewrite for another reason must not restart them."""
    times = {
        (d.get("name"), t.get("key"), t.get("effect")): t["timeAdded"]
        for d in stored.get("devices") or []
        for t in d.get("taints") or []
        if t.get("timeAdded")
    }
    for entry in desired.get("devices") or []:
        for taint in entry.get("taints") or []:
            stamp = times.get((entry["name"], taint["key"], taint["effect"]))
            if stamp is not None:
                taint["timeAdded"] = stamp


def _canonical(value: Any, key: str = "") -> Any:
    """Quantities as numbers: the API server may store `17179869184` as `16Gi`; a taint's
    `timeAdded`, which the API server stamps, left out."""
    if isinstance(value, Mapping):
        return {k: _canonical(v, k) for k, v in value.items() if k != "timeAdded"}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str) and key in ("value", "default", "min", "max", "step"):
        try:
            return parse_quantity(value)
        except QuantityError:
            return value
    return value


def devices_differ(published: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether a stored spec says something else of the devices than `desired` (the pool's
    generation aside)."""
    if (published.get("pool") or {}).get("name") != (desired.get("pool") or {}).get("name"):
        return True
    keys = ("driver", "nodeName", "devices")
    return any(_canonical(published.get(k)) != _canonical(desired.get(k)) for k in keys)


def dropped_fields(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """What the API server left out of the devices it stored: an API server with
    consumable capacity off (the default before 1.36) drops `allowMultipleAllocations` and
    the request policies without a word, and every card becomes exclusive; one with device
    taints off (the default before 1.36) drops the taints, and an unfit card takes claims."""
    stored_devices = {d.get("name"): d for d in stored.get("devices") or []}
    dropped = []
    for device in sent.get("devices") or []:
        kept = stored_devices.get(device["name"]) or {}
        if device.get("allowMultipleAllocations") and not kept.get("allowMultipleAllocations"):
            dropped.append(f"{device['name']}: allowMultipleAllocations")
        if device.get("taints") and not kept.get("taints"):
            dropped.append(f"{device['name']}: taints")
        for name, capacity in device.get("capacity", {}).items():
            kept_capacity = (kept.get("capacity") or {}).get(name) or {}
            if "requestPolicy" in capacity and "requestPolicy" not in kept_capacity:
                dropped.append(f"{device['name']}: {name} requestPolicy")
    return dropped
