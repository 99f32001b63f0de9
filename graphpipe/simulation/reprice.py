"""`recompute_plan`: a plan with another choice of recomputing stages, its predictions priced again.

The planner's predictions per stage (`Stage.bwd_ms`, `tps_ms`, `memory_bytes`) follow from its costs and from each
stage's `recompute`. Switching a stage's recomputation moves them by the rule's terms alone
(`graphpipe.cost.formulas.time_per_sample.recompute_extra_ms`, `graphpipe.cost.formulas.memory`): its backward by
one forward of its ops, its TPS by that forward over its micro-batch, its memory from the held micro-batches'
activations to their inputs plus one micro-batch's activations. Stages whose choice does not change keep the
planner's numbers. The plan's iteration and throughput are simulated again, on its schedule and cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.time_per_sample import recompute_extra_ms
from graphpipe.simulation.stage_cost import recompute_input_bytes, stage_cost
from graphpipe.stages.memory import activation_memory_bytes
from graphpipe.stages.stage_graph import Plan, Stage

__all__ = ["recompute_plan", "reprice_recompute"]


def recompute_plan(plan: Plan, stages: Iterable[int] | str, costs: CostTable, cluster: Cluster | None = None) -> Plan:
    """`plan.with_recompute(stages)` with the predictions of the stages whose choice changed, and the plan's
    simulated iteration, priced again from `costs` on `cluster` (default: the plan's)."""
    from graphpipe.simulation.simulator import simulate

    chosen = reprice_recompute(plan, stages, costs)
    if chosen.recompute_stages == plan.recompute_stages or (cluster is None and not plan.cluster):
        return chosen
    result = simulate(chosen, costs, cluster, schedule=plan.schedule)
    return dataclasses.replace(chosen, predicted_iteration_s=result.iteration_time_s,
                               predicted_samples_per_s=result.samples_per_s)


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
    ops_fwd_ms = sum(costs.at(op, per_rank).fwd_ms for op in before.ops)
    extra_ms = recompute_extra_ms(ops_fwd_ms)
    act_bytes = stage_cost(before, costs).act_bytes
    keep = activation_memory_bytes(act_bytes, before.in_flight_samples, before.micro_batch_size,
                                   plan.global_batch_size)
    again = activation_memory_bytes(act_bytes, before.in_flight_samples, before.micro_batch_size,
                                    plan.global_batch_size,
                                    recompute_input_bytes=recompute_input_bytes(plan, after, costs))
    memory = before.memory_bytes + sign * (again - keep) if before.memory_bytes else 0  # 0: never predicted
    return dataclasses.replace(after, bwd_ms=before.bwd_ms + sign * extra_ms,
                               tps_ms=before.tps_ms + sign * extra_ms / before.micro_batch_size,
                               memory_bytes=max(0, round(memory)))
