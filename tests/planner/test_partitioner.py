"""The GraphPipe partitioner against the exhaustive oracle and the sequential baselines."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.baselines.exhaustive import plan_exhaustive
from graphpipe.planner.sp_dp import TOLERANCE, divisors_up_to, partition_sp
from graphpipe.planner.sp_dp import search as search_module
from graphpipe.planner.stage_spec import StageSpec
from graphpipe.stages.stage_graph import Plan
from graphpipe.stages.validate import validate_plan
from tests.planner.factories import GiB, branches_graph, chain_graph, make_cluster, make_costs
from tests.planner.sp_graphs import sp_graphs


def best_tps(plans: tuple[Plan, ...]) -> float:
    return min(plan.predicted_tps_ms for plan in plans)


def test_data_parallel_degrees_divide_the_micro_batch() -> None:
    assert divisors_up_to(12, 8) == (1, 2, 3, 4, 6)
    assert divisors_up_to(1, 8) == (1,)


def test_chain_graph_matches_sequential_and_pipedream() -> None:
    graph = chain_graph(10)
    fwd = {f"l{i}": float(1 + (i * 7) % 5) for i in range(10)}
    costs = make_costs(graph, fwd, overhead_ms=0.2)
    cluster = make_cluster(4)
    found = {name: best_tps(plan_candidates(graph, costs, cluster, 16, planner=name))
             for name in ("graphpipe", "sequential", "pipedream")}
    gp_plan = plan_candidates(graph, costs, cluster, 16)[0]
    assert gp_plan.is_sequential
    assert found["graphpipe"] == pytest.approx(found["pipedream"], rel=TOLERANCE)
    assert found["sequential"] == pytest.approx(found["pipedream"], rel=TOLERANCE)


def test_long_chain_is_cut_into_several_stages() -> None:
    graph = chain_graph(40)
    plan = plan_candidates(graph, make_costs(graph), make_cluster(8), 8, micro_batch_sizes=[1])[0]
    assert plan.num_stages == 8 and plan.depth == 8
    assert max(len(stage.ops) for stage in plan.stages) <= 7


def test_branches_run_in_parallel_stages() -> None:
    graph = branches_graph(4, 6)
    plans = plan_candidates(graph, make_costs(graph), make_cluster(8), 8, micro_batch_sizes=[1])
    chain = plan_candidates(graph, make_costs(graph), make_cluster(8), 8, micro_batch_sizes=[1],
                            planner="sequential")[0]
    graph_plan = min(plans, key=lambda p: p.depth)
    assert graph_plan.depth < chain.depth
    assert graph_plan.predicted_tps_ms <= chain.predicted_tps_ms * 1.01  # same compute split, other cut tensors
    assert min(p.predicted_tps_ms for p in plans) <= chain.predicted_tps_ms * (1 + TOLERANCE)


def test_many_branches_use_interval_groups() -> None:
    """More than 4 branches: groups are runs of branches sorted by compute; the plan is still valid."""
    graph = branches_graph(7, 2)
    cluster = make_cluster(4)
    plan = plan_candidates(graph, make_costs(graph), cluster, 8)[0]
    validate_plan(plan, graph, cluster)
    assert plan.world_size <= 4


def test_memory_limit_favours_a_shallower_graph_with_a_larger_micro_batch() -> None:
    """Two branches of 4 layers on 8 devices, memory-limited: the sequential pipeline must hold 8
    micro-batches on its first stage, the graph pipeline about half, so it affords larger ones."""
    graph = branches_graph(2, 4)
    layers = [op.name for op in graph.ops if op.name.startswith("b")]
    act = {op: 1 << 26 if op in layers else 1 << 20 for op in graph.names}
    costs = make_costs(graph, overhead_ms=0.5, act_bytes=act,
                       param_bytes={op: 1 << 28 if op in layers else 0 for op in graph.names})
    cluster = make_cluster(8, memory_bytes=int(1.7 * GiB))
    kwargs = {"memory_limit": 1.7 * GiB}
    gpp = plan_candidates(graph, costs, cluster, 32, **kwargs)[0]
    spp = plan_candidates(graph, costs, cluster, 32, planner="sequential", **kwargs)[0]
    assert spp.depth == 8 and gpp.depth <= 5
    assert gpp.stages[0].micro_batch_size >= spp.stages[0].micro_batch_size
    assert gpp.predicted_tps_ms < spp.predicted_tps_ms


def _check_against_oracle(graph: OpGraph, costs: CostTable, num_devices: int, memory_gib: float,
                          unrestricted: bool) -> None:
    cluster = make_cluster(num_devices)
    kwargs = {"micro_batch_sizes": (2, 4), "memory_limit": memory_gib * GiB}
    request = make_request(graph, costs, cluster, 8, **kwargs)
    aligned = plan_exhaustive(request, sp_aligned=True)
    if not aligned:
        return
    model = request.model

    def bottleneck(stages: Sequence[StageSpec]) -> float:
        return max(model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in stages)

    oracle = min(bottleneck(p.stages) for p in aligned)
    dp = partition_sp(model, request.sp_tree, num_devices, (2, 4), request.memory_limit)
    assert oracle - 1e-9 <= min(bottleneck(plans[0]) for plans in dp.values()) <= oracle * (1 + TOLERANCE) + 1e-9
    found = best_tps(plan_candidates(graph, costs, cluster, 8, **kwargs))
    assert found <= oracle * (1 + TOLERANCE) + 1e-9
    if unrestricted:
        assert found >= min(bottleneck(p.stages) for p in plan_exhaustive(request)) - 1e-9


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp_graphs(max_ops=7))
def test_matches_exhaustive_on_random_sp_graphs(case: tuple[OpGraph, CostTable]) -> None:
    """Equal to the best SP-aligned partition (the DP's space), never better than any convex partition."""
    graph, costs = case
    for num_devices, memory_gib, unrestricted in ((2, 16.0, True), (4, 16.0, False), (4, 0.3, False)):
        _check_against_oracle(graph, costs, num_devices, memory_gib, unrestricted)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp_graphs(max_ops=6))
def test_every_planner_returns_valid_plans(case: tuple[OpGraph, CostTable]) -> None:
    graph, costs = case
    cluster = make_cluster(3)
    for planner in ("graphpipe", "sequential", "parallel-only", "pipedream", "piper", "exhaustive"):
        for plan in plan_candidates(graph, costs, cluster, 4, planner=planner, micro_batch_sizes=(1, 2)):
            validate_plan(plan, graph, cluster)
            assert plan.planner == planner


def test_every_size_frees_each_sizes_tables_before_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `every_size`, a size's search (its segment tables per degree) is gone when the next size starts,
    so memory is that of the largest size, not of all of them; the plans are those of the deferred narrowing
    (each size's narrowing reads only its own search)."""
    graph = branches_graph(3, 4)
    request = make_request(graph, make_costs(graph), make_cluster(8), 32, every_size=True)
    alive: list[weakref.ref[search_module.Search]] = []
    real_init = search_module.Search.__init__

    def init(self: search_module.Search, *args: Any, **kwargs: Any) -> None:
        gc.collect()
        assert all(ref() is None for ref in alive), "an earlier size's search is still held"
        real_init(self, *args, **kwargs)
        alive.append(weakref.ref(self))

    monkeypatch.setattr(search_module.Search, "__init__", init)
    found = partition_sp(request.model, request.sp_tree, 8, request.micro_batch_sizes, request.memory_limit,
                         every_size=True)
    assert len(alive) >= 3 and len(found) >= 3
    monkeypatch.undo()
    tps_only = partition_sp(request.model, request.sp_tree, 8, request.micro_batch_sizes, request.memory_limit)
    for size, plans in tps_only.items():
        if size in found:
            cost = request.model.stage_cost
            assert max(cost(s.ops, s.num_devices, size).tps_ms for s in found[size][0]) <= \
                max(cost(s.ops, s.num_devices, size).tps_ms for s in plans[0]) * (1 + TOLERANCE)


def test_join_stage_takes_the_lightest_branches_of_a_wide_block() -> None:
    """Six branches, four heavy and two light, on 5 devices: the best stage graph gives each heavy branch a device
    and runs the light ones with the join (cat, head) on the fifth, in parallel with the rest: depth 2, where
    the chain with the same stages is 5 deep. Neither fork/join absorption (at most 4 branches) nor a plain
    grouping (the join's stage would need a sixth device) reaches it."""
    graph = branches_graph(6, 1)
    heavy = {"b0_0", "b1_0", "b2_0", "b3_0"}
    costs = make_costs(graph, fwd_ms={op: 4.0 if op in heavy else 1.0 for op in graph.names})
    best = plan_candidates(graph, costs, make_cluster(5), 8, micro_batch_sizes=[1])[0]
    chain = plan_candidates(graph, costs, make_cluster(5), 8, planner="sequential", micro_batch_sizes=[1])[0]
    assert {frozenset(stage.ops) for stage in best.stages} >= {frozenset({"b4_0", "b5_0", "cat", "head", "output"})}
    assert best.depth == 2 and chain.depth == 5
    assert best.predicted_tps_ms == pytest.approx(chain.predicted_tps_ms)
