"""Per-stage numbers the simulator runs on, summed from the cost table over a stage's ops.

Each rank of a data-parallel stage computes micro_batch_size / d samples of every
micro-batch, so the table is read at that (possibly fractional) batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphpipe.cost.cost_table import CostTable
from graphpipe.planner.stage_graph import Plan, Stage


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    """One micro-batch on one rank of a stage."""

    fwd_ms: float
    bwd_ms: float
    act_bytes: int  # activations kept from the forward until the backward
    param_bytes: int  # weights of the stage (each rank holds a full copy)


def stage_cost(stage: Stage, costs: CostTable) -> StageCost:
    per_rank = stage.micro_batch_size / stage.data_parallel_degree
    parts = [costs.at(op, per_rank) for op in stage.ops]
    return StageCost(fwd_ms=sum(p.fwd_ms for p in parts), bwd_ms=sum(p.bwd_ms for p in parts),
                     act_bytes=sum(p.act_bytes for p in parts), param_bytes=sum(p.param_bytes for p in parts))


def stage_costs(plan: Plan, costs: CostTable) -> dict[int, StageCost]:
    return {stage.idx: stage_cost(stage, costs) for stage in plan.stages}
