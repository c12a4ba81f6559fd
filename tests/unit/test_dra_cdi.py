"""The CDI spec of a prepared claim: one device per card the claim holds, with the card's two
device nodes and the environment planned for it (tests/unit/test_dra_environment.py)."""

from __future__ import annotations

import json
import re

from gas.dra.cdi import claim_spec, qualified_name, spec_file_name
from gas.host.cards import Card

UID = "7d3b1c9e-0000-4000-8000-000000000001"
CDI_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$")


def card(number: int, tiles: int = 1, render: str | None = "auto") -> Card:
    node = f"renderD{128 + number}" if render == "auto" else render
    return Card(f"card{number}", number, "0x8086", 0, "", render_node=node, tiles=tiles)


def test_one_device_per_card_with_its_device_nodes() -> None:
    spec = claim_spec(UID, [(card(1), {})], "/dev")
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
    spec = claim_spec(UID, [(card(0), {})], "/host/dev/")
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["hostPath"] for n in nodes] == ["/host/dev/dri/card0", "/host/dev/dri/renderD128"]
    assert [n["path"] for n in nodes] == ["/dev/dri/card0", "/dev/dri/renderD128"]


def test_a_card_without_render_node_gives_the_card_node_only() -> None:
    spec = claim_spec(UID, [(card(0, render=None), {})], "/dev")
    assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/dri/card0"
    ]


def test_names_and_ids() -> None:
    assert spec_file_name(UID) == f"gpu.gas.intel.com-{UID}.json"
    assert qualified_name(UID, "card3") == f"gpu.gas.intel.com/gpu={UID}-card3"


def test_a_devices_environment_is_written_sorted_and_only_when_there_is_one() -> None:
    spec = claim_spec(UID, [(card(3), {"B": "2", "A": "1"}), (card(1), {})], "/dev")
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-card1", f"{UID}-card3"]
    assert "env" not in spec["devices"][0]["containerEdits"]
    assert spec["devices"][1]["containerEdits"]["env"] == ["A=1", "B=2"]
