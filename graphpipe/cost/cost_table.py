"""What each op costs, per micro-batch size: the numbers the planner and simulator run on.

A table holds measured or modelled entries at a few micro-batch sizes. `at(op, batch)`
answers for any (also fractional, per-device) batch by piecewise-linear interpolation
between the stored sizes and proportional extrapolation beyond them, so a data-parallel
stage that gives each device b/d samples is costed without re-profiling.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from graphpipe.errors import CostError
from graphpipe.serde import JsonFile

__all__ = ["CostTable", "OpCost"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpCost:
    """Cost of one op on one micro-batch: times in milliseconds, sizes in bytes."""

    fwd_ms: float
    bwd_ms: float
    act_bytes: int  # activations kept from forward until backward
    output_bytes: int  # what the op hands to its consumers (what crosses a stage edge)
    param_bytes: int  # weights owned by the op (independent of the batch)

    def __post_init__(self) -> None:
        if min(self.fwd_ms, self.bwd_ms) < 0 or min(self.act_bytes, self.output_bytes, self.param_bytes) < 0:
            raise CostError(f"negative cost {self}")

    def to_dict(self) -> dict[str, Any]:
        return {"fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms, "act_bytes": self.act_bytes,
                "output_bytes": self.output_bytes, "param_bytes": self.param_bytes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpCost:
        return cls(**{key: data[key] for key in ("fwd_ms", "bwd_ms", "act_bytes", "output_bytes", "param_bytes")})


ZERO_COST = OpCost(fwd_ms=0.0, bwd_ms=0.0, act_bytes=0, output_bytes=0, param_bytes=0)


@dataclass(frozen=True, kw_only=True)
class CostTable(JsonFile):
    """Per op, per micro-batch size, an `OpCost`; `source` says how it was made ("measured", "analytic")."""

    device: str
    source: str
    entries: Mapping[str, Mapping[int, OpCost]]
    spread: float | None = None  # a measured table: how much its timed runs disagreed (`cost.profile.Spread`)

    def __post_init__(self) -> None:
        for name, per_batch in self.entries.items():
            if not per_batch:
                raise CostError(f"op {name!r} has no cost entries")

    @property
    def op_names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    @property
    def micro_batch_sizes(self) -> tuple[int, ...]:
        sizes: set[int] = set()
        for per_batch in self.entries.values():
            sizes.update(per_batch)
        return tuple(sorted(sizes))

    @cached_property
    def cost_classes(self) -> dict[str, int]:
        """Per op, a number shared by exactly the ops whose entries are equal at every stored size: they cost
        the same at any batch (the identical layers of a model). Made once per table."""
        classes: dict[tuple[tuple[int, OpCost], ...], int] = {}
        return {op: classes.setdefault(tuple(sorted(per.items())), len(classes)) for op, per in self.entries.items()}

    def at(self, op: str, batch: float) -> OpCost:
        """Cost of `op` on `batch` samples (interpolated between stored sizes)."""
        try:
            per_batch = self.entries[op]
        except KeyError:
            raise CostError(f"no cost for op {op!r} in the {self.source} table for {self.device}; "
                            "profile the same graph the plan is made from") from None
        exact = per_batch.get(int(batch)) if float(batch).is_integer() else None
        if exact is not None:
            return exact
        sizes = sorted(per_batch)
        pos = bisect.bisect_left(sizes, batch)
        if pos == 0:
            return _scale(per_batch[sizes[0]], batch / sizes[0])
        if pos == len(sizes):
            return _scale(per_batch[sizes[-1]], batch / sizes[-1])
        lo, hi = sizes[pos - 1], sizes[pos]
        return _blend(per_batch[lo], per_batch[hi], (batch - lo) / (hi - lo))

    def to_dict(self) -> dict[str, Any]:
        spread = {"spread": self.spread} if self.spread is not None else {}
        return {"format": "graphpipe.costs/1", "device": self.device, "source": self.source, **spread,
                "entries": {op: {str(b): cost.to_dict() for b, cost in sorted(per.items())}
                            for op, per in self.entries.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostTable:
        entries = {op: {int(b): OpCost.from_dict(cost) for b, cost in per.items()}
                   for op, per in data["entries"].items()}
        return cls(device=data["device"], source=data["source"], entries=entries, spread=data.get("spread"))

    def __str__(self) -> str:
        return f"CostTable({self.source} on {self.device}, {len(self.entries)} ops, sizes {self.micro_batch_sizes})"


def _scale(cost: OpCost, factor: float) -> OpCost:
    """Proportional extrapolation: time and activations scale with the batch, weights do not."""
    return OpCost(fwd_ms=cost.fwd_ms * factor, bwd_ms=cost.bwd_ms * factor,
                  act_bytes=round(cost.act_bytes * factor), output_bytes=round(cost.output_bytes * factor),
                  param_bytes=cost.param_bytes)


def _blend(lo: OpCost, hi: OpCost, weight: float) -> OpCost:
    def mix(a: float, b: float) -> float:
        return a + (b - a) * weight

    return OpCost(fwd_ms=mix(lo.fwd_ms, hi.fwd_ms), bwd_ms=mix(lo.bwd_ms, hi.bwd_ms),
                  act_bytes=round(mix(lo.act_bytes, hi.act_bytes)),
                  output_bytes=round(mix(lo.output_bytes, hi.output_bytes)), param_bytes=lo.param_bytes)
