"""Capture of every zoo model: tiny presets on CPU, the paper presets on meta (no weights allocated)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from graphpipe.graph.branches import max_branches
from graphpipe.graph.capture import capture, trace_module
from graphpipe.graph.op_graph import OpGraph
from graphpipe.models import ZOO_NAMES, load_model

PAPER_MODELS = ("mmt", "dlrm", "candle_uno", "transformer", "two_branch")
# Parallel branches each model must show (tiny and paper presets alike).
BRANCHES = {"mmt": 4, "dlrm": 14, "candle_uno": 7, "transformer": 1, "two_branch": 2,
            "toy_chain": 1, "toy_diamond": 2, "toy_branches": 3}


def model_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def check_graph(graph: OpGraph, model: torch.nn.Module) -> None:
    names = [*dict(model.named_parameters()), *dict(model.named_buffers())]
    assert sorted(graph.param_names) == sorted(names)  # every one covered exactly once
    assert graph.param_bytes == model_bytes(model)
    assert OpGraph.from_dict(json.loads(json.dumps(graph.to_dict()))).to_dict() == graph.to_dict()
    assert graph.ops[-1].kind == "output"


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_tiny_zoo_model_captures_completely(name: str) -> None:
    model, inputs, _, _ = load_model(name, "tiny")
    graph = capture(model, inputs, name=name)
    check_graph(graph, model)
    assert len(graph.inputs) == len(inputs)
    assert graph.example_batch_size == inputs[0].shape[0]
    assert max_branches(graph) == BRANCHES[name]
    gm = trace_module(model)
    assert graph.names == tuple(node.name for node in gm.graph.nodes)
    with torch.no_grad():
        assert torch.allclose(gm(*inputs), model(*inputs))


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_paper_zoo_model_captures_on_meta(name: str) -> None:
    model, inputs, _, _ = load_model(name, "paper", device="meta")
    assert all(p.is_meta for p in model.parameters())
    graph = capture(model, inputs, name=name)
    check_graph(graph, model)
    assert max_branches(graph) == BRANCHES[name]
    assert graph.example_batch_size == 8


def test_paper_op_counts_follow_the_configuration() -> None:
    graph = capture(*load_model("mmt", "paper", device="meta")[:2])
    counts = Counter(op.module_type for op in graph)
    # 4 branches x 8 layers: attention, 2 Linear, 2 LayerNorm each; the head adds a LayerNorm and a Linear
    assert counts["MultiheadAttention"] == 32 and counts["Linear"] == 65 and counts["LayerNorm"] == 65
    linear = next(op for op in graph if op.module_type == "Linear")
    assert (linear.attrs["in_features"], linear.attrs["out_features"]) == (1024, 4096)
    assert linear.outputs[0].shape == (8, 256, 4096)
    counts = Counter(op.module_type for op in capture(*load_model("dlrm", "paper", device="meta")[:2]))
    assert counts["EmbeddingBag"] == 7 and counts["Linear"] == 7 * 4 + 3


def test_branch_count_and_depth_are_parameters() -> None:
    model, inputs, _, _ = load_model("mmt", "tiny", num_branches=3, num_layers=1)
    graph = capture(model, inputs)
    assert max_branches(graph) == 3
    assert sum(op.module_type == "MultiheadAttention" for op in graph) == 3
