"""Unit and property tests for gas.core.model: nodes, pods, annotations, card order."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gas.core.model import (
    I915,
    LABEL_CARDS,
    LABEL_GPU_NUMBERS,
    TILES,
    XE,
    ContainerNeed,
    PodRequest,
    SpecError,
    allocation_usage,
    card_number,
    container_requests,
    format_cards,
    gpu_count,
    is_card_name,
    node_cards,
    node_from_object,
    parse_cards,
    pod_request,
    read_split_label,
    sort_cards,
)
from tests.support.objects import GI, MEM, MILLI, make_node, pod_object, res

MODEST = settings(max_examples=200, deadline=None)


# Not the shared ctr: no requests map at all when none are given, and limits on demand.
def ctr(
    name: str = "c", *, limits: dict[str, Any] | None = None, **requests: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = {res(k): v for k, v in requests.items()}
    if limits is not None:
        resources["limits"] = {res(k): v for k, v in limits.items()}
    return {"name": name, "resources": resources}


def make_pod(name: str, *containers: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A pod in namespace default (`fields` as pod_object takes them); without containers,
    one that asks for nothing."""
    return pod_object(name, *(containers or (ctr(),)), namespace="default", **fields)


# ---------------------------------------------------------------- card names and order


def test_sort_cards_is_numeric() -> None:
    assert sort_cards(["card10", "card2", "card1", "card0"]) == (
        "card0",
        "card1",
        "card2",
        "card10",
    )


def test_sort_cards_puts_non_card_names_last() -> None:
    assert sort_cards(["gpu0", "card10", "x", "card9"]) == ("card9", "card10", "gpu0", "x")


@pytest.mark.parametrize(
    ("name", "number"),
    [("card0", 0), ("card7", 7), ("card10", 10), ("card123456", 123456)],
)
def test_card_number(name: str, number: int) -> None:
    assert card_number(name) == number
    assert is_card_name(name)


@pytest.mark.parametrize(
    "name", ["card", "card01", "gpu0", "Card0", "card-1", "card1x", "", "card1234567"]
)
def test_not_card_names(name: str) -> None:
    assert not is_card_name(name)
    assert card_number(name) > 10**6


@MODEST
@given(st.lists(st.integers(min_value=0, max_value=999_999), unique=True, max_size=20))
def test_sort_cards_matches_integer_order(numbers: list[int]) -> None:
    names = [f"card{n}" for n in numbers]
    assert sort_cards(names) == tuple(f"card{n}" for n in sorted(numbers))


# ---------------------------------------------------------------- split labels


def test_read_split_label_concatenates_continuations() -> None:
    labels = {
        LABEL_GPU_NUMBERS: "0.1.2",
        LABEL_GPU_NUMBERS + "2": "Z.5.8.9",
        LABEL_GPU_NUMBERS + "3": "Z.10",
    }
    assert read_split_label(labels, LABEL_GPU_NUMBERS) == "0.1.2.5.8.9.10"


def test_read_split_label_generic_text() -> None:
    labels = {"k": "foo", "k2": "Zbar", "k3": "Zber"}
    assert read_split_label(labels, "k") == "foobarber"


def test_read_split_label_stops_at_first_gap() -> None:
    labels = {"k": "a", "k2": "Zb", "k4": "Zd"}
    assert read_split_label(labels, "k") == "ab"


def test_read_split_label_base_may_be_absent() -> None:
    assert read_split_label({"k2": "Z0.1"}, "k") == "0.1"


def test_read_split_label_missing_is_empty() -> None:
    assert read_split_label({}, "k") == ""


@pytest.mark.parametrize("bad", ["0.1", "", "z.1"])
def test_read_split_label_rejects_continuation_without_marker(bad: str) -> None:
    with pytest.raises(SpecError, match="does not start with Z"):
        read_split_label({"k": "0", "k2": bad}, "k")


# ---------------------------------------------------------------- node cards


@pytest.mark.parametrize(
    ("labels", "cards"),
    [
        ({LABEL_GPU_NUMBERS: "0"}, ("card0",)),
        ({LABEL_GPU_NUMBERS: "0.1"}, ("card0", "card1")),
        ({LABEL_GPU_NUMBERS: "0.1.2.3"}, ("card0", "card1", "card2", "card3")),
        ({LABEL_GPU_NUMBERS: "10.2.1"}, ("card1", "card2", "card10")),
        ({LABEL_CARDS: "card0.card1"}, ("card0", "card1")),
        ({LABEL_CARDS: "card10.card9"}, ("card9", "card10")),
        # gpu-numbers wins over cards
        ({LABEL_GPU_NUMBERS: "3", LABEL_CARDS: "card0.card1"}, ("card3",)),
        # empty gpu-numbers falls back to cards
        ({LABEL_GPU_NUMBERS: "", LABEL_CARDS: "card4"}, ("card4",)),
        # split gpu-numbers
        ({LABEL_GPU_NUMBERS: "0.1", LABEL_GPU_NUMBERS + "2": "Z.2"}, ("card0", "card1", "card2")),
    ],
)
def test_node_cards(labels: dict[str, str], cards: tuple[str, ...]) -> None:
    assert node_cards(labels) == cards


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        ({}, "has no gpu.intel.com/gpu-numbers or gpu.intel.com/cards label"),
        ({"other": "x"}, "has no gpu.intel.com/gpu-numbers or gpu.intel.com/cards label"),
        ({LABEL_CARDS: ""}, "has no"),
        ({LABEL_GPU_NUMBERS: "0..1"}, "gpu-numbers is malformed"),
        ({LABEL_GPU_NUMBERS: "a.b"}, "gpu-numbers is malformed"),
        ({LABEL_GPU_NUMBERS: "01"}, "gpu-numbers is malformed"),
        ({LABEL_GPU_NUMBERS: "-1"}, "gpu-numbers is malformed"),
        ({LABEL_GPU_NUMBERS: "0.1."}, "gpu-numbers is malformed"),
        ({LABEL_GPU_NUMBERS: "card0"}, "gpu-numbers is malformed"),
        ({LABEL_CARDS: "0.1"}, "cards is malformed"),
        ({LABEL_CARDS: "card0..card1"}, "cards is malformed"),
        ({LABEL_CARDS: "gpu0"}, "cards is malformed"),
        ({LABEL_GPU_NUMBERS: "0.1.0"}, "lists a card twice"),
        ({LABEL_CARDS: "card1.card1"}, "lists a card twice"),
        ({LABEL_GPU_NUMBERS: ".".join(str(i) for i in range(257))}, "too many cards"),
        ({LABEL_GPU_NUMBERS: "0", LABEL_GPU_NUMBERS + "2": "1"}, "does not start with Z"),
    ],
)
def test_node_cards_rejects(labels: dict[str, str], words: str) -> None:
    with pytest.raises(SpecError, match=re.escape(words)):
        node_cards(labels)


def test_node_cards_allows_256() -> None:
    labels = {LABEL_GPU_NUMBERS: ".".join(str(i) for i in range(256))}
    assert len(node_cards(labels)) == 256


# ---------------------------------------------------------------- node_from_object


def test_node_one_card() -> None:
    node = node_from_object(make_node("n1", "0", i915="8", memory_max="8Gi"))
    assert node.name == "n1"
    assert node.problem is None
    assert node.cards == ("card0",)
    assert node.capacity == {I915: 8, MEM: 8 * GI}


def test_node_two_cards_divides_allocatable() -> None:
    node = node_from_object(
        make_node("n1", "0.1", i915="16", millicores="2000", tiles="4", memory_max="16G")
    )
    assert node.cards == ("card0", "card1")
    assert node.capacity == {I915: 8, MILLI: 1000, TILES: 2, MEM: 8_000_000_000}


def test_node_four_cards_truncates() -> None:
    node = node_from_object(
        make_node("n4", "0.1.2.3", i915="4", millicores="1003", i915_monitoring="1")
    )
    assert node.cards == ("card0", "card1", "card2", "card3")
    assert node.capacity == {I915: 1, MILLI: 250, "gpu.intel.com/i915_monitoring": 0}


def test_node_label_allocatable_mismatch_rounds_down() -> None:
    node = node_from_object(make_node("n", "0.1", i915="3"))
    assert node.capacity == {I915: 1}


def test_node_more_cards_than_i915_gives_zero_per_card() -> None:
    node = node_from_object(make_node("n", "0.1.2.3", i915="2"))
    assert node.problem is None
    assert node.capacity == {I915: 0}


def test_node_ignores_non_gpu_allocatable() -> None:
    obj = make_node("n", "0", i915="1")
    obj["status"]["allocatable"].update({"cpu": "4", "memory": "1.5Gi", "nvidia.com/gpu": "x"})
    assert node_from_object(obj).capacity == {I915: 1}


def test_node_cards_label_fallback() -> None:
    node = node_from_object(make_node("n", None, labels={LABEL_CARDS: "card0.card1"}, i915="2"))
    assert node.cards == ("card0", "card1")
    assert node.capacity == {I915: 1}


def test_node_gpu_numbers_preferred_over_cards() -> None:
    node = node_from_object(make_node("n", "5", labels={LABEL_CARDS: "card0.card1"}, i915="4"))
    assert node.cards == ("card5",)
    assert node.capacity == {I915: 4}


def test_node_without_labels_has_problem() -> None:
    node = node_from_object(make_node("plain", None, i915="8"))
    assert node.cards == ()
    assert node.capacity == {}
    assert node.problem == "gpu: node has no gpu.intel.com/gpu-numbers or gpu.intel.com/cards label"


def test_node_with_malformed_label_has_problem() -> None:
    node = node_from_object(make_node("n", "0.x", i915="8"))
    assert node.problem == "gpu: node label gpu.intel.com/gpu-numbers is malformed"


@pytest.mark.parametrize("quantity", ["1.5", "abc", "-2", "1e400", 1.0, None])
def test_node_with_malformed_allocatable_has_problem(quantity: Any) -> None:
    node = node_from_object(make_node("n", "0", i915="2", memory_max=quantity))
    assert node.problem == "gpu: node allocatable gpu.intel.com/memory.max is malformed"
    assert node.cards == ()


def test_node_without_allocatable_has_no_capacity() -> None:
    obj = make_node("n", "0.1")
    del obj["status"]
    node = node_from_object(obj)
    assert node.problem is None
    assert node.cards == ("card0", "card1")
    assert node.capacity == {}


@pytest.mark.parametrize(
    "obj",
    [{}, {"metadata": None}, {"metadata": {"name": 5}}, {"metadata": "x", "status": []}],
)
def test_node_garbage_never_raises(obj: dict[str, Any]) -> None:
    node = node_from_object(obj)
    assert node.name == ""
    assert node.problem is not None
    assert "label" in node.problem


def test_node_labels_not_a_map() -> None:
    node = node_from_object({"metadata": {"name": "n", "labels": ["a"]}})
    assert node.problem == "gpu: node labels are not a map"


def test_node_non_string_label_values_are_ignored() -> None:
    obj = make_node("n", None, labels={LABEL_GPU_NUMBERS: 1, LABEL_CARDS: "card2"}, i915="1")
    assert node_from_object(obj).cards == ("card2",)


# ---------------------------------------------------------------- container requests


def test_container_requests_reads_gpu_resources_only() -> None:
    c = ctr(i915="1", memory_max="8Gi")
    c["resources"]["requests"]["cpu"] = "500m"
    c["resources"]["requests"]["memory"] = "1.5Gi"
    assert container_requests(c) == {I915: 1, MEM: 8 * GI}


def test_container_requests_limits_fill_in_requests() -> None:
    c = ctr(limits={"i915": "2", "millicores": "300"})
    assert container_requests(c) == {I915: 2, MILLI: 300}


def test_container_requests_requests_override_limits() -> None:
    c = ctr(limits={"i915": "2", "millicores": "300"}, i915="1")
    assert container_requests(c) == {I915: 1, MILLI: 300}


def test_container_requests_empty() -> None:
    assert container_requests({"name": "x"}) == {}
    assert container_requests({"name": "x", "resources": None}) == {}


def test_container_requests_fractional_is_spec_error() -> None:
    with pytest.raises(
        SpecError,
        match=re.escape(
            "gpu: container 'worker' gpu.intel.com/millicores: quantity '0.5' is not a whole number"
        ),
    ):
        container_requests(ctr("worker", i915="1", millicores="0.5"))


@pytest.mark.parametrize("quantity", ["-1", "1e400", "lots", 2.0, True])
def test_container_requests_bad_quantity_is_spec_error(quantity: Any) -> None:
    with pytest.raises(
        SpecError, match=re.escape("gpu: container 'c' gpu.intel.com/memory.max: quantity")
    ):
        container_requests(ctr("c", i915="1", memory_max=quantity))


@pytest.mark.parametrize(
    ("requests", "count"),
    [
        ({}, 0),
        ({I915: 0}, 0),
        ({I915: 3}, 3),
        ({XE: 2}, 2),
        ({XE: 2, I915: 5}, 2),
        ({XE: 0, I915: 4}, 4),
        ({MILLI: 100}, 0),
    ],
)
def test_gpu_count(requests: dict[str, int], count: int) -> None:
    assert gpu_count(requests) == count


# ---------------------------------------------------------------- pod_request


def test_pod_request_single_container() -> None:
    request = pod_request(make_pod("p", ctr("main", i915="1", memory_max="5G")))
    assert request == PodRequest((ContainerNeed("main", 1, {I915: 1, MEM: 5_000_000_000}),))
    assert request.needs_gpu


def test_pod_request_multiple_containers_in_spec_order() -> None:
    request = pod_request(
        make_pod(
            "p",
            ctr("a", i915="2", millicores="1000"),
            ctr("sidecar"),
            ctr("b", xe="1", i915="3"),
        )
    )
    assert request.containers == (
        ContainerNeed("a", 2, {I915: 2, MILLI: 1000}),
        ContainerNeed("sidecar", 0, {}),
        ContainerNeed("b", 1, {XE: 1, I915: 3}),
    )


def test_pod_request_zero_i915_needs_no_gpu() -> None:
    request = pod_request(make_pod("p", ctr("a", i915="0", memory_max="1G")))
    assert request.containers == (ContainerNeed("a", 0, {I915: 0, MEM: 1_000_000_000}),)
    assert not request.needs_gpu


def test_pod_request_without_gpu() -> None:
    request = pod_request(make_pod("p", ctr("a")))
    assert request.containers == (ContainerNeed("a", 0, {}),)
    assert not request.needs_gpu


def test_pod_request_fractional_is_spec_error() -> None:
    with pytest.raises(
        SpecError, match=re.escape("gpu: container 'a' gpu.intel.com/i915: quantity '1.5'")
    ):
        pod_request(make_pod("p", ctr("a", i915="1.5")))


def test_pod_request_init_container_gpu_is_spec_error() -> None:
    pod = make_pod(
        "p",
        ctr("app"),
        init_containers=[ctr("setup", i915="1")],
    )
    with pytest.raises(SpecError) as caught:
        pod_request(pod)
    assert str(caught.value) == (
        "gpu: init container 'setup' requests GPU resources, which gas cannot annotate; "
        "request them in an app container"
    )


def test_pod_request_init_container_gpu_limits_only_is_spec_error() -> None:
    pod = make_pod("p", ctr("app", i915="1"), init_containers=[ctr("warm", limits={"i915": "1"})])
    with pytest.raises(SpecError, match="init container 'warm'"):
        pod_request(pod)


def test_pod_request_init_container_without_gpu_is_fine() -> None:
    pod = make_pod(
        "p",
        ctr("app", i915="1"),
        init_containers=[ctr("setup", i915="0"), {"name": "plain"}],
    )
    assert pod_request(pod).containers == (ContainerNeed("app", 1, {I915: 1}),)


@pytest.mark.parametrize("containers", [None, [], "x", {}])
def test_pod_request_no_containers(containers: Any) -> None:
    with pytest.raises(SpecError, match="pod has no containers"):
        pod_request({"spec": {"containers": containers}})


def test_pod_request_too_many_gpus() -> None:
    with pytest.raises(SpecError, match="container 'big' asks for 65 GPUs"):
        pod_request(make_pod("p", ctr("big", i915="65")))
    assert pod_request(make_pod("p", ctr("ok", i915="64"))).containers[0].gpus == 64


def test_pod_request_unnamed_container() -> None:
    request = pod_request({"spec": {"containers": [{"resources": {"requests": {I915: "1"}}}]}})
    assert request.containers == (ContainerNeed("?", 1, {I915: 1}),)


# ---------------------------------------------------------------- per-card need


@pytest.mark.parametrize(
    ("gpus", "requests", "cards", "expected"),
    [
        (1, {I915: 1, MEM: 5}, None, {I915: 1, MEM: 5}),
        (2, {I915: 2, MILLI: 1001, TILES: 2}, None, {I915: 1, MILLI: 501, TILES: 1}),
        (3, {I915: 3, MEM: 10}, None, {I915: 1, MEM: 4}),
        (2, {I915: 2, MEM: 9}, None, {I915: 1, MEM: 5}),
        (4, {I915: 4, MEM: 8}, None, {I915: 1, MEM: 2}),
        (0, {MILLI: 7}, None, {MILLI: 7}),
        (2, {XE: 2, I915: 1}, None, {XE: 1, I915: 1}),
        (2, {I915: 2, MEM: 9}, 1, {I915: 2, MEM: 9}),
        (2, {I915: 2, MEM: 9}, 3, {I915: 1, MEM: 3}),
        (2, {I915: 2, MEM: 0}, None, {I915: 1, MEM: 0}),
    ],
)
def test_per_card_rounds_up(
    gpus: int, requests: dict[str, int], cards: int | None, expected: dict[str, int]
) -> None:
    assert ContainerNeed("c", gpus, requests).per_card(cards) == expected


@MODEST
@given(st.integers(min_value=1, max_value=64), st.integers(min_value=0, max_value=2**63 - 1))
def test_per_card_covers_the_request(gpus: int, amount: int) -> None:
    per = ContainerNeed("c", gpus, {MEM: amount}).per_card()[MEM]
    assert per * gpus >= amount
    assert (per - 1) * gpus < amount or per == 0


# ---------------------------------------------------------------- annotation format


@pytest.mark.parametrize(
    ("allocation", "text"),
    [
        ((("card0",),), "card0"),
        ((("card0", "card1"),), "card0,card1"),
        ((("card0",), ("card0",)), "card0|card0"),
        ((("card0", "card1"), ("card2",)), "card0,card1|card2"),
        (((), ("card3",)), "|card3"),
        (((),), ""),
        (((), ()), "|"),
    ],
)
def test_format_and_parse_cards(allocation: tuple[tuple[str, ...], ...], text: str) -> None:
    assert format_cards(allocation) == text
    assert parse_cards(text, len(allocation)) == allocation


@pytest.mark.parametrize(
    ("text", "containers", "words"),
    [
        ("card0|card1", 1, "has 2 segments for 1 containers"),
        ("card0", 2, "has 1 segments for 2 containers"),
        ("", 2, "has 1 segments for 2 containers"),
        ("gpu0", 1, "segment 'gpu0' is malformed"),
        ("card0,", 1, "is malformed"),
        ("card0, card1", 1, "is malformed"),
        ("card01", 1, "is malformed"),
        ("card0,card0", 1, "segment 'card0,card0' repeats a card"),
        ("card1|card1,card2,card1", 2, "repeats a card"),
    ],
)
def test_parse_cards_rejects(text: str, containers: int, words: str) -> None:
    with pytest.raises(SpecError, match=re.escape(words)):
        parse_cards(text, containers)


def test_parse_cards_keeps_annotation_order() -> None:
    assert parse_cards("card10,card2", 1) == (("card10", "card2"),)


CARD = st.integers(min_value=0, max_value=300).map(lambda n: f"card{n}")
ALLOCATION = st.lists(
    st.lists(CARD, unique=True, max_size=4).map(tuple), min_size=1, max_size=4
).map(tuple)


@MODEST
@given(ALLOCATION)
def test_parse_cards_inverts_format_cards(allocation: tuple[tuple[str, ...], ...]) -> None:
    assert parse_cards(format_cards(allocation), len(allocation)) == allocation


# ---------------------------------------------------------------- allocation usage


def test_allocation_usage_single_card() -> None:
    request = PodRequest((ContainerNeed("a", 1, {I915: 1, MEM: 5}),))
    assert allocation_usage(request, (("card1",),)) == {"card1": {I915: 1, MEM: 5}}


def test_allocation_usage_multi_gpu_container_rounds_up() -> None:
    request = PodRequest((ContainerNeed("a", 2, {I915: 2, MILLI: 1001}),))
    assert allocation_usage(request, (("card0", "card1"),)) == {
        "card0": {I915: 1, MILLI: 501},
        "card1": {I915: 1, MILLI: 501},
    }


def test_allocation_usage_containers_sharing_a_card_add_up() -> None:
    request = PodRequest(
        (
            ContainerNeed("a", 1, {I915: 1, TILES: 1}),
            ContainerNeed("b", 1, {I915: 1, TILES: 1}),
        )
    )
    assert allocation_usage(request, (("card0",), ("card0",))) == {"card0": {I915: 2, TILES: 2}}


def test_allocation_usage_skips_containers_without_cards() -> None:
    request = PodRequest((ContainerNeed("side", 0, {MILLI: 50}), ContainerNeed("a", 1, {I915: 1})))
    assert allocation_usage(request, ((), ("card2",))) == {"card2": {I915: 1}}


def test_allocation_usage_divides_by_cards_named() -> None:
    # An annotation written by someone else may name fewer cards than the GPU count.
    request = PodRequest((ContainerNeed("a", 2, {I915: 2, MEM: 10}),))
    assert allocation_usage(request, (("card0",),)) == {"card0": {I915: 2, MEM: 10}}


def test_allocation_usage_length_mismatch_raises() -> None:
    request = PodRequest((ContainerNeed("a", 1, {I915: 1}),))
    with pytest.raises(ValueError):
        allocation_usage(request, (("card0",), ("card1",)))
