"""Hugging Face CLIP's two towers (2 layers, tiny, meta tensors) captured once per test process: the library model
whose attention blocks inside each tower the planner tests use (fork runs, merge-stage prefixes, skipped blocks)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from graphpipe.graph.op_graph import OpGraph

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@lru_cache(maxsize=1)
def clip_towers_graph() -> OpGraph:
    """The towers' op graph (an immutable value, shared by the tests that read it)."""
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model

    zoo = load_model(f"{EXAMPLES / 'clip_towers.py'}:factory", device="meta", layers=2)
    return capture(zoo.model, zoo.inputs)
