"""A readable account of a cost table: totals per micro-batch size and the costliest ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphpipe.cost.cost_table import CostTable


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeTotals:
    """The whole model on one micro-batch: the sums over its ops."""

    micro_batch_size: int
    fwd_ms: float
    bwd_ms: float
    act_bytes: int

    @property
    def ms_per_sample(self) -> float:
        return (self.fwd_ms + self.bwd_ms) / self.micro_batch_size

    def to_dict(self) -> dict[str, Any]:
        return {"micro_batch_size": self.micro_batch_size, "fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms,
                "ms_per_sample": self.ms_per_sample, "act_bytes": self.act_bytes}


@dataclass(frozen=True, slots=True, kw_only=True)
class OpShare:
    """One op's forward plus backward time at the table's largest micro-batch size."""

    name: str
    ms: float
    fraction: float  # of the whole model's time at that size

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ms": self.ms, "fraction": self.fraction}


@dataclass(frozen=True, slots=True, kw_only=True)
class CostSummary:
    device: str
    source: str
    num_ops: int
    num_costed_ops: int  # ops that take time
    param_bytes: int
    totals: tuple[SizeTotals, ...]
    top_ops: tuple[OpShare, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "source": self.source, "num_ops": self.num_ops,
                "num_costed_ops": self.num_costed_ops, "param_bytes": self.param_bytes,
                "totals": [total.to_dict() for total in self.totals],
                "top_ops": [share.to_dict() for share in self.top_ops]}


def summarize_costs(table: CostTable, *, num_top: int = 5) -> CostSummary:
    """Totals per stored micro-batch size and the `num_top` costliest ops at the largest size."""
    sizes = table.micro_batch_sizes
    totals = tuple(_totals(table, size) for size in sizes)
    largest = sizes[-1] if sizes else 0
    times = {name: _op_ms(table, name, largest) for name in table.op_names} if sizes else {}
    whole = sum(times.values()) or 1.0
    top = sorted(times.items(), key=lambda item: -item[1])[:num_top]
    first = sizes[0] if sizes else 0
    return CostSummary(
        device=table.device, source=table.source, num_ops=len(table.op_names),
        num_costed_ops=sum(ms > 0 for ms in times.values()),
        param_bytes=sum(table.at(name, first).param_bytes for name in table.op_names) if sizes else 0,
        totals=totals, top_ops=tuple(OpShare(name=name, ms=ms, fraction=ms / whole) for name, ms in top if ms > 0))


def _op_ms(table: CostTable, name: str, size: int) -> float:
    cost = table.at(name, size)
    return cost.fwd_ms + cost.bwd_ms


def _totals(table: CostTable, size: int) -> SizeTotals:
    costs = [table.at(name, size) for name in table.op_names]
    return SizeTotals(micro_batch_size=size, fwd_ms=sum(cost.fwd_ms for cost in costs),
                      bwd_ms=sum(cost.bwd_ms for cost in costs), act_bytes=sum(cost.act_bytes for cost in costs))
