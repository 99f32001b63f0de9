"""Which ops every reading stage recomputes, which must share a stage, and what capture prunes."""

from __future__ import annotations

import torch
from torch import nn

from graphpipe.graph.capture import capture
from graphpipe.graph.colocation import colocation_groups
from graphpipe.graph.sp import SPParallel, sp_decompose, stage_units
from graphpipe.planner.stage_cost import tied_param_bytes


class Branches(nn.Module):
    """Two branches that read the input's size and an input mask, with a check and a dead shape read."""

    def __init__(self, check: bool = True) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.b = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(16, 2)
        self.check = check

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.check:
            torch._assert(x.shape[1] == 8, "x needs 8 features")
        batch, _ = x.shape
        scale = torch.ones(batch, 1) * 0.5  # made from a size: recomputed by every reader
        return self.head(torch.cat([self.a(x * scale), self.b(x * scale)], dim=1)).reshape(batch, -1)


def test_checks_and_dead_reads_are_pruned_and_sizes_are_replicated() -> None:
    graph = capture(Branches(), (torch.randn(4, 8),))
    assert not any(op.module_type in ("_assert", "eq") for op in graph.ops)
    sizes = [op for op in graph.ops if op.module_type in ("getattr", "getitem", "ones")]
    assert sizes and all(op.replicated for op in sizes)
    assert all(not op.is_tensor for op in graph.ops if op.module_type in ("getattr", "getitem"))


def test_a_check_does_not_merge_two_branches() -> None:
    """The issue's repro: two independent branches stay two branches with a torch._assert in front."""
    for check in (False, True):
        tree = sp_decompose(capture(Branches(check), (torch.randn(4, 8),)))
        (block,) = [item for item in tree.items if isinstance(item, SPParallel)]
        assert len(block.branches) == 2


def test_a_tuple_stays_with_its_readers_and_tied_weights_may_be_split() -> None:
    class TupleAndTied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.embed = nn.Embedding(10, 8)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            seq = self.embed(tokens)
            attended, _ = self.attn(seq, seq, seq)
            return attended.mean(1) @ self.embed.weight.t()

    graph = capture(TupleAndTied(), (torch.randint(0, 10, (4, 3)),))
    groups = [set(group) for group in colocation_groups(graph)]
    attn = next(op.name for op in graph.ops if op.module_type == "MultiheadAttention")
    getitem = next(name for name in graph.successors(attn))
    assert any({attn, getitem} <= group for group in groups)
    embed = next(op.name for op in graph.ops if op.module_type == "Embedding")
    assert not any(embed in group for group in groups)  # each stage that reads it holds a copy
    (tied,) = [p for p in graph.op(embed).params if p.shared_with]
    assert tied_param_bytes(graph) == {reader: tied.num_bytes for reader in tied.shared_with}
    units = stage_units(graph)
    assert sorted(op for unit in units.ops for op in unit) == sorted(graph.names)
