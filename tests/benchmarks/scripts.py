"""Load a benchmark script (a file, not a package module) so a smoke test can call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(relative: str, name: str) -> ModuleType:
    """`benchmarks/<relative>` as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
