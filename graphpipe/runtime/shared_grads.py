"""Parameters held by several stages (tied weights): one gradient sum over the ranks that hold one.

Each stage that reads a shared parameter holds a copy and computes a gradient from its own ops and
samples; the true gradient is the sum over all of them. The shared parameters are bucketed by the ranks
that hold them (every rank of every stage that reads them) and their dtype; each bucket is one all-reduce
of its gradients, in their own dtype, over those ranks alone: a rank that holds no shared parameter takes
no part, and a tied embedding costs its own size, not a float64 copy on every rank of the plan. Every
holder issues its buckets in the same order (sorted by ranks, then dtype), so the collectives of
overlapping groups cannot cross. A shared parameter is left out of its stage's data-parallel all-reduce:
its ranks' gradients are counted once each, here. Equal gradients and the same optimizer keep the copies
equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.runtime.comm import Transport
from graphpipe.runtime.stage_module import StageModule
from graphpipe.stages.stage_graph import Plan

__all__ = ["SharedBucket", "SharedGrads"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedBucket:
    """Shared parameters with the same holders and dtype: one all-reduce."""

    ranks: tuple[int, ...]  # every rank that holds them, sorted
    dtype: torch.dtype
    shapes: Mapping[str, tuple[int, ...]]  # by name, sorted


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedGrads:
    """The buckets of every shared parameter of the plan, in the order every holder reduces them."""

    buckets: tuple[SharedBucket, ...]

    @classmethod
    def of(cls, stages: Sequence[StageModule], plan: Plan) -> SharedGrads:
        holders: dict[str, set[int]] = {}
        found: dict[str, nn.Parameter] = {}
        for stage in stages:
            params = dict(stage.named_parameters())
            for name in stage.spec.shared_params:
                holders.setdefault(name, set()).update(plan.stages[stage.spec.stage_idx].ranks)
                found[name] = params[name]
        keys: dict[tuple[tuple[int, ...], str], dict[str, tuple[int, ...]]] = {}
        for name in sorted(holders):
            key = (tuple(sorted(holders[name])), str(found[name].dtype))
            keys.setdefault(key, {})[name] = tuple(found[name].shape)
        dtypes = {str(param.dtype): param.dtype for param in found.values()}
        return cls(buckets=tuple(SharedBucket(ranks=ranks, dtype=dtypes[dtype], shapes=shapes)
                                 for (ranks, dtype), shapes in sorted(keys.items())))

    def groups(self) -> list[tuple[int, ...]]:
        """The rank groups the buckets reduce over, each once, in reduction order."""
        return list(dict.fromkeys(bucket.ranks for bucket in self.buckets if len(bucket.ranks) > 1))

    def all_reduce(self, held: Mapping[str, nn.Parameter], transport: Transport) -> None:
        """Sum the gradients of this rank's shared parameters over their holders; `held` are this rank's copies."""
        for bucket in self.buckets:
            if transport.rank not in bucket.ranks:
                continue
            parts = []
            for name, shape in bucket.shapes.items():
                grad = held[name].grad
                parts.append((grad if grad is not None else torch.zeros(shape, dtype=bucket.dtype,
                                                                          device=transport.device)).reshape(-1))
            flat = torch.cat(parts)
            transport.all_reduce_sum_(flat, bucket.ranks)
            pos = 0
            for name, shape in bucket.shapes.items():
                count = int(torch.Size(shape).numel())
                held[name].grad = flat[pos:pos + count].view(shape).clone()
                pos += count
