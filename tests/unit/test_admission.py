"""The admission webhook's decision, and the filter's, over one table of pods.

Each case goes both ways: as an AdmissionReview through `gas.serving.admission.review`
(the webhook's whole answer, without HTTP), and as a filter call to the real `Extender`
over the built-in demo cluster. A pod the webhook refuses must be refused by the filter on
every GPU node with the same text; a pod it admits must fit some node.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from gas.cluster.demo import DemoCluster, load_demo_file
from gas.core.admission import ANNOTATION_KEEP_SCHEDULER, Settings, decide, is_gpu_pod
from gas.core.allocator import Policy
from gas.core.ledger import Ledger
from gas.serving import admission
from gas.serving.service import Extender, Options
from gas.serving.wire import BadRequest, ExtenderArgs, encode
from tests.support.admission import I915, MEM, container, gpu_pod, patched, review_request

GPU_NODES = ["demo-1card", "demo-2cards", "demo-4cards"]


@dataclass(frozen=True)
class Case:
    id: str
    pod: dict[str, Any]
    outcome: str  # refused, mutated or allowed
    policy: Policy = field(default_factory=Policy)


ALLOW = Policy(allowlist=True)
DENY = Policy(denylist=True)
ONE = {I915: "1"}

CASES = [
    # Refused: every request the allocator rejects as malformed, whatever the nodes.
    Case("fractional memory", gpu_pod(limits={I915: "1", MEM: "1.5"}), "refused"),
    Case(
        "fractional millicores",
        gpu_pod(limits={I915: "1", "gpu.intel.com/millicores": "0.5"}),
        "refused",
    ),
    Case("negative count", gpu_pod(limits={I915: "-1"}), "refused"),
    Case("absurd memory", gpu_pod(limits={I915: "1", MEM: "100000Ei"}), "refused"),
    Case("exponent out of range", gpu_pod(limits={I915: "1", MEM: "1e99999"}), "refused"),
    Case("not a quantity", gpu_pod(limits={I915: "one"}), "refused"),
    Case("quantity not a string", gpu_pod(limits={I915: True}), "refused"),
    Case("too many GPUs", gpu_pod(limits={I915: "65"}), "refused"),
    Case("xe too many", gpu_pod(limits={"gpu.intel.com/xe": "100"}), "refused"),
    Case(
        "GPU in an init container",
        gpu_pod(init=[container("setup", {I915: "1"})]),
        "refused",
    ),
    Case(
        "percent in the reason",
        gpu_pod(containers=[container("50%", {I915: "1", MEM: "0.5"})]),
        "refused",
    ),
    Case("gas-allow malformed", gpu_pod(annotations={"gas-allow": "card0,gpu1"}), "refused", ALLOW),
    Case("gas-allow empty", gpu_pod(annotations={"gas-allow": " "}), "refused", ALLOW),
    Case("gas-deny malformed", gpu_pod(annotations={"gas-deny": "card-1"}), "refused", DENY),
    Case("gas-deny not a string", gpu_pod(annotations={"gas-deny": 3}), "refused", DENY),
    Case(
        "gas-same-gpu one container",
        gpu_pod(annotations={"gas-same-gpu": "app"}),
        "refused",
    ),
    Case(
        "gas-same-gpu unknown container",
        gpu_pod(
            containers=[container("a", ONE), container("b", ONE)],
            annotations={"gas-same-gpu": "a,c"},
        ),
        "refused",
    ),
    Case(
        "gas-same-gpu two GPUs",
        gpu_pod(
            containers=[container("a", {I915: "2"}), container("b", ONE)],
            annotations={"gas-same-gpu": "a,b"},
        ),
        "refused",
    ),
    Case("gas-policy unknown", gpu_pod(annotations={"gas-policy": "tightest"}), "refused"),
    Case(
        "xe-link odd count",
        gpu_pod(
            limits={I915: "1", "gpu.intel.com/tiles": "1"},
            annotations={"gas-allocate-xelink": "true"},
        ),
        "refused",
    ),
    Case(
        "xe-link with same-gpu",
        gpu_pod(
            containers=[container("a", ONE), container("b", ONE)],
            annotations={"gas-same-gpu": "a,b", "gas-allocate-xelink": ""},
        ),
        "refused",
    ),
    Case(
        "two problems: the filter's first",
        gpu_pod(annotations={"gas-policy": "x", "gas-same-gpu": "app"}),
        "refused",
    ),
    Case(
        "malformed, other scheduler: still refused",
        gpu_pod(limits={I915: "1", MEM: "1.5"}, scheduler="my-scheduler"),
        "refused",
    ),
    Case(
        "malformed, opted out: still refused",
        gpu_pod(limits={I915: "-2"}, annotations={ANNOTATION_KEEP_SCHEDULER: "true"}),
        "refused",
    ),
    # Admitted and sent to gas's scheduler.
    Case("valid, default scheduler", gpu_pod(), "mutated"),
    Case("valid, no schedulerName", gpu_pod(scheduler=None), "mutated"),
    Case("valid, empty schedulerName", gpu_pod(scheduler=""), "mutated"),
    Case("memory only", gpu_pod(limits={MEM: "1Gi"}), "mutated"),
    Case("zero GPUs in an init container", gpu_pod(init=[container("i", {I915: "0"})]), "mutated"),
    Case("gas-allow malformed, feature off", gpu_pod(annotations={"gas-allow": "gpu1"}), "mutated"),
    Case("gas-deny malformed, feature off", gpu_pod(annotations={"gas-deny": "x"}), "mutated"),
    Case("gas-allow valid", gpu_pod(annotations={"gas-allow": "card0"}), "mutated", ALLOW),
    Case("gas-policy valid", gpu_pod(annotations={"gas-policy": "Binpack"}), "mutated"),
    Case(
        "keep-scheduler false",
        gpu_pod(annotations={ANNOTATION_KEEP_SCHEDULER: "false"}),
        "mutated",
    ),
    # Admitted unchanged.
    Case("another scheduler", gpu_pod(scheduler="my-scheduler"), "allowed"),
    Case("gas-scheduler already", gpu_pod(scheduler="gas-scheduler"), "allowed"),
    Case("opted out", gpu_pod(annotations={ANNOTATION_KEEP_SCHEDULER: "true"}), "allowed"),
    Case(
        "opted out, any case", gpu_pod(annotations={ANNOTATION_KEEP_SCHEDULER: " TRUE "}), "allowed"
    ),
    Case("no GPU", gpu_pod(limits={}), "allowed"),
    Case(
        "no GPU, malformed annotation",
        gpu_pod(limits={"cpu": "1"}, annotations={"gas-policy": "?"}),
        "allowed",
    ),
]


def webhook_answer(
    pod: dict[str, Any], settings: Settings, operation: str = "CREATE", **kwargs: Any
) -> dict[str, Any]:
    """The webhook's AdmissionReview answer, the request encoded as the API server sends it."""
    body = encode(review_request(pod, operation, **kwargs))
    answered = admission.review(body, settings)
    # The answer must be JSON the API server can read, as it is sent.
    data: dict[str, Any] = json.loads(encode(answered.body))
    return data


def filter_reply(pod: dict[str, Any], policy: Policy) -> dict[str, Any]:
    ledger = Ledger(policy=policy)
    cluster = DemoCluster(ledger, load_demo_file(None))
    cluster.start()
    extender = Extender(ledger, cluster, Options(policy=policy))
    reply = extender.filter(ExtenderArgs(pod, pod["metadata"]["uid"], list(GPU_NODES), None))
    data: dict[str, Any] = json.loads(encode(reply.body))
    return data


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_webhook_and_filter_agree(case: Case) -> None:
    settings = Settings(policy=case.policy)
    answer = webhook_answer(case.pod, settings, uid="review-1")
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "review-1"
    after = patched(case.pod, answer)
    if case.outcome == "refused":
        assert response["allowed"] is False
        assert "patch" not in response
        status = response["status"]
        assert status["code"] == 403
        message = status["message"]
        assert message.startswith("gpu: ")
        reply = filter_reply(case.pod, case.policy)
        assert reply["NodeNames"] == []
        assert reply["FailedNodes"] == {}
        assert reply["FailedAndUnresolvableNodes"] == dict.fromkeys(GPU_NODES, message)
        return
    assert response["allowed"] is True
    assert "status" not in response
    if case.outcome == "mutated":
        expected = copy.deepcopy(case.pod)
        expected["spec"]["schedulerName"] = "gas-scheduler"
        assert after == expected
    else:
        assert after == case.pod
    if is_gpu_pod(case.pod):
        assert filter_reply(case.pod, case.policy)["NodeNames"], "an admitted pod must fit"


def test_the_reason_is_written_as_the_filter_writes_it() -> None:
    pod = next(c.pod for c in CASES if c.id == "percent in the reason")
    message = webhook_answer(pod, Settings())["response"]["status"]["message"]
    assert "%" not in message and "50 percent" in message


def test_a_few_reasons_word_for_word() -> None:
    """What a user reads at kubectl apply (the filter's words, tested above to agree)."""

    def message(pod: dict[str, Any], policy: Policy | None = None) -> str:
        answer = webhook_answer(pod, Settings(policy=policy or Policy()))
        text: str = answer["response"]["status"]["message"]
        return text

    assert message(gpu_pod(limits={I915: "1", MEM: "1.5"})) == (
        "gpu: container 'app' gpu.intel.com/memory.max: quantity '1.5' is not a whole number"
    )
    assert message(gpu_pod(init=[container("setup", ONE)])) == (
        "gpu: init container 'setup' requests GPU resources, which gas cannot annotate; "
        "request them in an app container"
    )
    assert message(gpu_pod(annotations={"gas-allow": "x"}), ALLOW) == (
        "gpu: pod annotation gas-allow is malformed: 'x' is not a card name like card0"
    )


@pytest.mark.parametrize("case", [c for c in CASES if c.outcome != "allowed"], ids=lambda c: c.id)
def test_update_is_always_allowed_unchanged(case: Case) -> None:
    """A pod's scheduler cannot change after creation, and an existing pod must stay
    editable whatever it was created with."""
    old = copy.deepcopy(case.pod)
    new = copy.deepcopy(case.pod)
    new["metadata"].setdefault("labels", {})["edited"] = "yes"
    answer = webhook_answer(new, Settings(policy=case.policy), "UPDATE", old=old)
    assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_dry_run_gets_the_same_answer(case: Case) -> None:
    settings = Settings(policy=case.policy)
    real = webhook_answer(case.pod, settings, uid="same")
    dry = webhook_answer(case.pod, settings, uid="same", dry_run=True)
    assert dry == real


def test_validate_only_refuses_but_never_sets_the_scheduler() -> None:
    settings = Settings(validate_only=True)
    for case in CASES:
        if case.policy != Policy():
            continue
        answer = webhook_answer(case.pod, settings)
        response = answer["response"]
        assert "patch" not in response
        assert response["allowed"] is (case.outcome != "refused"), case.id


def test_scheduler_name_is_the_configured_one() -> None:
    answer = webhook_answer(gpu_pod(scheduler=None), Settings(scheduler_name="gpu-sched"))
    assert patched(gpu_pod(scheduler=None), answer)["spec"]["schedulerName"] == "gpu-sched"
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert patch == [{"op": "add", "path": "/spec/schedulerName", "value": "gpu-sched"}]
    answer = webhook_answer(gpu_pod(), Settings())
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert patch == [{"op": "replace", "path": "/spec/schedulerName", "value": "gas-scheduler"}]


def test_an_opt_out_that_is_not_true_is_said_in_a_warning() -> None:
    pod = gpu_pod(annotations={ANNOTATION_KEEP_SCHEDULER: "yes"})
    response = webhook_answer(pod, Settings())["response"]
    assert response["allowed"] is True and "patch" in response
    assert response["warnings"] == [
        "annotation gas-keep-scheduler is 'yes', not \"true\": the pod is sent to gas-scheduler"
    ]


@pytest.mark.parametrize(
    ("resource", "kind", "sub"),
    [("configmaps", "ConfigMap", None), ("pods", "Binding", "binding"), ("pods", "Pod", "status")],
)
def test_other_resources_are_allowed_unread(resource: str, kind: str, sub: str | None) -> None:
    bad = gpu_pod(limits={I915: "1.5"})
    answer = webhook_answer(bad, Settings(), resource=resource, kind=kind, sub_resource=sub)
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]


def test_delete_is_allowed() -> None:
    bad = gpu_pod(limits={I915: "1.5"})
    answer = webhook_answer(None, Settings(), "DELETE", old=bad)  # type: ignore[arg-type]
    assert answer["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"", "JSON"),
        (b"[]", "body must be a JSON object"),
        (
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}',
            "v1",
        ),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}', "AdmissionReview"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request must be"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
            b'{"operation": "CREATE"}}',
            "uid",
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
            b'{"uid": "u", "operation": 1}}',
            "operation",
        ),
    ],
)
def test_a_malformed_review_is_a_bad_request(body: bytes, problem: str) -> None:
    with pytest.raises(BadRequest, match=problem):
        admission.review(body, Settings())


def test_decide_is_pure_and_reads_only_the_pod() -> None:
    pod = gpu_pod()
    before = copy.deepcopy(pod)
    first = decide(pod, "CREATE", Settings())
    assert decide(pod, "CREATE", Settings()) == first
    assert pod == before
    assert first.outcome == "mutated"


def test_generate_name_pods_are_named_by_their_prefix() -> None:
    pod = gpu_pod(limits={I915: "1.5"})
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "job-"
    answered = admission.review(encode(review_request(pod)), Settings())
    assert answered.pod == "default/job-*"


def test_respond_answers_a_decoded_review_as_review_answers_its_bytes() -> None:
    request = review_request(gpu_pod(), uid="same")
    from_bytes = admission.review(encode(request), Settings())
    assert admission.respond(request, Settings()) == from_bytes
    # Top-level names are read as Go reads them: case-insensitively.
    shouted = {key.upper(): value for key, value in request.items()}
    assert admission.respond(shouted, Settings()).body == from_bytes.body
