"""`gp.plan`: search stage graphs, then pick the candidate that trains fastest.

The planners optimise the bottleneck stage's time per sample (TPS), which ignores warm-up
and cool-down, where graph pipelines gain the most. So the best plan per micro-batch size
is kept, each is simulated (`rank_by="simulation"`), and the one with the shortest
simulated iteration wins (docs/method.md §4, [ours]); `rank_by="tps"` picks by TPS alone. A
candidate whose lower bound on the iteration (its busiest stage's own work) is above the best
simulated so far is not simulated: the winner is the same (`docs/architecture.md`). For the
ranking by simulation every size's plan is searched to full precision (`every_size`), not
only the sizes that could hold the best TPS.
`parallel-only` (the ablation) takes the micro-batch size of the sequential plan that the
same ranking picks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.errors import PlanningError, PlanValidationError
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.api import plan_candidates
from graphpipe.planner.notes import batch_coupling_notes
from graphpipe.planner.stage_graph import Plan
from graphpipe.planner.validate import check_runtime_rules

if TYPE_CHECKING:
    from graphpipe.simulation.result import SimResult

RANKINGS = ("simulation", "tps")
BOUND_SLACK = 1e-9  # a bound summed in another order than the simulator's clock may be a few ulps above it


def plan(graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int, *,
         planner: str = "graphpipe", micro_batch_sizes: Sequence[int] | None = None,
         per_stage_micro_batch: bool = False, memory_limit: float | None = None,
         rank_by: str = "simulation", options: dict[str, float] | None = None,
         use_all_devices: bool = False) -> Plan:
    """The best plan for training `graph` on `cluster` with mini-batches of `global_batch_size` samples.

    A plan may leave devices unused when more would not help (the extra ranks stay idle at run time);
    `use_all_devices=True` keeps only candidates that use every device."""
    if rank_by not in RANKINGS:
        raise PlanningError(f"unknown ranking {rank_by!r}; choose one of {', '.join(RANKINGS)}")
    start = time.perf_counter()
    if planner == "parallel-only" and "micro_batch_size" not in (options or {}):
        sequential = plan(graph, costs, cluster, global_batch_size, planner="sequential",
                          micro_batch_sizes=micro_batch_sizes, per_stage_micro_batch=per_stage_micro_batch,
                          memory_limit=memory_limit, rank_by=rank_by, options=options)
        options = {**(options or {}), "micro_batch_size": sequential.stages[0].micro_batch_size}
    candidates = plan_candidates(graph, costs, cluster, global_batch_size, planner=planner,
                                 micro_batch_sizes=micro_batch_sizes, per_stage_micro_batch=per_stage_micro_batch,
                                 memory_limit=memory_limit, options=options, every_size=rank_by == "simulation")
    if use_all_devices:
        candidates = _using_all(candidates, cluster.num_devices, planner)
    if rank_by == "tps":
        best = min(candidates, key=lambda p: p.predicted_tps_ms)
        iteration_s = best.global_batch_size * best.predicted_tps_ms / 1e3
        best = dataclasses.replace(best, predicted_iteration_s=iteration_s)
    else:
        iteration_s, best, result = _best_simulated(candidates, costs, cluster)
        best = dataclasses.replace(best, predicted_iteration_s=iteration_s,
                                   predicted_samples_per_s=result.samples_per_s)
    try:
        check_runtime_rules(best, graph)
    except PlanValidationError as err:
        raise PlanningError(f"planner {planner!r} returned a plan the runtime would refuse (a planner bug): "
                            f"{err}") from err
    return dataclasses.replace(best, search_time_s=time.perf_counter() - start, planner=planner,
                               notes=best.notes + batch_coupling_notes(graph, best))


def _using_all(candidates: Sequence[Plan], num_devices: int, planner: str) -> tuple[Plan, ...]:
    full = tuple(candidate for candidate in candidates if candidate.world_size == num_devices)
    if not full:
        most = max((candidate.world_size for candidate in candidates), default=0)
        raise PlanningError(f"no {planner} plan uses all {num_devices} devices (the most any uses is {most}): the "
                            "model is too small to split further at this mini-batch; use fewer devices, a larger "
                            "mini-batch, or let the extra ranks idle (drop --use-all-devices)")
    return full


def _best_simulated(candidates: Sequence[Plan], costs: CostTable, cluster: Cluster) -> tuple[float, Plan, SimResult]:
    """(simulated iteration seconds, plan, result) of the fastest candidate; ties go to the smaller TPS, then
    to the earlier candidate. Candidates are simulated by increasing lower bound
    (`iteration_lower_bound_s`), and those whose bound is above the best iteration so far are skipped:
    they could not win, and they are the slow ones to simulate (many micro-batches)."""
    from graphpipe.simulation.simulator import iteration_lower_bound_s, simulate

    bounds = sorted((iteration_lower_bound_s(c, costs, cluster), idx) for idx, c in enumerate(candidates))
    best: tuple[tuple[float, float, int], Plan, SimResult] | None = None
    for bound, idx in bounds:
        if best is not None and bound > best[0][0] * (1 + BOUND_SLACK):
            break  # sorted: no later candidate can win either
        candidate = candidates[idx]
        result = simulate(candidate, costs, cluster, schedule=candidate.schedule)
        key = (result.iteration_time_s, candidate.predicted_tps_ms, idx)
        if best is None or key < best[0]:
            best = (key, candidate, result)
    if best is None:
        raise PlanningError("no candidate plan to rank")
    return best[0][0], best[1], best[2]
