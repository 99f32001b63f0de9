"""The summary of a captured graph, and the branch finder behind its `branches` line."""

from __future__ import annotations

import math

import torch
from torch import nn

from graphpipe.graph.branches import find_branches, max_branches
from graphpipe.graph.capture import capture
from graphpipe.graph.op_graph import OpGraph, OpNode
from graphpipe.graph.summary import summarize
from graphpipe.graph.tensor_meta import TensorMeta
from graphpipe.models import load_model


def graph_of(edges: dict[str, tuple[str, ...]]) -> OpGraph:
    """A hand-made graph: `edges` maps each op (in topological order) to its inputs."""
    meta = (TensorMeta(shape=(2, 4)),)
    ops = [OpNode(name=name, kind="placeholder" if not srcs else "output" if name == "out" else "call_function",
                  target=name, inputs=srcs, outputs=meta) for name, srcs in edges.items()]
    return OpGraph(name="hand", ops=tuple(ops), example_batch_size=2)


def test_chain_has_no_branches_even_with_skip_edges() -> None:
    graph = graph_of({"x": (), "a": ("x",), "b": ("a",), "c": ("a", "b"), "out": ("c",)})
    assert find_branches(graph) == () and max_branches(graph) == 1


def test_diamond_has_two_branches_between_fork_and_join() -> None:
    graph = graph_of({"x": (), "a": ("x",), "l1": ("a",), "l2": ("l1",), "r1": ("a",), "j": ("l2", "r1"),
                      "out": ("j",)})
    (region,) = find_branches(graph)
    assert (region.fork, region.join) == ("a", "j")
    assert region.chains == (("l1", "l2"), ("r1",))


def test_separate_inputs_start_separate_branches_and_nested_regions_are_found() -> None:
    graph = graph_of({"x": (), "y": (), "a": ("x",), "b": ("y",), "j": ("a", "b"), "p": ("j",), "q": ("j",),
                      "k": ("p", "q"), "out": ("k",)})
    regions = find_branches(graph)
    assert [(r.fork, r.join, r.num_branches) for r in regions] == [(None, "j", 2), ("j", "k", 2)]


def test_dead_ops_are_not_branches() -> None:
    graph = graph_of({"x": (), "a": ("x",), "unused": ("a",), "b": ("a",), "out": ("b",)})
    assert find_branches(graph) == ()


def test_summary_counts_ops_parameters_and_activations() -> None:
    model, inputs, _, _ = load_model("toy_branches", num_branches=3, num_layers=2, width=8, batch_size=4)
    summary = summarize(capture(model, inputs))
    ops = dict(summary.ops_by_type)
    assert ops["Linear"] == 3 * 2 + 1 and ops["ReLU"] == 6 and ops["placeholder"] == 3
    assert summary.num_params == sum(p.numel() for p in model.parameters())
    assert summary.param_bytes == 4 * summary.num_params and summary.buffer_bytes == 0
    assert summary.input_bytes_per_sample == 3 * 8 * 4
    # 6 Linear + 6 ReLU of width 8, the cat of 24 and the head of 8, float32
    assert summary.act_bytes_per_sample == 4 * (12 * 8 + 24 + 8)
    assert summary.max_branches == 3
    assert summary.to_dict()["branches"][0]["chain_lengths"] == [4, 4, 4]  # 2 x (Linear, ReLU); inputs are read


def test_summary_separates_buffers_from_parameters() -> None:
    model = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5))
    summary = summarize(capture(model, (torch.randn(4, 3),)))
    assert summary.num_params == 3 * 5 + 5 + 5 + 5
    assert summary.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())
    assert math.isclose(summary.act_bytes_per_sample, 2 * 5 * 4)
