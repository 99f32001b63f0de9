"""Graphs with nested parallel branches for the planner's nested-branches benchmark and test.

- `nested_graph(depth, branches, num_ops)`: a stem, then inception-like blocks in series up to
  about `num_ops` ops, then a head. A block of depth t forks into `branches` branches; the first
  opens with an op and a block of depth t - 1 (whose concat it then transforms), the others are
  chains of two ops; a concat joins them. So a block of depth 4 has branches inside branches
  inside branches inside branches, and the op count of a block grows linearly with its depth:
  graphs of the same op count and different depths compare the nesting alone. Plain numbers
  (no torch): per-op costs drawn from a seeded generator (`nested_costs`). Blocks are added while
  they fit in `num_ops`, and a chain of ops pads the graph to exactly `num_ops` ops (plus the
  input and the output).
- `InceptionLike`: an Inception-v3-sized nn.Module (the torchvision layout: a stem, 3 x A,
  B, 4 x C, D, 2 x E, a head; conv, batch norm and relu each one op), whose E blocks
  split 3x3 branches into (1x3, 3x1) sub-branches that concat inside the outer concat:
  about 300 ops after `graphpipe.capture` (`inception_graph`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from graphpipe.cost.cluster import Cluster, Device, Link
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef
from graphpipe.graph.tensor_meta import TensorMeta

if TYPE_CHECKING:
    from torch import nn

SIZES = (1, 2, 4, 8, 16)
GiB = 2**30


# ---- synthetic nested fork/join graphs -----------------------------------------------------------
def nested_preds(depth: int, branches: int = 3, num_ops: int = 120) -> dict[str, tuple[str, ...]]:
    """Predecessors of every op of `nested_graph` (topological order, the input `x` first)."""
    preds: dict[str, tuple[str, ...]] = {"x": ()}

    def op(*srcs: str) -> str:
        name = f"op{len(preds)}"
        preds[name] = srcs
        return name

    def block(src: str, level: int) -> str:
        ends = []
        for idx in range(branches):
            head = op(src)
            ends.append(op(block(head, level - 1)) if idx == 0 and level > 1 else op(head))
        return op(*ends)

    last = op("x")
    size = 1 + sum(branches * 2 + 1 + 2 * (level > 1) for level in range(1, depth + 1))  # ops of one block
    while len(preds) + size < num_ops:  # `x` and the head are no ops of the count
        last = block(last, depth)
    while len(preds) <= num_ops:
        last = op(last)
    return preds


def make_op_graph(preds: Mapping[str, Sequence[str]], name: str) -> OpGraph:
    """Ops in the mapping's order; ops without inputs are placeholders; an `output` op reads the sinks."""
    consumers = {src for srcs in preds.values() for src in srcs}
    ops = []
    for op_name, srcs in preds.items():
        kind = "call_function" if srcs else "placeholder"
        ops.append(OpNode(name=op_name, kind=kind, target=op_name, inputs=tuple(srcs),
                          outputs=(TensorMeta(shape=(1, 256)),),
                          params=(ParamRef(name=f"{op_name}.weight", num_bytes=4096),) if srcs else ()))
    ops.append(OpNode(name="output", kind="output", target="output",
                      inputs=tuple(n for n in preds if n not in consumers)))
    return OpGraph(name=name, ops=tuple(ops), example_batch_size=1)


def nested_graph(depth: int, branches: int = 3, num_ops: int = 120) -> OpGraph:
    return make_op_graph(nested_preds(depth, branches, num_ops), f"nested-d{depth}-b{branches}")


def nested_costs(graph: OpGraph, seed: int = 0) -> CostTable:
    """Per-sample costs drawn per op: fwd = 0.1 ms + (0.5..3 ms) x batch, bwd = 2 x fwd; 1-4 MiB of
    activations per sample and 1-64 MiB of weights per op; the input and the output are free."""
    rng = random.Random(seed)
    entries: dict[str, dict[int, OpCost]] = {}
    for node in graph.ops:
        free = node.kind in ("placeholder", "output")
        per_sample = rng.choice((0.5, 1.0, 2.0, 3.0))
        act = rng.choice((1, 2, 4)) << 20
        params = rng.choice((1, 8, 64)) << 20
        entries[node.name] = {
            size: OpCost(fwd_ms=0.0 if free else 0.1 + per_sample * size,
                         bwd_ms=0.0 if free else 2 * (0.1 + per_sample * size),
                         act_bytes=0 if free else act * size,
                         output_bytes=0 if node.kind == "output" else (1 << 16) * size,
                         param_bytes=0 if free else params)
            for size in SIZES}
    return CostTable(device="test", source="analytic", entries=entries)


def bench_cluster(num_devices: int, memory_bytes: int = 16 * GiB) -> Cluster:
    """4 devices per node, 100 GB/s inside a node and 10 GB/s across (as the planner tests' clusters)."""
    device = Device(name="test-gpu", peak_tflops=100.0, mem_bandwidth_gb_per_s=1000.0, memory_bytes=memory_bytes,
                    kernel_overhead_us=0.0)
    return Cluster(name="test", device=device, num_devices=num_devices, devices_per_node=4,
                   intra_node=Link(name="nvlink", latency_us=0.0, bandwidth_gb_per_s=100.0),
                   inter_node=Link(name="ib", latency_us=0.0, bandwidth_gb_per_s=10.0))


# ---- an Inception-v3-sized model -------------------------------------------------------------
def inception_graph(batch_size: int = 2) -> OpGraph:
    """`InceptionLike` captured on the meta device with a 299 x 299 example batch."""
    import torch

    from graphpipe.graph.capture import capture

    with torch.device("meta"):
        model = _inception_module()
        example = torch.randn(batch_size, 3, 299, 299)
    return capture(model, example, name="inception-like")


def _inception_module() -> nn.Module:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Conv(nn.Module):
        """conv -> batch norm -> relu (three ops)."""

        def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int], stride: int = 1,
                     padding: int | tuple[int, int] = 0) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
            self.bn = nn.BatchNorm2d(cout, eps=0.001)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.bn(self.conv(x)))

    class BlockA(nn.Module):
        def __init__(self, cin: int, pool: int) -> None:
            super().__init__()
            self.b1 = Conv(cin, 64, 1)
            self.b5 = nn.Sequential(Conv(cin, 48, 1), Conv(48, 64, 5, padding=2))
            self.b3 = nn.Sequential(Conv(cin, 64, 1), Conv(64, 96, 3, padding=1), Conv(96, 96, 3, padding=1))
            self.bp = Conv(cin, pool, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pool = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
            return torch.cat([self.b1(x), self.b5(x), self.b3(x), pool], 1)

    class BlockB(nn.Module):
        def __init__(self, cin: int) -> None:
            super().__init__()
            self.b3 = Conv(cin, 384, 3, stride=2)
            self.bd = nn.Sequential(Conv(cin, 64, 1), Conv(64, 96, 3, padding=1), Conv(96, 96, 3, stride=2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.b3(x), self.bd(x), F.max_pool2d(x, 3, stride=2)], 1)

    class BlockC(nn.Module):
        def __init__(self, cin: int, c7: int) -> None:
            super().__init__()
            self.b1 = Conv(cin, 192, 1)
            self.b7 = nn.Sequential(Conv(cin, c7, 1), Conv(c7, c7, (1, 7), padding=(0, 3)),
                                    Conv(c7, 192, (7, 1), padding=(3, 0)))
            self.bd = nn.Sequential(Conv(cin, c7, 1), Conv(c7, c7, (7, 1), padding=(3, 0)),
                                    Conv(c7, c7, (1, 7), padding=(0, 3)), Conv(c7, c7, (7, 1), padding=(3, 0)),
                                    Conv(c7, 192, (1, 7), padding=(0, 3)))
            self.bp = Conv(cin, 192, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pool = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
            return torch.cat([self.b1(x), self.b7(x), self.bd(x), pool], 1)

    class BlockD(nn.Module):
        def __init__(self, cin: int) -> None:
            super().__init__()
            self.b3 = nn.Sequential(Conv(cin, 192, 1), Conv(192, 320, 3, stride=2))
            self.b7 = nn.Sequential(Conv(cin, 192, 1), Conv(192, 192, (1, 7), padding=(0, 3)),
                                    Conv(192, 192, (7, 1), padding=(3, 0)), Conv(192, 192, 3, stride=2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.b3(x), self.b7(x), F.max_pool2d(x, 3, stride=2)], 1)

    class BlockE(nn.Module):
        """Two of its four branches fork again: 3x3 -> (1x3, 3x1) -> concat, inside the block's concat."""

        def __init__(self, cin: int) -> None:
            super().__init__()
            self.b1 = Conv(cin, 320, 1)
            self.b3 = Conv(cin, 384, 1)
            self.b3a, self.b3b = Conv(384, 384, (1, 3), padding=(0, 1)), Conv(384, 384, (3, 1), padding=(1, 0))
            self.bd = nn.Sequential(Conv(cin, 448, 1), Conv(448, 384, 3, padding=1))
            self.bda, self.bdb = Conv(384, 384, (1, 3), padding=(0, 1)), Conv(384, 384, (3, 1), padding=(1, 0))
            self.bp = Conv(cin, 192, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b3 = self.b3(x)
            b3 = torch.cat([self.b3a(b3), self.b3b(b3)], 1)
            bd = self.bd(x)
            bd = torch.cat([self.bda(bd), self.bdb(bd)], 1)
            pool = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
            return torch.cat([self.b1(x), b3, bd, pool], 1)

    class Inception(nn.Module):
        def __init__(self, num_classes: int = 1000) -> None:
            super().__init__()
            self.stem = nn.Sequential(Conv(3, 32, 3, stride=2), Conv(32, 32, 3), Conv(32, 64, 3, padding=1),
                                      nn.MaxPool2d(3, stride=2), Conv(64, 80, 1), Conv(80, 192, 3),
                                      nn.MaxPool2d(3, stride=2))
            self.blocks = nn.Sequential(
                BlockA(192, 32), BlockA(256, 64), BlockA(288, 64), BlockB(288),
                BlockC(768, 128), BlockC(768, 160), BlockC(768, 160), BlockC(768, 192), BlockD(768),
                BlockE(1280), BlockE(2048))
            self.fc = nn.Linear(2048, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.blocks(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    return Inception()
