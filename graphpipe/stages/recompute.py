"""A recomputing stage's inputs, and a plan's predictions priced again for another choice of recomputing stages.

The planner's predictions per stage (`Stage.bwd_ms`, `tps_ms`, `memory_bytes`) follow from its costs and from each
stage's `recompute`. Switching a stage's recomputation moves them by the rule's terms alone
(`graphpipe.cost.formulas.time_per_sample.recompute_extra_ms`, `graphpipe.cost.formulas.memory`): its backward by
one forward of its ops, its TPS by that forward over its micro-batch, its memory from the held micro-batches'
activations to their inputs plus one micro-batch's activations. Stages whose choice does not change keep the
planner's numbers. Here, below the planner and the simulator, so that both price a recomputing stage alike: the
planner's choices (`graphpipe.planner.techniques`, `StageSpec.recompute`) and `graphpipe.simulation.reprice`,
which simulates the repriced plan again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.time_per_sample import recompute_extra_ms
from graphpipe.stages.memory import activation_memory_bytes
from graphpipe.stages.stage_graph import Plan, Stage

__all__ = ["recompute_input_bytes", "reprice_recompute"]


def recompute_input_bytes(plan: Plan, stage: Stage, costs: CostTable) -> int:
    """What a recomputing stage keeps of one micro-batch share on one rank: the values it receives (its incoming
    stage edges' `bytes_per_sample`) and the model inputs among its ops (`Plan.input_batch_axes`; their
    `output_bytes` in the cost table), at micro_batch_size / d samples. The model inputs are views of the
    mini-batch, which the runtime holds for the whole step anyway: counting them is on the safe side."""
    per_rank = stage.micro_batch_size / stage.data_parallel_degree
    received = sum(edge.bytes_per_sample for edge in plan.edges if edge.dst == stage.idx) * per_rank
    model_inputs = sum(costs.at(op, per_rank).output_bytes for op in stage.ops if op in plan.input_batch_axes)
    return round(received + model_inputs)


def reprice_recompute(plan: Plan, stages: Iterable[int] | str, costs: CostTable) -> Plan:
    """`plan.with_recompute(stages)` with the per-stage predictions (backward, TPS, memory) and the bottleneck TPS
    priced again, its simulated iteration left as it was: for a search that simulates its candidates itself."""
    chosen = plan.with_recompute(stages)
    if chosen.recompute_stages == plan.recompute_stages:
        return chosen
    priced = tuple(_repriced(plan, before, after, costs) if before.recompute != after.recompute else after
                   for before, after in zip(plan.stages, chosen.stages))
    return dataclasses.replace(chosen, stages=priced,
                               predicted_tps_ms=max((stage.tps_ms for stage in priced), default=0.0))


def _repriced(plan: Plan, before: Stage, after: Stage, costs: CostTable) -> Stage:
    """`after` (the same stage as `before`, the other choice) with its backward, TPS and memory moved by the rule."""
    sign = 1.0 if after.recompute else -1.0
    per_rank = before.micro_batch_size / before.data_parallel_degree
    parts = [costs.at(op, per_rank) for op in before.ops]
    extra_ms = recompute_extra_ms(sum(part.fwd_ms for part in parts))
    act_bytes = sum(part.act_bytes for part in parts)
    keep = activation_memory_bytes(act_bytes, before.in_flight_samples, before.micro_batch_size,
                                   plan.global_batch_size)
    again = activation_memory_bytes(act_bytes, before.in_flight_samples, before.micro_batch_size,
                                    plan.global_batch_size,
                                    recompute_input_bytes=recompute_input_bytes(plan, after, costs))
    memory = before.memory_bytes + sign * (again - keep) if before.memory_bytes else 0  # 0: never predicted
    return dataclasses.replace(after, bwd_ms=before.bwd_ms + sign * extra_ms,
                               tps_ms=before.tps_ms + sign * extra_ms / before.micro_batch_size,
                               memory_bytes=max(0, round(memory)))
