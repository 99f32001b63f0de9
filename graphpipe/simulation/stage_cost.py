"""Per-stage numbers the simulator runs on (`graphpipe.stages.stage_cost.StageCost`), summed from the
cost table over a stage's ops.

Each rank of a data-parallel stage computes micro_batch_size / d samples of every
micro-batch, so the table is read at that (possibly fractional) batch size. A device with
per-action overheads (`Device.fwd_action_overhead_us`, ...) adds them once per forward and
per backward of the stage: the runtime's host work that no op's profile contains (the planner's
rule, `graphpipe.cost.formulas.time_per_sample.action_overheads_ms`, so the plan's `fwd_ms` and
`bwd_ms` are these). A parameter
shared by several stages (`Plan.shared_params`) weighs in every stage that holds a copy, leaves
its stage's data-parallel all-reduce, and is summed by one all-reduce over the plan's ranks.
"""

from __future__ import annotations

from dataclasses import replace

from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.time_per_sample import action_overheads_ms
from graphpipe.stages.stage_cost import StageCost
from graphpipe.stages.stage_graph import Plan, Stage


def stage_cost(stage: Stage, costs: CostTable, device: Device | None = None) -> StageCost:
    """Forward, backward, activations and weights of one micro-batch share; the times the engine charges for
    messages and all-reduces it derives from the placed ranks itself."""
    per_rank = stage.micro_batch_size / stage.data_parallel_degree
    parts = [costs.at(op, per_rank) for op in stage.ops]
    fwd_extra_ms, bwd_extra_ms = action_overheads_ms(device) if device else (0.0, 0.0)
    return StageCost(fwd_ms=sum(p.fwd_ms for p in parts) + fwd_extra_ms,
                     bwd_ms=sum(p.bwd_ms for p in parts) + bwd_extra_ms,
                     act_bytes=sum(p.act_bytes for p in parts), param_bytes=sum(p.param_bytes for p in parts))


def stage_costs(plan: Plan, costs: CostTable, device: Device | None = None) -> dict[int, StageCost]:
    out = {stage.idx: stage_cost(stage, costs, device) for stage in plan.stages}
    if not plan.shared_params:
        return out
    total = sum(int(entry["bytes"]) for entry in plan.shared_params.values())
    for idx, cost in out.items():
        held = [entry for entry in plan.shared_params.values() if idx in entry["stages"]]
        copies = sum(int(entry["bytes"]) for entry in held if entry["owner"] != idx)
        params = cost.param_bytes + copies
        out[idx] = replace(cost, param_bytes=params, shared_reduce_bytes=total,
                           local_reduce_bytes=params - sum(int(entry["bytes"]) for entry in held))
    return out
