"""`recompute_plan`: a plan with another choice of recomputing stages, its predictions priced again.

The stages' predictions move by the rule's terms alone (`graphpipe.stages.recompute.reprice_recompute`); the
plan's iteration and throughput are simulated again, on its schedule and cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.stages.recompute import reprice_recompute
from graphpipe.stages.stage_graph import Plan

__all__ = ["recompute_plan"]


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
