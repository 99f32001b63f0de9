"""Series-parallel decomposition: structure, coverage, order, and SP-ification of non-SP graphs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from graphpipe.graph.capture import capture
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import (
    SPChain,
    SPLeaf,
    SPParallel,
    decompose_dag,
    iter_chains,
    iter_parallels,
    merged_leaves,
    sp_decompose,
)


def flat(chain: SPChain) -> list[str]:
    return list(chain.ops)


def decompose(preds: Mapping[str, Sequence[str]]) -> SPChain:
    return decompose_dag(list(preds), preds)


def test_chain_is_one_chain_of_leaves() -> None:
    tree = decompose({"x": (), "a": ("x",), "b": ("a",), "out": ("b",)})
    assert all(isinstance(item, SPLeaf) for item in tree.items)
    assert flat(tree) == ["x", "a", "b", "out"]


def test_a_long_chain_and_long_branches_decompose() -> None:
    """A chain is joined one edge at a time into series nodes nested as deep as it is long: they are flattened
    without recursion (3,000 ops, well past Python's recursion limit), in order."""
    names = ["x", *(f"a{idx}" for idx in range(3000))]
    tree = decompose({name: (names[idx - 1],) if idx else () for idx, name in enumerate(names)})
    assert flat(tree) == names and all(isinstance(item, SPLeaf) for item in tree.items)
    branches = {"x": (), **{f"{side}{idx}": ((f"{side}{idx - 1}",) if idx else ("x",)) for side in "ab"
                            for idx in range(1500)}, "join": ("a1499", "b1499")}
    (block,) = decompose(branches).items[1:2]
    assert isinstance(block, SPParallel)
    assert [flat(branch) for branch in block.branches] == [[f"{side}{idx}" for idx in range(1500)] for side in "ab"]


def test_diamond_is_a_parallel_block_between_fork_and_join() -> None:
    tree = decompose({"x": (), "a": ("x",), "b": ("x",), "c": ("a", "b")})
    assert [type(item) for item in tree.items] == [SPLeaf, SPParallel, SPLeaf]
    par = tree.items[1]
    assert isinstance(par, SPParallel)
    assert [branch.ops for branch in par.branches] == [("a",), ("b",)] and not par.has_bypass


def test_several_inputs_get_a_virtual_source() -> None:
    tree = decompose({"u": (), "v": (), "a": ("u",), "b": ("v",), "cat": ("a", "b")})
    assert isinstance(tree.items[0], SPParallel)
    assert sorted(branch.ops for branch in tree.items[0].branches) == [("u", "a"), ("v", "b")]


def test_residual_edge_is_transitive_and_dropped() -> None:
    """x -> ln -> attn -> add(x, attn): the skip edge is implied by the path, so the skeleton is a chain."""
    tree = decompose({"x": (), "ln": ("x",), "attn": ("ln",), "add": ("x", "attn"), "out": ("add",)})
    assert all(isinstance(item, SPLeaf) for item in tree.items) and not merged_leaves(tree)


def test_fork_to_join_edge_is_transitive_not_an_empty_branch() -> None:
    tree = decompose({"x": (), "a": ("x",), "b": ("x",), "c": ("a", "b", "x")})
    par = tree.items[1]
    assert isinstance(par, SPParallel) and not par.has_bypass  # x -> c is implied by x -> a -> c
    tree = decompose({"x": (), "a": ("x",), "c": ("a", "x"), "d": ("c",)})
    assert not any(True for _ in iter_parallels(tree))


def test_dlrm_like_graph_becomes_sp_by_transitive_reduction() -> None:
    """The bottom MLP feeds both the interaction and the concat: SP once x -> cat is dropped."""
    preds = {"dense": (), "emb": (), "x": ("dense",), "inter": ("x", "emb"), "cat": ("x", "inter"), "top": ("cat",)}
    tree = decompose(preds)
    assert not merged_leaves(tree)
    assert sorted(flat(tree)) == sorted(preds)


def test_non_sp_graph_is_merged_into_one_leaf() -> None:
    """x->a, x->b, a->c, a->d, b->d, c,d->out (the N graph): its core shares one leaf, i.e. one stage."""
    preds = {"x": (), "a": ("x",), "b": ("x",), "c": ("a",), "d": ("a", "b"), "out": ("c", "d")}
    tree = decompose(preds)
    merged = merged_leaves(tree)
    assert len(merged) == 1 and set(merged[0].ops) == {"a", "b", "c", "d"}
    assert sorted(flat(tree)) == sorted(preds)


def test_an_input_only_branch_joining_inside_a_tower_shares_its_readers_leaf() -> None:
    """A vision tower whose aspect-ratio embedding (read from the inputs only) is added after its layers, beside
    a text tower: the closed region around the embedding would hold the whole vision tower; folding the
    embedding into the op that reads it keeps the towers parallel."""
    preds = {"pixels": (), "tokens": (), "ratio_embedding": (), "patches": ("pixels",), "layer": ("patches",),
             "intermediate": ("patches",), "add_ratio": ("layer", "ratio_embedding"),
             "cat": ("intermediate", "add_ratio"), "text": ("tokens",), "cross": ("cat", "text")}
    tree = decompose(preds)
    (merged,) = merged_leaves(tree)
    assert set(merged.ops) == {"ratio_embedding", "add_ratio"}
    towers = next(par for par in iter_parallels(tree) if len(par.branches) == 2 and "text" in flat(par.branches[1]))
    assert "pixels" in flat(towers.branches[0]) and "cross" not in flat(towers.branches[0])


def test_large_branchy_graph_is_decomposed() -> None:
    """16 branches of 64 ops (1000+ ops): one parallel block of 16 chains."""
    preds: dict[str, tuple[str, ...]] = {"x": ()}
    ends = []
    for br in range(16):
        prev = "x"
        for idx in range(64):
            preds[f"b{br}_{idx}"] = (prev,)
            prev = f"b{br}_{idx}"
        ends.append(prev)
    preds["cat"] = tuple(ends)
    tree = decompose(preds)
    (par,) = list(iter_parallels(tree))
    assert len(par.branches) == 16 and all(len(branch.items) == 64 for branch in par.branches)


@st.composite
def random_dags(draw: st.DrawFn) -> dict[str, tuple[str, ...]]:
    num = draw(st.integers(2, 12))
    preds: dict[str, tuple[str, ...]] = {"n0": ()}
    for idx in range(1, num):
        earlier = [f"n{j}" for j in range(idx)]
        chosen = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3, unique=True))
        preds[f"n{idx}"] = tuple(chosen)
    return preds


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_any_dag_is_covered_once_in_a_topological_order(preds: dict[str, tuple[str, ...]]) -> None:
    tree = decompose(preds)
    order = flat(tree)
    assert sorted(order) == sorted(preds)
    position = {name: idx for idx, name in enumerate(order)}
    assert all(position[src] < position[dst] for dst, srcs in preds.items() for src in srcs)


class _ReadsABuffer(nn.Module):
    """Two branches; the join scales by a buffer that fx reads with a get_attr node."""

    def __init__(self, readers: int) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(4, 4), nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))
        self.readers = readers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale  # one get_attr node, however many ops read it
        joined = (self.left(x) + self.right(x)) * scale
        return joined + scale if self.readers == 2 else joined


def test_a_buffer_read_by_one_op_rides_in_its_leaf() -> None:
    graph = capture(_ReadsABuffer(readers=1), (torch.randn(2, 4),))
    (buffer,) = [op.name for op in graph.ops if op.kind == "get_attr"]
    (reader,) = graph.successors(buffer)
    tree = sp_decompose(graph)
    assert sorted(tree.ops) == sorted(graph.names)
    assert [type(item) for item in tree.items] == [SPParallel, SPLeaf, SPLeaf, SPLeaf]  # x rides with its first reader
    (leaf,) = [item for item in tree.items if isinstance(item, SPLeaf) and buffer in item.ops]
    assert leaf.ops == (buffer, reader)  # no branch of its own from the virtual source
    assert all(len(branch.items) == 1 for par in iter_parallels(tree) for branch in par.branches)


def test_a_buffer_read_by_two_ops_rides_with_the_first() -> None:
    """fx reads a buffer once per use; a graph file may share one read between two ops. Every stage
    that reads it reads it itself, so it joins no branch and rides with its first reader."""
    captured = capture(_ReadsABuffer(readers=2), (torch.randn(2, 4),))
    first, second = [op.name for op in captured.ops if op.kind == "get_attr"]
    ops = tuple(replace(op, inputs=tuple(first if name == second else name for name in op.inputs))
                for op in captured.ops if op.name != second)
    graph = OpGraph(name="shared read", example_batch_size=2, ops=ops)
    assert len(graph.successors(first)) == 2
    tree = sp_decompose(graph)
    assert sorted(tree.ops) == sorted(graph.names)
    leaves = [item for chain in iter_chains(tree) for item in chain.items if isinstance(item, SPLeaf)]
    (host,) = [leaf for leaf in leaves if first in leaf.ops]
    assert min(graph.successors(first), key=graph.index) in host.ops
