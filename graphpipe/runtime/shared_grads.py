"""Parameters held by several stages (tied weights): one gradient sum over every rank that holds one.

Each stage that reads a shared parameter holds a copy and computes a gradient from its own ops
and samples; the true gradient is the sum over all of them. Every rank of the plan takes part in
one all-reduce of a buffer laid out the same way everywhere (all shared parameters by name; zeros
for those a rank does not hold), so ranks without shared parameters need no special case and no
process group beyond the plan's. A shared parameter is left out of its stage's data-parallel
all-reduce: its ranks' gradients are counted once each, here. Equal gradients and the same
optimizer keep the copies equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.runtime.comm import Transport

__all__ = ["SharedGrads"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedGrads:
    """The layout of the shared-gradient buffer and the ranks that reduce it."""

    shapes: Mapping[str, tuple[int, ...]]  # every shared parameter of the plan, by name
    ranks: tuple[int, ...]  # every rank of the plan

    @classmethod
    def of(cls, names: Sequence[str], model: nn.Module, ranks: Sequence[int]) -> SharedGrads:
        params = dict(model.named_parameters(remove_duplicate=False))
        return cls(shapes={name: tuple(params[name].shape) for name in sorted(names)}, ranks=tuple(ranks))

    def all_reduce(self, held: Mapping[str, nn.Parameter], transport: Transport) -> None:
        """Sum the gradients of the shared parameters over all ranks; `held` are this rank's copies."""
        if not self.shapes:
            return
        dtype = next((p.dtype for p in held.values()), torch.float32)
        parts = []
        for name, shape in self.shapes.items():
            param = held.get(name)
            grad = param.grad if param is not None and param.grad is not None else None
            parts.append((grad if grad is not None else torch.zeros(shape, dtype=dtype, device=transport.device))
                         .reshape(-1).to(torch.float64))
        flat = torch.cat(parts)
        transport.all_reduce_sum_(flat, self.ranks)
        pos = 0
        for name, shape in self.shapes.items():
            count = int(torch.Size(shape).numel())
            if name in held:
                param = held[name]
                param.grad = flat[pos:pos + count].view(shape).to(param.dtype).clone()
            pos += count
