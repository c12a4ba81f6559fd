"""How each card is published given its state and the node's labels: cards labelled
exclusive published whole (no sharing, no request policies) unless claims share them now,
malformed labels ignored with a note, an unfit card tainted with its reason and the effect
asked for; the taint's time carried over from the stored slice, and neither that time nor
a quantity's spelling counted as a change, and taints the API server dropped named."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gas.core.dra_claims import LABEL_EXCLUSIVE_CARDS, UNHEALTHY_TAINT, exclusive_cards
from gas.core.model import LABEL_XE_LINKS, SpecError
from gas.dra.slices import (
    CardState,
    PciFacts,
    Published,
    device,
    devices_differ,
    dropped_fields,
    keep_taint_times,
    plain,
    published,
    slice_spec,
)
from tests.unit.test_dra_slices import card, device_problems, policy_problems

T1 = "2030-01-01T00:00:00Z"


def states(*numbers: int, **kw: Any) -> list[CardState]:
    return [CardState(card(n), **kw) for n in numbers]


def by_name(found: list[Published]) -> dict[str, Published]:
    return {p.card.name: p for p in found}


def tainted_spec(effect: str = "NoExecute", **reasons: str) -> dict[str, Any]:
    """A slice of card0..card2, each card named in `reasons` unfit for that reason."""
    cards = [
        CardState(card(n), healthy=f"card{n}" not in reasons, reason=reasons.get(f"card{n}", ""))
        for n in range(3)
    ]
    found, _ = published(cards, {}, {})
    return slice_spec("n", found, 1, effect)


def stamped(spec: dict[str, Any], name: str, stamp: str) -> dict[str, Any]:
    """`spec` as the API server stores it: the taints of `name` stamped `stamp`."""
    stored = copy.deepcopy(spec)
    for entry in stored["devices"]:
        if entry["name"] == name:
            for taint in entry["taints"]:
                taint["timeAdded"] = stamp
    return stored


# ------------------------------------------------------------------ published()


def test_without_labels_every_card_is_shareable_untainted_and_without_notes() -> None:
    found, notes = published(states(0, 1), {"card1": PciFacts("0x56c0")}, {})
    assert notes == []
    assert [(p.card.name, p.shareable, p.taint, p.xe_link_group) for p in found] == [
        ("card0", True, "", None),
        ("card1", True, "", None),
    ]
    assert found[1].facts == PciFacts("0x56c0")
    assert found[0].facts == PciFacts()


def test_cards_labelled_exclusive_are_published_whole() -> None:
    found, notes = published(states(0, 1, 2), {}, {LABEL_EXCLUSIVE_CARDS: "card0.card2"})
    assert notes == []
    assert {name: p.shareable for name, p in by_name(found).items()} == {
        "card0": False,
        "card1": True,
        "card2": False,
    }


def test_a_card_labelled_exclusive_that_claims_share_now_stays_shareable_with_a_note() -> None:
    cards = [CardState(card(0), shared=True), CardState(card(1)), CardState(card(2), shared=True)]
    found, notes = published(cards, {}, {LABEL_EXCLUSIVE_CARDS: "card0.card1"})
    assert {name: p.shareable for name, p in by_name(found).items()} == {
        "card0": True,  # shared now: kept shareable until its claims are gone
        "card1": False,
        "card2": True,  # shared, but not labelled: nothing to say
    }
    assert len(notes) == 1
    assert "card0" in notes[0] and "share it now" in notes[0]


@pytest.mark.parametrize("value", ["card0.gpu1", "0.1", "card0..card1", "card0,card1"])
def test_a_malformed_exclusive_label_publishes_every_card_shareable_with_a_note(
    value: str,
) -> None:
    found, notes = published(states(0, 1), {}, {LABEL_EXCLUSIVE_CARDS: value})
    assert all(p.shareable for p in found)
    assert len(notes) == 1
    assert notes[0].startswith("every card published shareable")
    assert LABEL_EXCLUSIVE_CARDS in notes[0]


def test_a_malformed_xe_links_label_publishes_no_groups_with_a_note() -> None:
    labels = {LABEL_XE_LINKS: "0-1", LABEL_EXCLUSIVE_CARDS: "card1"}
    found, notes = published(states(0, 1), {}, labels)
    assert [p.xe_link_group for p in found] == [None, None]
    assert len(notes) == 1 and notes[0].startswith("no Xe Link groups published")
    # The other label still applies.
    assert [p.shareable for p in found] == [True, False]


def test_an_unfit_card_is_tainted_with_its_reason() -> None:
    cards = [
        CardState(card(0)),
        CardState(card(1), healthy=False, reason="Unbound"),
        CardState(card(2), healthy=False),
    ]
    found, notes = published(cards, {}, {})
    assert notes == []
    assert [p.taint for p in found] == ["", "Unbound", "Unhealthy"]
    # A taint does not take the card's sharing away.
    assert all(p.shareable for p in found)


# ------------------------------------------------------------------ device()


def test_a_card_kept_whole_has_no_sharing_and_no_request_policies() -> None:
    whole = device(card(0, tiles=2), PciFacts("0x56c0"), shareable=False)
    shared = device(card(0, tiles=2), PciFacts("0x56c0"))
    assert "allowMultipleAllocations" not in whole
    assert all("requestPolicy" not in c for c in whole["capacity"].values())
    # The same amounts, and attributes, as the card published shareable.
    assert whole["capacity"] == {
        name: {"value": c["value"]} for name, c in shared["capacity"].items()
    }
    assert whole["attributes"] == shared["attributes"]
    assert "taints" not in whole
    for name, capacity in whole["capacity"].items():
        assert policy_problems(name, capacity) == []


def test_a_card_kept_whole_passes_the_api_validation() -> None:
    whole = device(card(0, tiles=2), PciFacts("0x56c0"), shareable=False)
    assert device_problems(whole) == []


@pytest.mark.parametrize("effect", ["NoExecute", "NoSchedule"])
def test_a_taint_carries_the_effect_given(effect: str) -> None:
    entry = device(card(0), PciFacts(), taint="Vanished", effect=effect)
    assert entry["taints"] == [{"key": UNHEALTHY_TAINT, "value": "Vanished", "effect": effect}]
    spec = tainted_spec(effect, card1="Wedged")
    assert [d.get("taints") for d in spec["devices"]] == [
        None,
        [{"key": UNHEALTHY_TAINT, "value": "Wedged", "effect": effect}],
        None,
    ]


def test_an_exclusive_tainted_card_in_the_slice() -> None:
    cards = [CardState(card(0), healthy=False, reason="Critical"), CardState(card(1))]
    found, _ = published(cards, {}, {LABEL_EXCLUSIVE_CARDS: "card0"})
    card0, card1 = slice_spec("n", found, 1, "NoSchedule")["devices"]
    assert "allowMultipleAllocations" not in card0
    assert card0["taints"] == [
        {"key": UNHEALTHY_TAINT, "value": "Critical", "effect": "NoSchedule"}
    ]
    assert card1["allowMultipleAllocations"] is True and "taints" not in card1


# ------------------------------------------------------------------ the stored slice


def test_the_time_a_taint_was_added_is_carried_over() -> None:
    stored = stamped(tainted_spec(card1="Unbound"), "card1", T1)
    # card1 is now Vanished (same key and effect), card2 newly unfit.
    desired = tainted_spec(card1="Vanished", card2="Wedged")
    keep_taint_times(desired, stored)
    taints = {d["name"]: d.get("taints") for d in desired["devices"]}
    assert taints["card0"] is None
    assert taints["card1"] == [
        {"key": UNHEALTHY_TAINT, "value": "Vanished", "effect": "NoExecute", "timeAdded": T1}
    ]
    assert taints["card2"] == [{"key": UNHEALTHY_TAINT, "value": "Wedged", "effect": "NoExecute"}]


def test_a_taint_of_another_effect_does_not_take_the_old_time() -> None:
    stored = stamped(tainted_spec("NoSchedule", card1="Unbound"), "card1", T1)
    desired = tainted_spec("NoExecute", card1="Unbound")
    keep_taint_times(desired, stored)
    assert "timeAdded" not in desired["devices"][1]["taints"][0]


def test_the_time_a_taint_was_added_is_no_change() -> None:
    desired = tainted_spec(card1="Unbound")
    stored = stamped(desired, "card1", T1)
    assert not devices_differ(stored, desired)
    assert not devices_differ(desired, stored)
    # Another reason, another effect, or no taint is a change.
    assert devices_differ(stamped(tainted_spec(card1="Vanished"), "card1", T1), desired)
    assert devices_differ(
        stamped(tainted_spec("NoSchedule", card1="Unbound"), "card1", T1), desired
    )
    assert devices_differ(tainted_spec(), desired)


def test_a_card_made_whole_is_a_change() -> None:
    found, _ = published(states(0, 1), {}, {LABEL_EXCLUSIVE_CARDS: "card1"})
    assert devices_differ(
        slice_spec("n", plain([card(0), card(1)], {}), 1), slice_spec("n", found, 1)
    )


def test_taints_the_api_server_dropped_are_named() -> None:
    sent = tainted_spec(card1="Unbound", card2="Wedged")
    assert dropped_fields(sent, stamped(sent, "card1", T1)) == []
    stripped = copy.deepcopy(sent)
    del stripped["devices"][2]["taints"]
    assert dropped_fields(sent, stripped) == ["card2: taints"]


def test_a_whole_card_stored_as_sent_drops_nothing() -> None:
    found, _ = published(states(0), {}, {LABEL_EXCLUSIVE_CARDS: "card0"})
    sent = slice_spec("n", found, 1)
    assert dropped_fields(sent, copy.deepcopy(sent)) == []


# ------------------------------------------------------------------ exclusive_cards()


def test_exclusive_cards_read_from_the_label_and_its_continuations() -> None:
    assert exclusive_cards({}) == frozenset()
    assert exclusive_cards({LABEL_EXCLUSIVE_CARDS: ""}) == frozenset()
    assert exclusive_cards({LABEL_EXCLUSIVE_CARDS: "card0.card12"}) == {"card0", "card12"}
    labels = {
        LABEL_EXCLUSIVE_CARDS: "card0.card1",
        LABEL_EXCLUSIVE_CARDS + "2": "Z.card2.card3",
        LABEL_EXCLUSIVE_CARDS + "3": "Z.card4",
    }
    assert exclusive_cards(labels) == {"card0", "card1", "card2", "card3", "card4"}
    # A continuation may split a name, as the labelling tools cut at a length.
    split = {LABEL_EXCLUSIVE_CARDS: "card0.ca", LABEL_EXCLUSIVE_CARDS + "2": "Zrd7"}
    assert exclusive_cards(split) == {"card0", "card7"}


@pytest.mark.parametrize(
    "labels",
    [
        {LABEL_EXCLUSIVE_CARDS: "card0", LABEL_EXCLUSIVE_CARDS + "2": ".card1"},
        {LABEL_EXCLUSIVE_CARDS: "card0", LABEL_EXCLUSIVE_CARDS + "2": ""},
        {LABEL_EXCLUSIVE_CARDS: "card0.card01"},
        {LABEL_EXCLUSIVE_CARDS: "card0."},
        {LABEL_EXCLUSIVE_CARDS: ".".join(f"card{n}" for n in range(257))},
    ],
)
def test_a_malformed_exclusive_label_is_an_error(labels: dict[str, str]) -> None:
    with pytest.raises(SpecError):
        exclusive_cards(labels)


def test_continuations_after_a_gap_are_not_read() -> None:
    labels = {LABEL_EXCLUSIVE_CARDS: "card0", LABEL_EXCLUSIVE_CARDS + "3": "Z.card1"}
    assert exclusive_cards(labels) == {"card0"}


def test_the_exclusive_label_of_an_unknown_card_names_no_published_card() -> None:
    found, notes = published(states(0), {}, {LABEL_EXCLUSIVE_CARDS: "card5"})
    assert notes == []
    assert [p.shareable for p in found] == [True]
