#!/usr/bin/env bash
# Regenerate the Python modules of the kubelet APIs from their .proto files:
# *_pb2.py (messages), *_pb2_grpc.py (services) and their typed stubs (*.pyi, mypy-protobuf).
# Usage: scripts/gen-protos.sh [OUT_DIR]   (default: beside the .proto files)
# Needs grpcio-tools and mypy-protobuf at the versions the test extra of setup.py pins:
# the generated code names the grpcio-tools version, and the staleness test
# (tests/unit/test_node_protos.py) regenerates into a temporary directory and compares.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${1:-$ROOT}"
BIN="$(dirname "$PYTHON")"
PROTOS=(
  gas/node/api/deviceplugin/v1beta1/api.proto
  gas/node/api/podresources/v1/api.proto
  gas/dra/api/dra/v1/api.proto
  gas/dra/api/pluginregistration/v1/api.proto
  gas/dra/api/drahealth/v1/api.proto
  gas/dra/api/drahealth/v1alpha1/api.proto
)
mkdir -p "$OUT"
for proto in "${PROTOS[@]}"; do
  # -I. keeps the package path in the generated imports (gas.node.api...), so the modules
  # import each other absolutely and two files both named api.proto do not clash.
  "$PYTHON" -m grpc_tools.protoc -I. \
    --plugin=protoc-gen-mypy="$BIN/protoc-gen-mypy" \
    --plugin=protoc-gen-mypy_grpc="$BIN/protoc-gen-mypy_grpc" \
    --python_out="$OUT" --grpc_python_out="$OUT" \
    --mypy_out="$OUT" --mypy_grpc_out="$OUT" \
    "$proto"
done
