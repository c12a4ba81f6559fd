"""The package layers and the direction of their imports (docs/development.md, "Layout").

Every import is counted, at any depth: a lazy import inside a function crosses a layer as
much as one at the top of a module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

GAS = Path(__file__).resolve().parents[2] / "gas"

# Layer -> the gas layers its modules may import (itself included).
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "kubeapi": {"core", "kubeapi"},
    "httpserver": {"httpserver"},
    "cluster": {"core", "kubeapi", "cluster"},
    "serving": {"core", "kubeapi", "httpserver", "cluster", "serving"},
    # What both node agents share: the cards and their discovery, the agents' flags, the
    # node's labels and the Kubernetes calls about the node itself.
    "host": {"core", "kubeapi", "host"},
    # The two node agents, one per way, never each other.
    "node": {"core", "kubeapi", "httpserver", "host", "node"},
    "dra": {"core", "kubeapi", "httpserver", "host", "dra"},
    "tools": {"core", "kubeapi", "httpserver", "cluster", "serving", "host", "tools"},
}
# Third-party packages each layer may use, where the layer is held to a list: the pure core
# none that does I/O; the API calls shared by the extender and the node agent only what
# both processes load anyway, and httptools, which the prepared requests (the extender's
# alone) read their answers with.
THIRD_PARTY = {"core": {"numpy"}, "kubeapi": {"kubernetes", "urllib3", "orjson", "httptools"}}


def _modules(layer: str) -> list[Path]:
    return sorted((GAS / layer).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == "gas":
                found |= {f"gas.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: relative import; gas uses absolute imports")
    return found


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "gas":
        return None
    return parts[1] if len(parts) > 1 else "gas"


def test_every_module_belongs_to_a_layer() -> None:
    top = {p.name for p in GAS.glob("*.py")}
    assert top == {"__init__.py", "cli.py"}
    assert {p.name for p in GAS.iterdir() if p.is_dir() and p.name != "__pycache__"} >= set(ALLOWED)


def _wrong_imports(layer: str, paths: list[Path]) -> list[str]:
    wrong = []
    for path in paths:
        for module in _imports(path):
            target = _layer_of(module)
            if target is not None and target not in ALLOWED[layer]:
                wrong.append(f"{path.name} imports {module}")
    return wrong


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_go_downwards_only(layer: str) -> None:
    wrong = _wrong_imports(layer, _modules(layer))
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("layer", sorted(THIRD_PARTY))
def test_third_party_imports_are_those_the_layer_may_use(layer: str) -> None:
    wrong = []
    for path in _modules(layer):
        for module in _imports(path):
            root = module.split(".")[0]
            if root in ("gas", "__future__") or root in sys.stdlib_module_names:
                continue
            if root not in THIRD_PARTY[layer]:
                wrong.append(f"{path.relative_to(GAS.parent)} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_no_module_is_named_like_a_standard_library_one() -> None:
    clash = [
        str(path.relative_to(GAS.parent))
        for path in GAS.rglob("*.py")
        if path.stem in sys.stdlib_module_names
        or (path.name == "__init__.py" and path.parent.name in sys.stdlib_module_names)
    ]
    assert not clash, clash


def test_the_check_sees_a_lazy_import_across_layers(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from gas.serving import tls\n    import gas.core.model\n")
    assert _wrong_imports("cluster", [bad]) == ["bad.py imports gas.serving"]
    assert _wrong_imports("tools", [bad]) == []


# Past these a module or function stops being something a reader takes in at once.
MODULE_LINES = 750
FUNCTION_LINES = 120


def _source_files() -> list[Path]:
    return [p for p in GAS.rglob("*.py") if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


def test_no_module_or_function_is_too_long_to_read() -> None:
    long = []
    for path in _source_files():
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            long.append(f"{path.relative_to(GAS.parent)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > FUNCTION_LINES:
                    long.append(f"{path.relative_to(GAS.parent)}:{node.lineno} {node.name}")
    assert not long, "\n".join(long)
