"""The layering rule: the planning layers never import torch.distributed, and imports only go down."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "graphpipe"
LAYERS = ("graph", "cost", "stages", "planner", "schedule", "simulation", "runtime", "models", "cli")
PURE = ("graph", "cost", "stages", "planner", "schedule", "simulation")
# What each layer may import from graphpipe (besides itself and the shared top-level modules).
ALLOWED: dict[str, set[str]] = {
    "graph": set(),
    "cost": {"graph"},
    "stages": {"graph", "cost"},
    "planner": {"graph", "cost", "stages"},
    "schedule": {"graph", "cost", "stages"},  # the plan type, not the planner that makes plans
    "simulation": {"graph", "cost", "stages", "schedule"},
    "runtime": {"graph", "cost", "stages", "schedule", "models"},
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
    importlib.import_module("graphpipe.meta_weights")
    for name in ("capture", "profile", "analytic_costs", "plan", "simulate", "make_schedule", "load_model",
                 "empty_weights", "materialize", "choose_costs"):
        assert callable(getattr(gp, name)) and not isinstance(getattr(gp, name), type(gp)), name



def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` imports, anywhere in its source (TYPE_CHECKING blocks
    and function bodies too: a cycle through them is still a cycle in the design), absolute or relative.
    `from package import name` counts as importing the sub-module `package.name` when there is one."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join((package[:len(package) - node.level + 1] if node.level else [])
                            + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` where c is not a module: a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_planner_modules_import_no_cycle() -> None:
    """Inside graphpipe/planner/ (sub-packages included) the module imports form a DAG: each module can be
    read and changed knowing only the modules below it (the DP core `planner/sp_dp/` is ordered blocks ->
    tables -> size_tables -> need -> runs, fork_join -> probe -> search)."""
    paths = sorted((PACKAGE / "planner").rglob("*.py"))
    known = {_module_name(path) for path in paths}
    graph = {_module_name(path): _edges(path.read_text(), _module_name(path), path.name == "__init__.py", known)
             for path in paths}
    assert "graphpipe.planner.sp_dp.search" in graph["graphpipe.planner.sp_dp"]  # the graph has the real edges
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_sees_relative_and_type_checking_imports() -> None:
    """On made-up modules: a relative import under TYPE_CHECKING, and `from package import module`, are edges."""
    known = {"graphpipe.planner.x", "graphpipe.planner.y", "graphpipe.planner.sub", "graphpipe.planner.sub.z"}
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import f\n"
    assert _edges(source, "graphpipe.planner.y", False, known) == {"graphpipe.planner.x"}
    source = "from .. import y\nfrom . import z\nimport graphpipe.planner.x.f\n"
    assert _edges(source, "graphpipe.planner.sub", True, known) == {
        "graphpipe.planner.y", "graphpipe.planner.sub.z", "graphpipe.planner.x"}
    graph = {"graphpipe.planner.x": {"graphpipe.planner.y"}, "graphpipe.planner.y": {"graphpipe.planner.x"}}
    assert _find_cycle(graph) == ["graphpipe.planner.x", "graphpipe.planner.y", "graphpipe.planner.x"]
