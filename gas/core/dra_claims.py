"""The way over for existing GPU pods: a pod that asks for `gpu.intel.com/*` resources,
turned into a DRA claim of `gas dra`'s devices with the same per-card amounts.

kube-scheduler's extended-resource mapping turns each `gpu.intel.com/i915` into one share
with the DeviceClass's default capacity; it cannot carry `memory.max`, `millicores` or
`tiles`. So the webhook (with `--draClaims`) rewrites such a pod: one ResourceClaimTemplate
per pod shape, one request per card with `capacity.requests` of the per-card amounts gas's
model reads from the pod (`pod_request`, the extender's own reading), and the containers
naming their requests instead of the `gpu.intel.com/*` resources.

Pure: a pod and the allow/deny switches in, a template and a JSON patch (or a reason) out.
The request policies of gas dra's devices live here too, since both the driver (which
publishes them) and the conversion (which rounds to them) must agree on them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gas.core.model import (
    ANNOTATION_POLICY,
    ANNOTATION_SINGLE_NUMA,
    ANNOTATION_XELINK,
    GPU_COUNT_RESOURCES,
    MAX_CARDS_PER_NODE,
    RESOURCE_PREFIX,
    TILES,
    XE,
    ContainerNeed,
    PodRequest,
    SpecError,
    as_list,
    as_mapping,
    is_card_name,
    read_split_label,
)
from gas.core.quantity import format_quantity

DRIVER = "gpu.gas.intel.com"
DEVICE_CLASS = DRIVER
"""deploy/dra's DeviceClass: it selects every device of gas's driver."""

CAPACITY_MEMORY = "memory"
CAPACITY_MILLICORES = "millicores"
CAPACITY_TILES = "tiles"

MIB = 1024**2
MEMORY_STEP = 256 * MIB
"""Memory is consumed in whole 256 MiB steps: a request is rounded up to the next one, so
what is left of a card is always whole steps, and no claim leaves a sliver too small for
the next. Rounding costs a claim at most 255 MiB."""
MILLICORES_PER_CARD = 1000
MILLICORES_STEP = 10

# What each gas resource becomes: the capacity of gas dra's device it is asked of.
CAPACITY_OF = {
    "gpu.intel.com/memory.max": CAPACITY_MEMORY,
    "gpu.intel.com/millicores": CAPACITY_MILLICORES,
    TILES: CAPACITY_TILES,
}

POD_CLAIM = "gas-gpu"
"""The name of the pod's claim entry (`spec.resourceClaims[].name`)."""
TEMPLATE_PREFIX = "gas-gpu-"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gas-webhook"}
"""On every template the webhook makes, so `kubectl get resourceclaimtemplates -A -l
app.kubernetes.io/managed-by=gas-webhook` lists them."""

LABEL_EXCLUSIVE_CARDS = f"{DRIVER}/exclusive-cards"
"""The node label naming the cards gas dra publishes whole, one claim at a time
(`card0.card2`, continued in `...2`, `...3` as gas's other card labels are); every other
card is shareable."""
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
"""The device taint of a card that is not fit to be used; its value says why."""

CARD_INDEX = f"{DRIVER}/cardIndex"
"""What keeps a multi-card container's requests on distinct cards: gas dra publishes it on
every device, unlike pciBusID which it leaves out when discovery does not know the
address, and a device without the attribute would fail the constraint. A claim's devices
all come from one node's pool, where card indices are unique."""


@dataclass(frozen=True)
class Conversion:
    """The template the pod's claim is made from, and the patch that makes the pod use it;
    or `reason`, why the pod cannot be converted (a refusal)."""

    template: Mapping[str, Any] | None = None
    patch: tuple[dict[str, Any], ...] = ()
    reason: str = ""
    warnings: tuple[str, ...] = ()


def exclusive_cards(labels: Mapping[str, str]) -> frozenset[str]:
    """The cards the node's label keeps whole; SpecError for a malformed label."""
    value = read_split_label(labels, LABEL_EXCLUSIVE_CARDS)
    if not value:
        return frozenset()
    cards = value.split(".")
    if not all(is_card_name(card) for card in cards):
        raise SpecError(
            f"node label {LABEL_EXCLUSIVE_CARDS}={value!r} is not card names joined by dots "
            "(card0.card2)"
        )
    if len(cards) > MAX_CARDS_PER_NODE:
        raise SpecError(f"node label {LABEL_EXCLUSIVE_CARDS} names too many cards")
    return frozenset(cards)


def round_up(amount: int, step: int, minimum: int) -> int:
    """`amount` as gas dra's request policy consumes it: at least `minimum`, in whole
    `step`s above it (validRange{min, step}), so the claim asks exactly what it gets."""
    if amount <= minimum:
        return minimum
    return minimum + -(-(amount - minimum) // step) * step


def per_card_requests(amounts: Mapping[str, int]) -> dict[str, str]:
    """`capacity.requests` of one card for per-card gas amounts (capacity name -> amount);
    amounts of 0 are left out (the device's default applies, or none for tiles)."""
    found: dict[str, str] = {}
    memory = amounts.get(CAPACITY_MEMORY, 0)
    if memory > 0:
        found[CAPACITY_MEMORY] = format_quantity(round_up(memory, MEMORY_STEP, MEMORY_STEP))
    millicores = amounts.get(CAPACITY_MILLICORES, 0)
    if millicores > 0:
        found[CAPACITY_MILLICORES] = str(round_up(millicores, MILLICORES_STEP, MILLICORES_STEP))
    tiles = amounts.get(CAPACITY_TILES, 0)
    if tiles > 0:
        found[CAPACITY_TILES] = str(tiles)
    return found


def _capacities(need: ContainerNeed) -> dict[str, int] | str:
    """The container's per-card amounts by capacity name, or why it cannot be carried."""
    amounts: dict[str, int] = {}
    for resource, amount in need.per_card().items():
        if resource in GPU_COUNT_RESOURCES or amount == 0:
            continue
        capacity = CAPACITY_OF.get(resource)
        if capacity is None:
            return (
                f"gpu: container {need.name!r} asks for {resource}, which no DRA claim of "
                f"{DRIVER} can carry"
            )
        amounts[capacity] = amount
    return amounts


def _selectors(
    need: ContainerNeed, request: PodRequest, allow_deny: tuple[bool, bool]
) -> list[Any]:
    """CEL selectors for the device: the kernel driver for `gpu.intel.com/xe` (as the xe
    resource is advertised only by xe cards), and gas-allow / gas-deny over card indices
    when those switches are on (as the extender honours them only then)."""
    exprs = []
    attributes = f'device.attributes["{DRIVER}"]'
    if need.requests.get(XE, 0) > 0:
        exprs.append(f'{attributes}.driver == "xe"')
    allowlist, denylist = allow_deny
    if allowlist and request.allow is not None:
        exprs.append(f"{attributes}.cardIndex in [{_indices(request.allow)}]")
    if denylist and request.deny:
        exprs.append(f"!({attributes}.cardIndex in [{_indices(request.deny)}])")
    return [{"cel": {"expression": expr}} for expr in exprs]


def _indices(cards: frozenset[str]) -> str:
    return ", ".join(str(n) for n in sorted(int(card[len("card") :]) for card in cards))


def template_name(claim_spec: Mapping[str, Any]) -> str:
    """Named by the claim it makes: pods of one shape share one template, and a template
    of that name always makes that claim."""
    canonical = json.dumps(claim_spec, sort_keys=True, separators=(",", ":"))
    return TEMPLATE_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def convert(
    pod: Mapping[str, Any], request: PodRequest, allow_deny: tuple[bool, bool] = (False, False)
) -> Conversion:
    """The claim for `pod`, whose GPU asks `request` are already known to be readable
    (the caller refused the pod otherwise). `allow_deny`: the webhook's allowlist and
    denylist switches."""
    if request.xelink:
        return Conversion(
            reason=f"gpu: pod annotation {ANNOTATION_XELINK} cannot be carried by a DRA claim: "
            f"{DRIVER} publishes no Xe Link groups"
        )
    if request.single_numa:
        return Conversion(
            reason=f"gpu: pod annotation {ANNOTATION_SINGLE_NUMA} cannot be carried by a DRA "
            "claim; ask for cards on one NUMA node with a claim of your own "
            "(matchAttribute resource.kubernetes.io/numaNode)"
        )
    spec = as_mapping(pod.get("spec"))
    claims = as_list(spec.get("resourceClaims"))
    if any(as_mapping(claim).get("name") == POD_CLAIM for claim in claims):
        return Conversion(reason=f"gpu: pod already has a resource claim named {POD_CLAIM!r}")
    warnings: tuple[str, ...] = ()
    if request.policy is not None:
        warnings = (
            f"annotation {ANNOTATION_POLICY} has no effect on DRA claims: kube-scheduler "
            "chooses the card",
        )
    same_gpu = set(request.same_gpu)
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    # Per container index: the request names it uses.
    uses: dict[int, list[str]] = {}
    shared: dict[str, int] = {}  # the one card of the gas-same-gpu containers
    shared_request: dict[str, Any] | None = None
    for index, need in enumerate(request.containers):
        if need.gpus <= 0:
            if any(amount > 0 for amount in need.requests.values()):
                return Conversion(
                    reason=f"gpu: container {need.name!r} asks for GPU resources but for no "
                    f"GPU ({' or '.join(GPU_COUNT_RESOURCES)})"
                )
            continue
        amounts = _capacities(need)
        if isinstance(amounts, str):
            return Conversion(reason=amounts)
        if need.name in same_gpu:
            # One card for all of them: one request of their summed per-card amounts,
            # as gas's books add each one's need on the card they share.
            for capacity, amount in amounts.items():
                shared[capacity] = shared.get(capacity, 0) + amount
            if shared_request is None:
                shared_request = _request(f"c{index}-gpu0", need, request, allow_deny, {})
                requests.append(shared_request)
            uses[index] = [shared_request["name"]]
            continue
        names = [f"c{index}-gpu{card}" for card in range(need.gpus)]
        for name in names:
            requests.append(_request(name, need, request, allow_deny, amounts))
        if len(names) > 1:
            constraints.append({"requests": names, "distinctAttribute": CARD_INDEX})
        uses[index] = names
    if shared_request is not None:
        wanted = per_card_requests(shared)
        if wanted:
            shared_request["exactly"]["capacity"] = {"requests": wanted}
    if not requests:
        return Conversion()
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    claim_spec = {"devices": devices}
    name = template_name(claim_spec)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {"metadata": {"labels": dict(MANAGED_BY)}, "spec": claim_spec},
    }
    patch: list[dict[str, Any]] = [
        {
            "op": "add",
            "path": "/spec/resourceClaims",
            "value": [*claims, {"name": POD_CLAIM, "resourceClaimTemplateName": name}],
        }
    ]
    containers = as_list(spec.get("containers"))
    for index, names in uses.items():
        resources = _without_gpu(as_mapping(as_mapping(containers[index]).get("resources")))
        resources["claims"] = [
            *as_list(resources.get("claims")),
            *({"name": POD_CLAIM, "request": name} for name in names),
        ]
        patch.append(
            {"op": "add", "path": f"/spec/containers/{index}/resources", "value": resources}
        )
    return Conversion(template=template, patch=tuple(patch), warnings=warnings)


def _request(
    name: str,
    need: ContainerNeed,
    request: PodRequest,
    allow_deny: tuple[bool, bool],
    amounts: Mapping[str, int],
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
    selectors = _selectors(need, request, allow_deny)
    if selectors:
        exactly["selectors"] = selectors
    wanted = per_card_requests(amounts)
    if wanted:
        exactly["capacity"] = {"requests": wanted}
    return {"name": name, "exactly": exactly}


def _without_gpu(resources: Mapping[str, Any]) -> dict[str, Any]:
    """The container's resources less every `gpu.intel.com/` one: left in, they would
    also go through the extended-resource mapping and take default shares besides."""
    kept = dict(resources)
    for part in ("limits", "requests"):
        if part in kept:
            kept[part] = {
                name: amount
                for name, amount in as_mapping(kept[part]).items()
                if not (isinstance(name, str) and name.startswith(RESOURCE_PREFIX))
            }
    return kept
