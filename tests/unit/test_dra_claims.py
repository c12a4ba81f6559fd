"""The way over for existing GPU pods: a `gpu.intel.com/*` pod turned into a claim of gas
dra's devices by the webhook's pure decision (`gas.core.admission.decide` with
`dra_claims`), the patched pod read back as the API server would store it."""

from __future__ import annotations

from typing import Any

import pytest

from gas.core.admission import ALLOWED, MUTATED, REFUSED, Settings, decide
from gas.core.allocator import Policy
from gas.core.dra_claims import (
    CARD_INDEX,
    DEVICE_CLASS,
    MEMORY_STEP,
    POD_CLAIM,
    round_up,
)
from gas.dra.slices import memory_capacity
from tests.support.admission import I915, MEM, container, gpu_pod
from tests.support.json_patch import apply_patch

MILLI, TILES, XE = "gpu.intel.com/millicores", "gpu.intel.com/tiles", "gpu.intel.com/xe"
DRA = Settings(dra_claims=True)


def converted(pod: dict[str, Any], settings: Settings = DRA) -> tuple[dict[str, Any], Any]:
    decision = decide(pod, "CREATE", settings)
    assert decision.outcome == MUTATED, decision
    assert decision.template is not None
    return apply_patch(pod, list(decision.patch)), decision


def requests_of(template: Any) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = template["spec"]["spec"]["devices"]["requests"]
    return result


def test_memory_pod_becomes_one_share_with_its_memory() -> None:
    pod = gpu_pod(limits={I915: "1", MEM: "4Gi", MILLI: "200", "cpu": "1"})
    stored, decision = converted(pod)
    template = decision.template
    assert template["kind"] == "ResourceClaimTemplate"
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert requests_of(template) == [
        {
            "name": "c0-gpu0",
            "exactly": {
                "deviceClassName": DEVICE_CLASS,
                "capacity": {"requests": {"memory": "4Gi", "millicores": "200"}},
            },
        }
    ]
    assert "constraints" not in template["spec"]["spec"]["devices"]
    name = template["metadata"]["name"]
    assert stored["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM, "resourceClaimTemplateName": name}
    ]
    (app,) = stored["spec"]["containers"]
    # The GPU resources are gone (else the extended-resource mapping adds default
    # shares); the others stay.
    assert app["resources"] == {
        "limits": {"cpu": "1"},
        "requests": {"cpu": "1"},
        "claims": [{"name": POD_CLAIM, "request": "c0-gpu0"}],
    }
    # No scheduler change: kube-scheduler alone places claims.
    assert stored["spec"]["schedulerName"] == "default-scheduler"


def test_multi_card_container_gets_per_card_amounts_on_distinct_cards() -> None:
    pod = gpu_pod(limits={I915: "2", MEM: "8Gi", MILLI: "500", TILES: "2"})
    stored, decision = converted(pod)
    per_card = {"memory": "4Gi", "millicores": "250", "tiles": "1"}
    assert requests_of(decision.template) == [
        {
            "name": f"c0-gpu{n}",
            "exactly": {"deviceClassName": DEVICE_CLASS, "capacity": {"requests": per_card}},
        }
        for n in (0, 1)
    ]
    assert decision.template["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["c0-gpu0", "c0-gpu1"], "distinctAttribute": CARD_INDEX}
    ]
    assert stored["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": POD_CLAIM, "request": "c0-gpu0"},
        {"name": POD_CLAIM, "request": "c0-gpu1"},
    ]


@pytest.mark.parametrize(
    ("asked", "gpus", "memory"),
    [
        ("1Gi", 1, "1Gi"),  # whole steps stay
        ("1000Mi", 1, "1Gi"),  # up to the next 256Mi step, as the device's policy does
        ("1", 1, "256Mi"),  # below the policy's minimum: the minimum
        ("3Gi", 2, "1536Mi"),
        ("1Gi", 3, "512Mi"),  # 341.33Mi per card, rounded up as gas's model does
    ],
)
def test_memory_is_rounded_as_the_request_policy_consumes_it(
    asked: str, gpus: int, memory: str
) -> None:
    _, decision = converted(gpu_pod(limits={I915: str(gpus), MEM: asked}))
    for request in requests_of(decision.template):
        assert request["exactly"]["capacity"]["requests"] == {"memory": memory}


def test_rounding_matches_the_published_policy() -> None:
    """What the conversion asks is a value gas dra's policy takes as it is (min + n·step)."""
    policy = memory_capacity(16 * 1024**3)["requestPolicy"]["validRange"]
    assert policy == {"min": "256Mi", "step": "256Mi"}
    for amount in (1, MEMORY_STEP - 1, MEMORY_STEP, MEMORY_STEP + 1, 10 * MEMORY_STEP - 7):
        rounded = round_up(amount, MEMORY_STEP, MEMORY_STEP)
        assert rounded >= amount and rounded % MEMORY_STEP == 0
        assert rounded - amount < MEMORY_STEP
    assert round_up(15, 10, 10) == 20 and round_up(5, 10, 10) == 10


def test_millicores_are_rounded_to_steps_of_ten() -> None:
    _, decision = converted(gpu_pod(limits={I915: "3", MILLI: "100"}))
    for request in requests_of(decision.template):
        assert request["exactly"]["capacity"]["requests"] == {"millicores": "40"}


def test_a_bare_i915_pod_gets_default_shares() -> None:
    _, decision = converted(gpu_pod(limits={I915: "1"}))
    assert requests_of(decision.template) == [
        {"name": "c0-gpu0", "exactly": {"deviceClassName": DEVICE_CLASS}}
    ]


def test_pods_of_one_shape_share_a_template_and_shapes_differ() -> None:
    one = decide(gpu_pod("a", limits={I915: "1", MEM: "1000Mi"}), "CREATE", DRA)
    two = decide(gpu_pod("b", limits={I915: "1", MEM: "1Gi"}), "CREATE", DRA)
    three = decide(gpu_pod("c", limits={I915: "1", MEM: "2Gi"}), "CREATE", DRA)
    assert one.template is not None and two.template is not None and three.template
    assert one.template == two.template
    assert one.template["metadata"]["name"] != three.template["metadata"]["name"]
    assert one.template["metadata"]["name"].startswith("gas-gpu-")


def test_several_containers_each_name_their_own_requests() -> None:
    pod = gpu_pod(
        containers=[
            container("sidecar", {"cpu": "1"}),
            container("a", {I915: "1", MEM: "2Gi"}),
            container("b", {I915: "2", MEM: "2Gi"}),
        ]
    )
    stored, decision = converted(pod)
    names = [r["name"] for r in requests_of(decision.template)]
    assert names == ["c1-gpu0", "c2-gpu0", "c2-gpu1"]
    sidecar, a, b = stored["spec"]["containers"]
    assert "claims" not in sidecar["resources"]
    assert [c["request"] for c in a["resources"]["claims"]] == ["c1-gpu0"]
    assert [c["request"] for c in b["resources"]["claims"]] == ["c2-gpu0", "c2-gpu1"]


def test_same_gpu_containers_share_one_request_of_their_summed_amounts() -> None:
    pod = gpu_pod(
        annotations={"gas-same-gpu": "a,b"},
        containers=[
            container("a", {I915: "1", MEM: "1Gi", MILLI: "100"}),
            container("b", {I915: "1", MEM: "512Mi", MILLI: "50"}),
        ],
    )
    stored, decision = converted(pod)
    assert requests_of(decision.template) == [
        {
            "name": "c0-gpu0",
            "exactly": {
                "deviceClassName": DEVICE_CLASS,
                "capacity": {"requests": {"memory": "1536Mi", "millicores": "150"}},
            },
        }
    ]
    for app in stored["spec"]["containers"]:
        assert app["resources"]["claims"] == [{"name": POD_CLAIM, "request": "c0-gpu0"}]


def test_xe_pods_ask_for_xe_cards_and_allow_deny_become_selectors() -> None:
    pod = gpu_pod(
        limits={XE: "1", MEM: "1Gi"},
        annotations={"gas-allow": "card0,card2", "gas-deny": "card1"},
    )
    settings = Settings(dra_claims=True, policy=Policy(allowlist=True, denylist=True))
    _, decision = converted(pod, settings)
    (request,) = requests_of(decision.template)
    attributes = 'device.attributes["gpu.gas.intel.com"]'
    assert request["exactly"]["selectors"] == [
        {"cel": {"expression": f'{attributes}.driver == "xe"'}},
        {"cel": {"expression": f"{attributes}.cardIndex in [0, 2]"}},
        {"cel": {"expression": f"!({attributes}.cardIndex in [1])"}},
    ]
    # As the extender, the annotations count only with their switches on.
    _, plain = converted(pod)
    (request,) = requests_of(plain.template)
    assert len(request["exactly"]["selectors"]) == 1


def test_existing_claims_are_kept() -> None:
    pod = gpu_pod(limits={I915: "1", MEM: "1Gi"})
    pod["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimName": "my-nic"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "nic"}]
    stored, decision = converted(pod)
    name = decision.template["metadata"]["name"]
    assert stored["spec"]["resourceClaims"] == [
        {"name": "nic", "resourceClaimName": "my-nic"},
        {"name": POD_CLAIM, "resourceClaimTemplateName": name},
    ]
    assert stored["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "nic"},
        {"name": POD_CLAIM, "request": "c0-gpu0"},
    ]


@pytest.mark.parametrize(
    ("limits", "annotations", "reason"),
    [
        (
            {I915: "2", TILES: "2"},
            {"gas-allocate-xelink": "true"},
            "gpu: pod annotation gas-allocate-xelink cannot be carried by a DRA claim: "
            "gpu.gas.intel.com publishes no Xe Link groups",
        ),
        (
            {I915: "1"},
            {"gas-allocate-single-numa": "true"},
            "gpu: pod annotation gas-allocate-single-numa cannot be carried by a DRA claim; ask "
            "for cards on one NUMA node with a claim of your own (matchAttribute "
            "resource.kubernetes.io/numaNode)",
        ),
        (
            {I915: "1", "gpu.intel.com/i915_monitoring": "1"},
            {},
            "gpu: container 'app' asks for gpu.intel.com/i915_monitoring, which no DRA claim "
            "of gpu.gas.intel.com can carry",
        ),
        (
            {MEM: "1Gi"},
            {},
            "gpu: container 'app' asks for GPU resources but for no GPU "
            "(gpu.intel.com/i915 or gpu.intel.com/xe)",
        ),
        # What the extender refuses is refused first, in its words.
        ({I915: "1", MEM: "1.5"}, {}, "gpu: container 'app' gpu.intel.com/memory.max: "),
        (
            {I915: "2"},
            {"gas-same-gpu": "app"},
            "gpu: pod annotation gas-same-gpu must name at least two containers",
        ),
    ],
)
def test_what_cannot_map_is_refused_with_a_reason(
    limits: dict[str, str], annotations: dict[str, str], reason: str
) -> None:
    decision = decide(gpu_pod(limits=limits, annotations=annotations), "CREATE", DRA)
    assert decision.outcome == REFUSED
    assert decision.reason.startswith(reason)
    assert decision.template is None and not decision.patch


def test_a_claim_name_taken_is_refused() -> None:
    pod = gpu_pod(limits={I915: "1"})
    pod["spec"]["resourceClaims"] = [{"name": POD_CLAIM, "resourceClaimName": "x"}]
    decision = decide(pod, "CREATE", DRA)
    assert decision.outcome == REFUSED
    assert decision.reason == "gpu: pod already has a resource claim named 'gas-gpu'"


def test_gas_policy_is_a_warning_not_a_refusal() -> None:
    _, decision = converted(gpu_pod(limits={I915: "1"}, annotations={"gas-policy": "binpack"}))
    assert decision.warnings == (
        "annotation gas-policy has no effect on DRA claims: kube-scheduler chooses the card",
    )


def test_pods_without_gpus_updates_and_converted_pods_are_left_alone() -> None:
    plain = gpu_pod(containers=[container("app", {"cpu": "1"})])
    assert decide(plain, "CREATE", DRA).outcome == ALLOWED
    pod = gpu_pod(limits={I915: "1", MEM: "1Gi"})
    assert decide(pod, "UPDATE", DRA).outcome == ALLOWED
    # Idempotent: the converted pod asks for no gpu.intel.com/ resource, so a second
    # review (another webhook's reinvocation, a re-create from its stored form) keeps it.
    stored, _ = converted(pod)
    again = decide(stored, "CREATE", DRA)
    assert again.outcome == ALLOWED and not again.patch and again.template is None
    # A pod of zero GPUs has nothing to claim.
    assert decide(gpu_pod(limits={I915: "0"}), "CREATE", DRA).outcome == ALLOWED


def test_without_the_switch_pods_still_go_to_gas_scheduler() -> None:
    decision = decide(gpu_pod(limits={I915: "1", MEM: "1Gi"}), "CREATE", Settings())
    assert decision.template is None
    assert decision.patch == (
        {"op": "replace", "path": "/spec/schedulerName", "value": "gas-scheduler"},
    )
