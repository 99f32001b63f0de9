"""Recomputation and the split-backward schedule as choices of every planner (`PlanOptions.techniques`).

A search ranks candidate plans by simulation; these choices add candidates to the ones it ranks, the same way
for every planner, so a comparison between planners stays like-for-like:

- **recompute**: the planner searches again on costs that price every stage as recomputing (each op's backward
  gains its forward, `recompute_extra_ms`) with each op's kept activations divided by 2, 4 and 8: a
  recomputing stage keeps only its inputs per micro-batch in flight, plus one micro-batch's activations,
  which the DP's memory rule (weights + in-flight x activations) cannot say. Each plan found there is
  priced again on the real costs, gets recomputation on exactly the stages whose memory exceeds the limit
  (`reprice_recompute`), and is a candidate where all then fit. So a memory-bound model may take a larger
  micro-batch, fewer devices per stage or a shallower graph, recomputing only where its memory needs it. The
  divisors stop at the first where no plan needs more than the limit with its activations kept.
- **zero-bubble**: every candidate on the 1F1B schedule is also ranked on the `zero-bubble` schedule, whose
  peak memory is 1F1B's (`graphpipe.schedule.zero_bubble`), so it fits wherever its 1F1B twin does.

The plain candidates stay in the ranking, so a plan with these choices is never slower, simulated, than the
plan without them. The DP prices a recomputing stage's time exactly and its memory by the stand-in of divided
activations; the per-stage choice is then made on the simulator's rule (`docs/architecture.md`, "Recomputation
and zero-bubble as planner choices", with its distance to the exact choice measured against two oracles).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.time_per_sample import recompute_extra_ms
from graphpipe.errors import PlanningError
from graphpipe.stages.recompute import reprice_recompute
from graphpipe.stages.stage_graph import Plan

ACTIVATION_DIVISORS = (2, 4, 8)  # what the recompute search divides kept activations by (module docstring)


def with_techniques(plans: Sequence[Plan], techniques: Sequence[str], costs: CostTable, memory_limit: float,
                    search_on: Callable[[CostTable, str], Sequence[Plan]],
                    priced: Callable[[Plan], Plan]) -> tuple[Plan, ...]:
    """`plans` and the candidates `techniques` add (module docstring). `search_on(costs, label)`: the same search's
    candidates on other costs (PlanningError where none fits); `priced(plan)`: a plan found there with its
    predictions priced on `costs` (`graphpipe.planner.build.priced_again`)."""
    found = list(plans)
    if "recompute" in techniques:
        found += recomputing_candidates(costs, memory_limit, search_on, priced)
    if "zero-bubble" in techniques:
        found += [twin for plan in found if (twin := zero_bubble_twin(plan)) is not None]
    return tuple(found)


def recomputing_candidates(costs: CostTable, memory_limit: float, search_on: Callable[[CostTable, str], Sequence[Plan]],
                           priced: Callable[[Plan], Plan]) -> list[Plan]:
    """The plans found on `recomputing_costs` that fit `memory_limit` once the stages above it recompute."""
    found: list[Plan] = []
    for divisor in ACTIVATION_DIVISORS:
        try:
            plans = [priced(plan) for plan in search_on(recomputing_costs(costs, divisor),
                                                        f"recompute: activations / {divisor}")]
        except PlanningError:
            continue  # nothing fits even there: a larger divisor may
        over = [plan for plan in plans if needs_more_than(plan, memory_limit)]
        if not over:
            break
        found += [fitted for plan in over if (fitted := recomputed_to_fit(plan, costs, memory_limit)) is not None]
    return found


def recomputing_costs(costs: CostTable, act_divisor: int) -> CostTable:
    """`costs` with each op's backward gaining its forward (`recompute_extra_ms`: what a recomputing stage runs)
    and its kept activations divided by `act_divisor`: what the search prices a recomputing stage on."""
    entries = {op: {size: dataclasses.replace(cost, bwd_ms=cost.bwd_ms + recompute_extra_ms(cost.fwd_ms),
                                              act_bytes=cost.act_bytes // act_divisor)
                    for size, cost in per_size.items()}
               for op, per_size in costs.entries.items()}
    return dataclasses.replace(costs, entries=entries)


def needs_more_than(plan: Plan, memory_limit: float) -> bool:
    return any(stage.memory_bytes > memory_limit for stage in plan.stages)


def recomputed_to_fit(plan: Plan, costs: CostTable, memory_limit: float) -> Plan | None:
    """`plan` with recomputation on the stages whose memory exceeds `memory_limit`, priced again; None where one
    of them still exceeds it."""
    over = {stage.idx for stage in plan.stages if stage.memory_bytes > memory_limit}
    fitted = reprice_recompute(plan, over | set(plan.recompute_stages), costs)
    return None if needs_more_than(fitted, memory_limit) else fitted


def zero_bubble_twin(plan: Plan) -> Plan | None:
    """`plan` on the `zero-bubble` schedule, where it is on 1F1B and some stage keeps its activations (a
    recomputing stage runs whole backwards, so a plan of only those gains nothing)."""
    if plan.schedule != "1f1b" or all(stage.recompute for stage in plan.stages):
        return None
    return dataclasses.replace(plan, schedule="zero-bubble")
