"""The layering rule: the planning layers never import torch.distributed, and imports only go down."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "graphpipe"
LAYERS = ("graph", "cost", "planner", "schedule", "simulation", "runtime", "models", "cli")
PURE = ("graph", "cost", "planner", "schedule", "simulation")
# What each layer may import from graphpipe (besides itself and the shared top-level modules).
ALLOWED: dict[str, set[str]] = {
    "graph": set(),
    "cost": {"graph"},
    "planner": {"graph", "cost"},
    "schedule": {"graph", "cost", "planner"},
    "simulation": {"graph", "cost", "planner", "schedule"},
    "runtime": {"graph", "cost", "planner", "schedule", "models"},
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


def test_public_functions_are_not_shadowed_by_subpackages() -> None:
    """Importing every sub-package must leave `gp.plan`, `gp.simulate`, ... callable functions."""
    import importlib

    import graphpipe as gp

    for layer in LAYERS:
        importlib.import_module(f"graphpipe.{layer}")
    for name in ("capture", "profile", "analytic_costs", "plan", "simulate", "make_schedule", "load_model"):
        assert callable(getattr(gp, name)) and not isinstance(getattr(gp, name), type(gp)), name
