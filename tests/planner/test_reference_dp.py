"""The GraphPipe planner against two oracles that share no code with it.

- `reference_dp.ReferenceDP`: a plain min-max DP over the planner's documented space
  (docs/method.md §4) for one micro-batch size;
- `convex_partitions`: every convex partition of a small graph, and the partitions of that space
  enumerated rule by rule, each evaluated from scratch on its own stage graph.

On random graphs (chains, fork/joins of 2-4 branches, two-branch joins, nested blocks, blocks of
5-8 branches; random costs, links and batch sizes), each at no memory limit and at a tight one,
the planner's best predicted TPS (`Plan.predicted_tps_ms`, the largest `Stage.tps_ms`) must be
the reference's optimum: never below it, and above it only within the search's documented
tolerance (it stops when hi - lo < 1e-3 hi), which should be rare. Every plan must validate and
its stages' numbers must be those of the formulas. `pytest -s` prints the tallies.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from graphpipe.errors import PlanningError
from graphpipe.planner.api import plan_candidates
from graphpipe.stages.stage_graph import Plan
from graphpipe.stages.validate import validate_plan
from tests.planner.convex_partitions import (
    Expressible,
    Partition,
    all_convex_partitions,
    best_bottleneck,
    chain_counts,
    dag_counts,
)
from tests.planner.factories import GiB, branches_graph, make_cluster, make_costs
from tests.planner.random_sp_graphs import SHAPES, Case, cases
from tests.planner.reference_dp import ReferenceDP

SEARCH_TOLERANCE = 1e-3  # docs/method.md §4: the search stops when hi - lo < 1e-3 hi, and lo < the optimum
EXACT = 1e-9
NO_LIMIT = 1e18
MOST_VACUOUS = 0.05  # examples that compare no feasible plan
MOST_INEXACT = 0.25  # feasible comparisons where the planner is only within the search tolerance

def candidates(case: Case, limit: float) -> tuple[Plan, ...]:
    """The planner's plans for the case's one micro-batch size, best predicted TPS first (none: no plan)."""
    try:
        return plan_candidates(case.graph, case.costs, case.cluster, case.global_batch_size,
                               micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
    except PlanningError:
        return ()


def reference(case: Case, limit: float) -> ReferenceDP:
    return ReferenceDP(case.tree, case.graph, case.costs, case.cluster, case.global_batch_size,
                       case.micro_batch_size, limit)


def check_plan(plan: Plan, case: Case, ref: ReferenceDP, limit: float) -> None:
    """The plan validates, and its predictions are the formulas' numbers for its stages."""
    validate_plan(plan, case.graph, case.cluster, memory_limit=limit)
    for stage in plan.stages:
        ops, d = frozenset(stage.ops), len(stage.ranks)
        assert stage.micro_batch_size == case.micro_batch_size
        assert stage.tps_ms == pytest.approx(ref.model.tps(ops, d), rel=EXACT)
        held = stage.in_flight_samples // case.micro_batch_size
        assert stage.memory_bytes == pytest.approx(ref.model.memory(ops, d, held), rel=EXACT, abs=1)
    assert plan.predicted_tps_ms == max(stage.tps_ms for stage in plan.stages)


def partition_of(plan: Plan) -> Partition:
    return frozenset(frozenset(stage.ops) for stage in plan.stages)


def compare(case: Case, limit: float, tally: Counter[str]) -> Plan | None:
    """Planner against the reference at `limit`; the planner's best plan when both find one.

    The planner keeps its best graph pipeline and adds the best chain only when that is better
    (graphpipe/planner/graphpipe_planner.py), so with two candidates the worse one is the graph pipeline:
    it must be the optimum of the SP-aligned part of the space, which a better chain would hide."""
    ref = reference(case, limit)
    optimum, plans = ref.optimum(), candidates(case, limit)
    where = f"at memory limit {limit!r}:\n{case.describe()}"
    for plan in plans:
        check_plan(plan, case, ref, limit)
    if optimum == math.inf:
        assert not plans, f"the planner found a plan ({plans[0].predicted_tps_ms}) the reference cannot {where}"
        tally["both infeasible"] += 1
        return None
    assert plans, f"the planner found no plan; the reference's optimum is {optimum} {where}"
    tally["best plan: " + _match(plans[0].predicted_tps_ms, optimum, where)] += 1
    if len(plans) > 1:
        tally["graph pipeline beside a better chain: " + _match(plans[-1].predicted_tps_ms, ref.graph_optimum(),
                                                                 "(the graph pipeline) " + where)] += 1
    graph, chain = ref.graph_optimum(), ref.chain_optimum()
    tally["graph space wins" if graph < chain * (1 - EXACT) else "chain wins" if chain < graph * (1 - EXACT)
          else "tie"] += 1
    return plans[0]


def _match(got: float, optimum: float, where: str) -> str:
    """The tally key of a planner's TPS that must be the optimum (up to the search's tolerance)."""
    assert got >= optimum * (1 - EXACT), f"the planner beats the optimum of its space: {got} < {optimum} {where}"
    assert got <= optimum / (1 - SEARCH_TOLERANCE) * (1 + EXACT), f"{got} is not the optimum {optimum} {where}"
    return "exact" if got <= optimum * (1 + EXACT) else "within search tolerance"


def tight_limits(case: Case, loose: Plan) -> Iterator[float]:
    """Below the peak memory of the plan found with no limit (memory then binds), moving up to that peak
    (where that plan fits) while nothing fits."""
    peak = max(stage.memory_bytes for stage in loose.stages)
    for fraction in (*(1 - (1 - case.tightness) / 4**step for step in range(3)), 1.0):
        yield math.floor(peak * fraction) + 0.5


def check_case(case: Case, tally: Counter[str]) -> list[tuple[float, Plan]]:
    """One example at no limit and at a tight limit; the (limit, plan) pairs where both found a plan."""
    tally["examples"] += 1
    tally[f"widest block {case.widest_block()}"] += 1
    loose = compare(case, NO_LIMIT, tally)
    assert loose is not None, "one stage of everything on one device always fits without a limit"
    checked = [(NO_LIMIT, loose)]
    for limit in tight_limits(case, loose):
        plan = compare(case, limit, tally)
        if plan is not None:
            checked.append((limit, plan))
            tally["tight limit binds" if plan.predicted_tps_ms > loose.predicted_tps_ms * (1 + SEARCH_TOLERANCE)
                  else "tight limit does not bind"] += 1
            break
    if case.computing_ops <= 3 or case.num_devices == 1 or len(checked) == 1:
        tally["vacuous examples"] += 1
    return checked


def report(name: str, tally: Counter[str]) -> None:
    print(f"\n{name}: " + ", ".join(f"{key} {count}" for key, count in sorted(tally.items())))
    inexact = sum(count for key, count in tally.items() if key.endswith("within search tolerance"))
    exact = sum(count for key, count in tally.items() if key.endswith("exact"))
    assert tally["vacuous examples"] <= MOST_VACUOUS * tally["examples"], "too many examples check nothing"
    assert inexact <= MOST_INEXACT * (exact + inexact), "the search stops short of the optimum too often"


EXAMPLES = {"chain": 10, "fork_join": 25, "two_branch": 25, "nested": 20, "wide5": 8, "wide6": 8, "wide7": 8,
            "wide8": 8}


@pytest.mark.parametrize("shape", SHAPES)
def test_planner_finds_the_reference_optimum(shape: str) -> None:
    tally: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES[shape], deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(case=cases(shapes=(shape,)))
    def check(case: Case) -> None:
        check_case(case, tally)

    check()
    report(f"planner vs reference DP, {shape}", tally)


SMALL_SHAPES = ("chain", "fork_join", "two_branch", "nested", "wide5", "wide6")
MAX_UNITS = 10  # computing ops plus `output`


def check_exhaustive(case: Case, tally: Counter[str]) -> None:
    """The reference's optimum is the best of its space enumerated and evaluated from scratch; the space holds only
    convex partitions with acyclic stage graphs, and the planner's answers; no convex partition beats the planner
    (tallied: how often one beats the whole space)."""
    n = case.num_devices
    space = Expressible(case.graph, reference(case, NO_LIMIT).weight)
    graphs = {partition for partition in space.graph_space(case.tree) if len(partition) <= n}
    chains = [stages for stages in space.chain_space() if len(stages) <= n]
    convex = set(all_convex_partitions(case.graph, n))
    outside = (graphs | {frozenset(stages) for stages in chains}) - convex
    assert not outside, f"the space holds partitions that are not convex:\n{case.describe()}"
    for limit, plan in check_case(case, tally):
        ref = reference(case, limit)
        in_space = [best_bottleneck(ref.model, counts, n, ref.degrees)
                    for counts in [*(dag_counts(case.graph, p) for p in graphs), *map(chain_counts, chains)]
                    if counts is not None]
        assert len(in_space) == len(graphs) + len(chains), f"a cycle between stages of the space:\n{case.describe()}"
        of_all = [best_bottleneck(ref.model, counts, n, ref.degrees)
                  for counts in (dag_counts(case.graph, p) for p in convex) if counts is not None]
        best_in_space, best_of_all = min(in_space, default=math.inf), min(of_all, default=math.inf)
        assert ref.optimum() == pytest.approx(best_in_space, rel=EXACT), f"at {limit!r}:\n{case.describe()}"
        assert partition_of(plan) in graphs | {frozenset(stages) for stages in chains}, case.describe()
        assert plan.predicted_tps_ms <= best_in_space / (1 - SEARCH_TOLERANCE) * (1 + EXACT)
        assert plan.predicted_tps_ms >= best_of_all * (1 - EXACT)
        tally["some convex partition is better"] += best_of_all < best_in_space * (1 - EXACT)


def test_reference_is_the_optimum_of_its_space_enumerated() -> None:
    tally: Counter[str] = Counter()

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(case=cases(shapes=SMALL_SHAPES, max_units=MAX_UNITS))
    def check(case: Case) -> None:
        check_exhaustive(case, tally)

    check()
    report("reference DP vs exhaustive search", tally)


def test_chain_plan_found_when_no_graph_plan_fits() -> None:
    """Five branches of two ops on 2 devices, 1 GiB of weights, gradients and Adam state per branch: every SP-aligned
    plan puts whole branches together (runs of them, the last run with the join's stage), so one of its two stages
    holds 3 GiB. The chain [x, b0, b1, b2_0] [b2_1, b3, b4, cat, head, output] cuts inside a branch and needs about
    2.5 GiB per device: graphpipe must find it."""
    graph = branches_graph(5, 2)
    costs = make_costs(graph, act_bytes=1 << 20,
                       param_bytes={op: (128 << 20) if op.startswith("b") else 0 for op in graph.names})
    cluster = make_cluster(2)
    chain = plan_candidates(graph, costs, cluster, 8, planner="sequential", micro_batch_sizes=[1],
                            memory_limit=2.75 * GiB)[0]
    plan = plan_candidates(graph, costs, cluster, 8, micro_batch_sizes=[1], memory_limit=2.75 * GiB)[0]
    assert [stage.ops for stage in plan.stages] == [stage.ops for stage in chain.stages]
    assert plan.stages[0].ops[-1] == "b2_0"
