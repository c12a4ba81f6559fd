"""What a claim's allocation asks of the node, and the prepared claims' records: results
of this driver only, the pool checked, cards the node lacks refused, tiles chosen apart,
and the state file's JSON read back as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gas.dra.claims import ClaimError, Result, check_devices, check_identity, results_for
from gas.dra.driver import DRIVER
from gas.dra.files import StateStore, write_json
from gas.dra.state import (
    PreparedClaim,
    PreparedDevice,
    StateError,
    decode,
    encode,
    pick_tiles,
    taken_tiles,
)


def claim(results: list[dict[str, Any]] | None, uid: str = "u1") -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "c", "namespace": "ns", "uid": uid}}
    if results is not None:
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def test_results_of_this_driver_and_pool() -> None:
    found = results_for(
        claim(
            [
                {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "card1"},
                {"request": "nic", "driver": "dra.net", "pool": "n1", "device": "eth0"},
                {
                    "request": "big/fast",
                    "driver": DRIVER,
                    "pool": "n1",
                    "device": "card0",
                    "shareID": "s-1",
                    "consumedCapacity": {"memory": "4Gi", "tiles": "2"},
                },
            ]
        ),
        "n1",
    )
    assert found == [
        Result("gpu", "n1", "card1", None, 0),
        Result("big/fast", "n1", "card0", "s-1", 2, memory=4 * 1024**3),
    ]
    assert found[1].base_request == "big"


def test_an_unallocated_claim_is_refused() -> None:
    with pytest.raises(ClaimError, match="ResourceClaim ns/c is not allocated"):
        results_for(claim(None), "n1")


def test_a_result_of_another_pool_is_refused() -> None:
    entry = {"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "card0"}
    with pytest.raises(ClaimError, match="allocated in pool 'n2', and this node's pool is 'n1'"):
        results_for(claim([entry]), "n1")


def test_unreadable_consumed_tiles_are_refused() -> None:
    entry = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": "card0",
        "consumedCapacity": {"tiles": "lots"},
    }
    with pytest.raises(ClaimError, match="consumed tiles 'lots'"):
        results_for(claim([entry]), "n1")


def test_a_claim_with_none_of_this_drivers_devices_asks_nothing() -> None:
    assert results_for(claim([{"driver": "other", "pool": "x", "device": "d"}]), "n1") == []


def test_a_card_the_node_lacks_is_refused_naming_it() -> None:
    with pytest.raises(ClaimError) as caught:
        check_devices([Result("gpu", "n1", "card7", None, 0)], {"card0", "card1"}, "n1", "C")
    assert str(caught.value) == (
        "C: request 'gpu' was allocated device 'card7', which node n1 does not have "
        "(its cards: card0, card1)"
    )


def test_a_replaced_claim_is_refused() -> None:
    check_identity(claim([], uid="u1"), "ns", "c", "u1")
    with pytest.raises(ClaimError, match="has UID u2, not u1: it was replaced"):
        check_identity(claim([], uid="u2"), "ns", "c", "u1")


def prepared(uid: str, *devices: PreparedDevice) -> PreparedClaim:
    return PreparedClaim(uid, "ns", uid, devices, {"cdiVersion": "0.6.0"})


def test_tiles_are_chosen_lowest_first_among_those_no_claim_holds() -> None:
    state = {
        "a": prepared("a", PreparedDevice("gpu", "n", "card0", "s1", "id", (0, 2))),
        "b": prepared("b", PreparedDevice("gpu", "n", "card1", "s2", "id", (1,))),
    }
    assert taken_tiles(state, "card0") == {0, 2}
    assert pick_tiles(4, taken_tiles(state, "card0"), 1) == (1,)
    assert pick_tiles(4, taken_tiles(state, "card0"), 2) == (1, 3)
    assert pick_tiles(4, taken_tiles(state, "card0"), 3) is None
    assert pick_tiles(2, set(), 2) == (0, 1)


def test_state_round_trips_through_json() -> None:
    state = {
        "a": prepared(
            "a",
            PreparedDevice("gpu", "n", "card0", "s1", "k=a-card0", (1,)),
            PreparedDevice("other", "n", "card0", None, "k=a-card0"),
        ),
        "b": PreparedClaim("b", "ns", "b", (), None),
    }
    text = json.dumps(encode(state))
    back = decode(json.loads(text))
    assert back == state
    assert back["a"].spec == {"cdiVersion": "0.6.0"}
    assert back["b"].spec is None


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {"format": 99, "claims": {}},
        {"format": 1, "claims": []},
        {"format": 1, "claims": {"a": {"namespace": "n"}}},
        {"format": 1, "claims": {"a": {"namespace": "n", "name": "a", "devices": [3]}}},
    ],
)
def test_a_malformed_state_is_an_error(raw: Any) -> None:
    with pytest.raises(StateError):
        decode(raw)


def test_state_store_saves_atomically_and_loads(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert store.load() == {}
    state = {"a": prepared("a", PreparedDevice("gpu", "n", "card0", "s", "id", ()))}
    store.save(state)
    assert store.load() == state
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["prepared-claims.json"]


def test_state_store_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "prepared-claims.json").write_text("{not json")
    with pytest.raises(StateError, match=r"prepared-claims\.json"):
        StateStore(tmp_path / "bad").load()
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        StateStore(tmp_path / "file").load()
    with pytest.raises(OSError):
        StateStore(tmp_path / "file").save({})


def test_write_json_leaves_no_temporary_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    with pytest.raises(TypeError):
        write_json(target, {"not json": object()})
    assert list(tmp_path.iterdir()) == []
