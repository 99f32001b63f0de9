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

A recomputing stage (`Stage.recompute`) runs its ops' forward again in each backward
(`graphpipe.cost.formulas.time_per_sample.recompute_extra_ms`, without a second action overhead) and holds
per micro-batch in flight only its inputs (`recompute_input_bytes`).
"""

from __future__ import annotations

from dataclasses import replace

from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.time_per_sample import action_overheads_ms, recompute_extra_ms
from graphpipe.stages.recompute import recompute_input_bytes
from graphpipe.stages.stage_cost import StageCost
from graphpipe.stages.stage_graph import Plan, Stage


def stage_cost(stage: Stage, costs: CostTable, device: Device | None = None, input_bytes: int = 0) -> StageCost:
    """Forward, backward, activations and weights of one micro-batch share; the times the engine charges for
    messages and all-reduces it derives from the placed ranks itself. `input_bytes`: what a recomputing stage
    keeps of a micro-batch share (`recompute_input_bytes`)."""
    per_rank = stage.micro_batch_size / stage.data_parallel_degree
    parts = [costs.at(op, per_rank) for op in stage.ops]
    fwd_extra_ms, bwd_extra_ms = action_overheads_ms(device) if device else (0.0, 0.0)
    ops_fwd_ms = sum(p.fwd_ms for p in parts)
    bwd_ms = sum(p.bwd_ms for p in parts) + bwd_extra_ms
    if stage.recompute:
        bwd_ms += recompute_extra_ms(ops_fwd_ms)
    return StageCost(fwd_ms=ops_fwd_ms + fwd_extra_ms, bwd_ms=bwd_ms,
                     act_bytes=sum(p.act_bytes for p in parts), param_bytes=sum(p.param_bytes for p in parts),
                     recompute=stage.recompute, input_bytes=input_bytes if stage.recompute else 0)


def stage_costs(plan: Plan, costs: CostTable, device: Device | None = None) -> dict[int, StageCost]:
    out = {stage.idx: stage_cost(stage, costs, device,
                                 recompute_input_bytes(plan, stage, costs) if stage.recompute else 0)
           for stage in plan.stages}
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
