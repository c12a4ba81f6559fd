"""Pod admission: what gas's webhook decides about one pod, from the pod alone.

Pure: a pod (JSON dict, as the API server sends it) and the settings in, a decision out.
The refusal reason is found by the very functions the filter uses (`pod_request`, then
`annotation_problem` under the same policy), so a pod refused at creation is refused with
the words the filter would give for it on every node; problems that depend on a node
(its labels, its cards) are left to the filter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gas.core.allocator import Policy, annotation_problem
from gas.core.dra_claims import convert
from gas.core.model import RESOURCE_PREFIX, SpecError, as_list, as_mapping, pod_request

DEFAULT_SCHEDULER = "default-scheduler"
GAS_SCHEDULER = "gas-scheduler"
# A pod annotated `gas-keep-scheduler: "true"` keeps the scheduler it names.
ANNOTATION_KEEP_SCHEDULER = "gas-keep-scheduler"

# Decisions, as counted in gas_admission_reviews{outcome}.
MUTATED = "mutated"
ALLOWED = "allowed"
REFUSED = "refused"


@dataclass(frozen=True)
class Settings:
    """`gas webhook`'s flags: the scheduler GPU pods are sent to, whether to send them
    there at all (`validate_only`: kubeadm installs, where gas sits inside the default
    scheduler), and the policy whose allow/deny switches decide which annotation problems
    count, as they do for the filter. `dra_claims`: turn GPU pods into DRA claims of gas
    dra's devices instead of sending them to a scheduler (clusters whose GPU nodes all
    run `gas dra`)."""

    scheduler_name: str = GAS_SCHEDULER
    validate_only: bool = False
    policy: Policy = field(default_factory=Policy)
    dra_claims: bool = False


@dataclass(frozen=True)
class Decision:
    """`outcome` (MUTATED, ALLOWED or REFUSED); the JSON Patch operations of a mutation;
    the reason of a refusal (the filter's words); warnings for the user; the
    ResourceClaimTemplate the patched pod names, which must exist in the pod's namespace
    before the pod is admitted (with `dra_claims`)."""

    outcome: str
    patch: tuple[dict[str, Any], ...] = ()
    reason: str = ""
    warnings: tuple[str, ...] = ()
    template: Mapping[str, Any] | None = None


def is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    """Whether any container or init container names a `gpu.intel.com/` resource in its
    limits or requests (whatever the amount): the pods the webhook configuration's
    matchConditions send here."""
    spec = as_mapping(pod.get("spec"))
    for key in ("containers", "initContainers"):
        for container in as_list(spec.get(key)):
            resources = as_mapping(as_mapping(container).get("resources"))
            for part in ("limits", "requests"):
                for name in as_mapping(resources.get(part)):
                    if isinstance(name, str) and name.startswith(RESOURCE_PREFIX):
                        return True
    return False


def refusal(pod: Mapping[str, Any], policy: Policy) -> str | None:
    """Why gas can never place `pod`, on any node: the filter's reason, or None."""
    try:
        request = pod_request(pod)
    except SpecError as exc:
        return str(exc)
    return annotation_problem(request, policy)


def to_claims(pod: Mapping[str, Any], policy: Policy) -> Decision:
    """`pod`, already found placeable, as a pod of DRA claims (gas.core.dra_claims)."""
    conversion = convert(pod, pod_request(pod), (policy.allowlist, policy.denylist))
    if conversion.reason:
        return Decision(REFUSED, reason=conversion.reason)
    if conversion.template is None:
        return Decision(ALLOWED)  # GPU resources of 0 only: nothing to claim
    return Decision(
        MUTATED,
        patch=conversion.patch,
        warnings=conversion.warnings,
        template=conversion.template,
    )


def decide(pod: Mapping[str, Any], operation: str, settings: Settings) -> Decision:
    """The webhook's answer for `pod` on `operation` (CREATE, UPDATE, ...).

    Only a CREATE is judged: a pod's scheduler cannot change after it, and refusing an
    UPDATE would stop an existing pod from being edited (its labels, its deletion's
    finalizers) for a problem it was created with."""
    if operation != "CREATE" or not is_gpu_pod(pod):
        return Decision(ALLOWED)
    reason = refusal(pod, settings.policy)
    if reason is not None:
        return Decision(REFUSED, reason=reason)
    if settings.validate_only:
        return Decision(ALLOWED)
    if settings.dra_claims:
        return to_claims(pod, settings.policy)
    metadata = as_mapping(pod.get("metadata"))
    keep = as_mapping(metadata.get("annotations")).get(ANNOTATION_KEEP_SCHEDULER)
    warnings: tuple[str, ...] = ()
    if keep is not None:
        value = keep.strip().lower() if isinstance(keep, str) else None
        if value == "true":
            return Decision(ALLOWED)
        if value != "false":
            warnings = (
                f"annotation {ANNOTATION_KEEP_SCHEDULER} is {str(keep)[:40]!r}, not "
                f'"true": the pod is sent to {settings.scheduler_name}',
            )
    spec = as_mapping(pod.get("spec"))
    name = spec.get("schedulerName")
    if name not in (None, "", DEFAULT_SCHEDULER):
        return Decision(ALLOWED)  # another scheduler was chosen on purpose
    # RFC 6902: `replace` needs the member to exist, `add` sets it either way.
    op = "add" if "schedulerName" not in spec else "replace"
    patch = ({"op": op, "path": "/spec/schedulerName", "value": settings.scheduler_name},)
    return Decision(MUTATED, patch=patch, warnings=warnings)
