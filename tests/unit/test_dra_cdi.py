"""The CDI spec of a prepared claim: one device per card the claim holds, the card's two
device nodes, and the tile mask only when the claim holds part of a card's tiles."""

from __future__ import annotations

import json
import re

from gas.dra.cdi import Grant, claim_spec, qualified_name, spec_file_name, tile_mask
from gas.node.cards import Card

UID = "7d3b1c9e-0000-4000-8000-000000000001"
CDI_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$")


def card(number: int, tiles: int = 1, render: str | None = "auto") -> Card:
    node = f"renderD{128 + number}" if render == "auto" else render
    return Card(f"card{number}", number, "0x8086", 0, "", render_node=node, tiles=tiles)


def test_one_device_per_card_with_its_device_nodes() -> None:
    spec = claim_spec(UID, [Grant(card(1))], "/dev")
    assert spec == {
        "cdiVersion": "0.6.0",
        "kind": "gpu.gas.intel.com/gpu",
        "devices": [
            {
                "name": f"{UID}-card1",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": "/dev/dri/card1",
                            "hostPath": "/dev/dri/card1",
                            "permissions": "rw",
                        },
                        {
                            "path": "/dev/dri/renderD129",
                            "hostPath": "/dev/dri/renderD129",
                            "permissions": "rw",
                        },
                    ]
                },
            }
        ],
    }
    assert json.loads(json.dumps(spec)) == spec
    assert CDI_NAME.match(spec["devices"][0]["name"])


def test_host_paths_follow_the_devfs_root() -> None:
    spec = claim_spec(UID, [Grant(card(0))], "/host/dev/")
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["hostPath"] for n in nodes] == ["/host/dev/dri/card0", "/host/dev/dri/renderD128"]
    assert [n["path"] for n in nodes] == ["/dev/dri/card0", "/dev/dri/renderD128"]


def test_a_card_without_render_node_gives_the_card_node_only() -> None:
    spec = claim_spec(UID, [Grant(card(0, render=None))], "/dev")
    assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/dri/card0"
    ]


def test_names_and_ids() -> None:
    assert spec_file_name(UID) == f"gpu.gas.intel.com-{UID}.json"
    assert qualified_name(UID, "card3") == f"gpu.gas.intel.com/gpu={UID}-card3"


def test_no_mask_for_whole_cards_or_single_tile_cards() -> None:
    assert tile_mask([Grant(card(0, tiles=2))]) is None
    assert tile_mask([Grant(card(0, tiles=1), (0,))]) is None
    assert tile_mask([Grant(card(0, tiles=2), (0, 1))]) is None
    spec = claim_spec(UID, [Grant(card(0, tiles=2))], "/dev")
    assert "env" not in spec["devices"][0]["containerEdits"]


def test_mask_of_some_tiles_of_a_card() -> None:
    assert tile_mask([Grant(card(0, tiles=2), (1,))]) == "1"
    assert tile_mask([Grant(card(5, tiles=4), (1, 2))]) == "1,2"
    spec = claim_spec(UID, [Grant(card(0, tiles=2), (1,))], "/dev")
    assert spec["devices"][0]["containerEdits"]["env"] == ["ZE_AFFINITY_MASK=1"]


def test_mask_over_several_cards_counts_the_tiles_of_the_cards_before() -> None:
    grants = [Grant(card(3, tiles=2), (1,)), Grant(card(1, tiles=2))]
    # card1 comes first (numeric order), whole: tiles 0 and 1; card3's tile 1 is 2+1.
    assert tile_mask(grants) == "0,1,3"
    spec = claim_spec(UID, grants, "/dev")
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-card1", f"{UID}-card3"]
    assert all(d["containerEdits"]["env"] == ["ZE_AFFINITY_MASK=0,1,3"] for d in spec["devices"])


def test_a_card_held_twice_by_one_claim_is_one_device() -> None:
    spec = claim_spec(UID, [Grant(card(0, tiles=4), (0,)), Grant(card(0, tiles=4), (2,))], "/dev")
    assert len(spec["devices"]) == 1
    assert spec["devices"][0]["containerEdits"]["env"] == ["ZE_AFFINITY_MASK=0,2"]
    whole = claim_spec(UID, [Grant(card(0, tiles=4), (0,)), Grant(card(0, tiles=4))], "/dev")
    assert "env" not in whole["devices"][0]["containerEdits"]
