"""The generated DRA kubelet API modules are what scripts/gen-protos.sh makes of the
.proto files, and the protos keep the published wire names and field numbers."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "gas" / "dra" / "api"
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
    assert len(protos) == 4
    stale = []
    for proto in protos:
        for name in GENERATED:
            committed = proto.parent / name
            fresh = tmp_path / proto.parent.relative_to(ROOT) / name
            if not committed.exists() or not filecmp.cmp(committed, fresh, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
    assert not stale, f"regenerate with scripts/gen-protos.sh: {stale}"


def fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_dra_plugin_wire_names() -> None:
    from gas.dra.api.dra.v1 import api_pb2 as dra

    assert dra.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    service = dra.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    assert fields(dra.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert dra.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert fields(dra.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert fields(dra.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert fields(dra.NodeUnprepareResourceResponse) == {"error": 1}


def test_registration_and_health_wire_names() -> None:
    from gas.dra.api.drahealth.v1 import api_pb2 as health
    from gas.dra.api.pluginregistration.v1 import api_pb2 as reg

    assert reg.DESCRIPTOR.package == "pluginregistration"
    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert [m.name for m in registration.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert fields(reg.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert fields(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    assert health.DESCRIPTOR.package == "v1"
    watch = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name[
        "NodeWatchResources"
    ]
    assert watch.server_streaming
    assert fields(health.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert dict(health.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_node_and_dra_modules_load_side_by_side() -> None:
    # podresources and dra-health are both proto package `v1`: their names must not clash.
    from gas.dra.api.drahealth.v1 import api_pb2 as health
    from gas.node.api.podresources.v1 import api_pb2 as pods

    assert health.DESCRIPTOR.package == pods.DESCRIPTOR.package == "v1"
