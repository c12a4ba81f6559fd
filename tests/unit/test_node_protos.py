"""The generated kubelet API modules are what scripts/gen-protos.sh makes of the .proto
files, and the protos keep the published wire names."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "gas" / "node" / "api"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    if not shutil.which("protoc-gen-mypy", path=os.path.dirname(sys.executable)):
        pytest.skip("mypy-protobuf is not installed beside this Python")
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-protos.sh"), str(tmp_path)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
    )
    protos = sorted(API.rglob("*.proto"))
    assert len(protos) == 2
    stale = []
    for proto in protos:
        for name in GENERATED:
            committed = proto.parent / name
            fresh = tmp_path / proto.parent.relative_to(ROOT) / name
            if not committed.exists() or not filecmp.cmp(committed, fresh, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
    assert not stale, f"regenerate with scripts/gen-protos.sh: {stale}"


def test_services_and_messages_have_the_published_names() -> None:
    from gas.node.api.deviceplugin.v1beta1 import api_pb2 as dp
    from gas.node.api.podresources.v1 import api_pb2 as pr

    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"
    plugin = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert [m.name for m in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    assert dp.DESCRIPTOR.services_by_name["Registration"].methods_by_name["Register"]
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]
    fields = {f.name: f.number for f in dp.ContainerPreferredAllocationRequest.DESCRIPTOR.fields}
    assert fields == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert {f.name: f.number for f in dp.Device.DESCRIPTOR.fields} == {
        "ID": 1,
        "health": 2,
        "topology": 3,
    }
    assert {f.name: f.number for f in pr.ContainerDevices.DESCRIPTOR.fields} == {
        "resource_name": 1,
        "device_ids": 2,
        "topology": 3,
    }
