"""The layering rule: the planning layers never import torch.distributed, and imports only go down."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "graphpipe"
LAYERS = ("graph", "cost", "plan", "schedule", "simulate", "runtime", "models", "cli")
PURE = ("graph", "cost", "plan", "schedule", "simulate")
# What each layer may import from graphpipe (besides itself and the shared top-level modules).
ALLOWED: dict[str, set[str]] = {
    "graph": set(),
    "cost": {"graph"},
    "plan": {"graph", "cost"},
    "schedule": {"graph", "cost", "plan"},
    "simulate": {"graph", "cost", "plan", "schedule"},
    "runtime": {"graph", "cost", "plan", "schedule", "models"},
    "models": set(),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", PURE)
def test_pure_layers_never_import_torch_distributed(layer: str) -> None:
    for path in _files(layer):
        bad = {name for name in _imports(path) if name.startswith("torch.distributed")}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_only_go_down(layer: str) -> None:
    for path in _files(layer):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "graphpipe" or len(parts) < 2 or parts[1] not in LAYERS or parts[1] == layer:
                continue
            assert parts[1] in ALLOWED[layer], f"{path.relative_to(PACKAGE)} imports {name}: {layer} may not"
