"""In-place writes the data edges do not show: a mask filled in place is filled by every stage that makes it,
and a write to an activation shares a stage with every later reader of that activation."""

from __future__ import annotations

import torch
from torch import nn

from graphpipe.graph.capture import capture
from graphpipe.graph.colocation import colocation_groups
from graphpipe.graph.mutation import alias_chain
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.replication import op_changes


class FilledMask(nn.Module):
    """A mask made from the batch size and filled in place, read by two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(x)
        mask[:, 2:] = 0
        return self.b(torch.tanh(self.a(x)) * mask) * mask


class MaskFromActivation(nn.Module):
    """A mask made from the inputs, filled from an activation, then summed: the sum depends on the activation."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(x)
        mask[:, 0] = self.a(x)[:, 0]
        return self.b(x) * mask.sum(1, keepdim=True)


class WritesActivation(nn.Module):
    """An activation read by a branch, then written in place and read again."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        t = self.c(torch.tanh(h))
        h[:, 0] = 0
        return self.b(h) + t


def test_a_mask_filled_in_place_is_replicated_with_its_fill() -> None:
    graph = capture(FilledMask(), (torch.randn(3, 4),))
    (writer,) = op_changes(graph.ops)
    assert graph.op(writer).replicated and "ones_like" in graph.op(op_changes(graph.ops)[writer][-1]).target


def test_what_reads_a_replicated_tensor_after_an_activation_is_written_into_it_is_not_replicated() -> None:
    graph = capture(MaskFromActivation(), (torch.randn(3, 4),))
    (writer,) = op_changes(graph.ops)
    root = op_changes(graph.ops)[writer][-1]
    assert graph.op(root).replicated and not graph.op(writer).replicated
    total = next(op for op in graph.ops if "sum" in op.target)
    assert not total.replicated  # it reads the filled mask
    (group,) = [group for group in colocation_groups(graph) if writer in group]
    assert total.name in group


def test_a_write_to_an_activation_shares_a_stage_with_its_later_readers() -> None:
    graph = capture(WritesActivation(), (torch.randn(3, 4),))
    (writer,) = op_changes(graph.ops)
    assert not graph.op(writer).replicated
    (group,) = [group for group in colocation_groups(graph) if writer in group]
    a, b, c = (_called_in(graph, module) for module in "abc")
    assert {a, b, writer} <= set(group) and not {"tanh", c} & set(group)


def _called_in(graph: OpGraph, module: str) -> str:
    return next(op.name for op in graph.ops if op.module_stack and op.module_stack[-1][0] == module)


def test_the_alias_chain_walks_views_and_writes_back_to_the_root() -> None:
    ops = {"r": ("ones", None), "v": ("view", "r"), "s": ("slice", "v"), "w": ("fill_", "s"), "u": ("add", "w")}
    chain = alias_chain("w", lambda name: ops[name][1], lambda name: ops[name][0],
                        lambda name: ops[name][0].endswith("_"))
    assert chain == ("w", "s", "v", "r")
    assert alias_chain("u", lambda name: ops[name][1], lambda name: ops[name][0], lambda name: False) == ("u",)
