"""Layer blocks (`graphpipe.graph.layers`): the repeated layers of the zoo and of BERT, for both capture
methods; the module stack in the graph file; fall-back to children or op level where a module is not a run
of one SP chain; the coarse units stay a valid DAG with no new non-SP core."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from graphpipe.graph.capture import capture
from graphpipe.graph.layers import LayerBlock, layer_blocks, layer_units
from graphpipe.graph.op_graph import OpGraph, OpNode
from graphpipe.graph.sp import merged_leaves, sp_decompose, stage_units
from graphpipe.models import load_model

LAYER = "graphpipe.models.layers.TransformerLayer"
SEQUENTIAL = "torch.nn.modules.container.Sequential"
LINEAR = "torch.nn.modules.linear.Linear"


def zoo_graph(name: str, method: str, **options: int) -> OpGraph:
    model, inputs, _, _ = load_model(name, "tiny", **options)
    return capture(model, inputs, name=name, capture=method)


def in_module(graph: OpGraph, path: str) -> set[str]:
    """The computing ops that ran inside module `path`."""
    return {op.name for op in graph.ops
            if not op.replicated and any(scope == path for scope, _ in op.module_stack)}


def computing(graph: OpGraph, block: LayerBlock) -> set[str]:
    return {op for op in block.ops if not graph.op(op).replicated}


def check_blocks_are_modules(graph: OpGraph, blocks: tuple[LayerBlock, ...]) -> None:
    for block in blocks:
        assert computing(graph, block) == in_module(graph, block.path)


def check_convex(graph: OpGraph, ops: set[str]) -> None:
    """No data path leaves `ops` and comes back."""
    outside_reach: set[str] = set()  # ops outside reached from the set
    for op in graph.ops:
        name = op.name
        fed = [src for src in graph.data_predecessors(name) if src in ops or src in outside_reach]
        if name not in ops and fed:
            outside_reach.add(name)
        if name in ops:
            assert not any(src in outside_reach for src in graph.data_predecessors(name)), f"{name} re-enters"


@pytest.mark.parametrize("method", ["fx", "export"])
def test_mmt_layer_blocks_are_exactly_its_layers(method: str) -> None:
    graph = zoo_graph("mmt", method)
    blocks = layer_blocks(graph)
    assert [block.path for block in blocks] == [f"branches.{b}.{k}" for b in range(4) for k in range(2)]
    assert {block.module_type for block in blocks} == {LAYER}
    check_blocks_are_modules(graph, blocks)


@pytest.mark.parametrize("method", ["fx", "export"])
def test_transformer_layer_blocks_are_exactly_its_layers(method: str) -> None:
    graph = zoo_graph("transformer", method)
    blocks = layer_blocks(graph)
    assert [block.path for block in blocks] == [f"layers.{k}" for k in range(4)]
    check_blocks_are_modules(graph, blocks)
    units = layer_units(graph)
    assert len(units.keys) == 4 + 4  # the layers, then mean, norm, fc and the output of the head


@pytest.mark.parametrize(("name", "prefix"), [("dlrm", "dense"), ("candle_uno", "branches")])
@pytest.mark.parametrize("method", ["fx", "export"])
def test_branch_mlps_are_cut_into_their_linear_layers(name: str, prefix: str, method: str) -> None:
    """A branch MLP is a plain stack: each Linear with the ReLU after it is one block."""
    graph = zoo_graph(name, method)
    blocks = layer_blocks(graph)
    assert [block.path for block in blocks] == [f"{prefix}.{b}.{2 * k}" for b in range(7) for k in range(4)]
    assert {block.module_type for block in blocks} == {LINEAR}
    for block in blocks:
        relu = block.path[:-1] + str(int(block.path[-1]) + 1)
        assert computing(graph, block) == in_module(graph, block.path) | in_module(graph, relu)


def test_bert_blocks_are_its_encoder_layers() -> None:
    pytest.importorskip("transformers")
    from tests.corpus.models import _bert

    model, inputs, _ = _bert()
    graph = capture(model, inputs, capture="export")
    blocks = layer_blocks(graph)
    assert [block.path for block in blocks] == ["encoder.layer.0", "encoder.layer.1"]
    assert blocks[0].module_type.endswith(".BertLayer")
    check_blocks_are_modules(graph, blocks)


@pytest.mark.parametrize(("name", "method"), [("mmt", "fx"), ("mmt", "export"), ("dlrm", "export"),
                                              ("candle_uno", "fx"), ("transformer", "export")])
def test_blocks_are_convex_and_keep_the_graph_series_parallel(name: str, method: str) -> None:
    graph = zoo_graph(name, method)
    units = stage_units(graph)
    for block in layer_blocks(graph, units):
        check_convex(graph, set(block.ops))
    coarse = layer_units(graph)
    assert sorted(op for ops in coarse.ops for op in ops) == sorted(graph.names)  # a partition of the graph
    old = {frozenset(leaf.ops) for leaf in merged_leaves(sp_decompose(graph, units))}
    new = merged_leaves(sp_decompose(graph, coarse))
    blocks = {block.keys[0]: block for block in layer_blocks(graph, units)}
    for leaf in new:  # a merged leaf is one block (with its riders), or was merged at op level already
        keys = set(leaf.ops) & set(coarse.keys)
        assert frozenset(leaf.ops) in old or (len(keys) == 1 and keys.pop() in blocks)


def test_graph_file_keeps_the_module_stack_and_old_files_load() -> None:
    graph = zoo_graph("transformer", "fx")
    fc1 = next(op for op in graph.ops if op.name == "layers_0_fc1")
    assert fc1.module_stack == (("layers", SEQUENTIAL), ("layers.0", LAYER),
                                ("layers.0.fc1", "torch.nn.modules.linear.Linear"))
    data = json.loads(json.dumps(graph.to_dict()))
    assert OpGraph.from_dict(data) == graph
    for op in data["ops"]:
        del op["module_stack"]
    old = OpGraph.from_dict(data)
    assert all(op.module_stack == () for op in old.ops)
    assert layer_blocks(old) == () and layer_units(old) == stage_units(old)  # no stacks: op level


def test_op_from_dict_defaults_the_stack() -> None:
    op = OpNode(name="x", kind="placeholder", target="x")
    data = op.to_dict()
    del data["module_stack"]
    assert OpNode.from_dict(data).module_stack == ()


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Pair(nn.Module):
    """One step of two branches at once: its ops sit in two parallel chains, so it is no run of one. Its
    halves are of two classes, so they are no layer candidates of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.right = Mlp()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.left(a), self.right(b)


class TwoBranches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pairs = nn.ModuleList(Pair() for _ in range(3))
        self.head = nn.Linear(16, 2)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        for pair in self.pairs:
            a, b = pair(a, b)
        return self.head(torch.cat([a, b], dim=-1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Mlp()
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x)) + x


class CalledTwice(nn.Module):
    """blocks.0 runs at the start and again at the end: two runs of the chain, so not one block."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](self.blocks[1](self.blocks[0](x)))


def test_a_module_across_branches_falls_back_to_its_children() -> None:
    graph = capture(TwoBranches(), (torch.randn(4, 8), torch.randn(4, 8)), capture="fx")
    blocks = layer_blocks(graph)
    assert [block.path for block in blocks] == [f"pairs.{k}.{side}" for k in range(3) for side in ("left", "right")]
    check_blocks_are_modules(graph, blocks)


def test_a_module_called_twice_falls_back_to_op_level() -> None:
    graph = capture(CalledTwice(), (torch.randn(4, 8),), capture="fx")
    blocks = layer_blocks(graph)
    # blocks.0's children are called twice too; its inner Mlp (two units per call) is no run either
    assert [block.path for block in blocks] == ["blocks.1"]
    check_blocks_are_modules(graph, blocks)


class Stacks(nn.Module):
    """Two plain stacks that open with a weight-free module, and two residual MLPs (not plain stacks)."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks = nn.ModuleList(nn.Sequential(nn.Dropout(0.0), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8),
                                                  nn.ReLU()) for _ in range(2))
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stack in self.stacks:
            x = stack(x)
        for block in self.blocks:
            x = block(x)
        return x


def test_a_plain_stack_is_cut_into_its_weighted_layers() -> None:
    graph = capture(Stacks(), (torch.randn(4, 8),), capture="fx")
    blocks = layer_blocks(graph)
    # the leading Dropout is one unit on its own; a Block runs an add in its own forward, so it stays whole
    assert [block.path for block in blocks] == ["stacks.0.1", "stacks.0.3", "stacks.1.1", "stacks.1.3",
                                                "blocks.0", "blocks.1"]
    assert computing(graph, blocks[0]) == in_module(graph, "stacks.0.1") | in_module(graph, "stacks.0.2")
    check_blocks_are_modules(graph, blocks[4:])
    coarse = layer_units(graph)
    assert sorted(op for ops in coarse.ops for op in ops) == sorted(graph.names)
