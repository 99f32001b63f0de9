"""Hugging Face Llama (2 layers, tiny, `examples/llama.py`) captured once per test process: a decoder whose layers
hold two-branch blocks with a join at op level (the MLP's gate and up projections, the rotary embedding's) with fork
runs into them."""

from __future__ import annotations

from functools import lru_cache

from graphpipe.graph.op_graph import OpGraph
from tests.planner.clip import EXAMPLES


@lru_cache(maxsize=1)
def llama_graph() -> OpGraph:
    """The decoder's op graph (an immutable value, shared by the tests that read it)."""
    from graphpipe.graph.capture import capture
    from graphpipe.models import load_model

    zoo = load_model(f"{EXAMPLES / 'llama.py'}:factory", device="meta", width=64, layers=2)
    return capture(zoo.model, zoo.inputs)
