"""Nested parallel branches: valid plans, and DP work that grows polynomially with the nesting.

The graphs come from `benchmarks/nested_branches/models.py` (inception-like blocks whose first
branch holds a block one level shallower). Work is measured by the probe's memo tables (chain
suffix solves, parallel blocks, fork/join blocks, fork lanes) and by the chain tables built for
extended chains: before fork lanes were solved through their bodies and blocks memoised by
content, each nesting level multiplied them by about 3 (and the time by 3-9).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.baselines.exhaustive import plan_exhaustive
from graphpipe.planner.build import build_plan
from graphpipe.planner.sp_dp import TOLERANCE, Probe, Search, build_tables, partition_sp
from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.stage_spec import Partition, StageSpec
from graphpipe.stages.validate import validate_plan
from tests.planner.factories import make_cluster, make_costs, make_graph

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "nested_branches" / "models.py"


def load_models() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nested_branches_models", MODELS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def models() -> ModuleType:
    return load_models()


def dp_work(graph: OpGraph, costs: CostTable, num_devices: int = 8, size: int = 4) -> int:
    """Entries of one probe's memo tables (no TPS target: every offer counts) plus the chains given tables."""
    request = make_request(graph, costs, make_cluster(num_devices), 16)
    infos, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, num_devices, size, request.memory_limit, infos, pars)
    probe = Probe(search, math.inf)
    assert probe.best_entry(request.sp_tree) is not None
    lanes = sum(len(per_k) for per_k in probe.lane_memo.values())
    return len(probe.chain_memo) + len(probe.par_memo) + len(probe.block_memo) + lanes + len(infos)


@pytest.mark.parametrize(("depth", "branches"), [(3, 2), (3, 4), (4, 2), (4, 3)])
def test_nested_graphs_get_valid_plans(models: ModuleType, depth: int, branches: int) -> None:
    """Every graph pipeline the SP DP finds (each size's best and alternatives), and the ranked candidates."""
    graph = models.nested_graph(depth, branches, 40)
    costs = models.nested_costs(graph, seed=depth * 10 + branches)
    cluster = models.bench_cluster(8)
    request = make_request(graph, costs, cluster, 16, micro_batch_sizes=(2, 4), every_size=True)
    found = partition_sp(request.model, request.sp_tree, 8, (2, 4), request.memory_limit, every_size=True)
    assert found
    for plans in found.values():
        for stages in plans:
            plan = build_plan(request.model, Partition(stages=tuple(stages)), "graphpipe")
            validate_plan(plan, graph, cluster, memory_limit=request.memory_limit)
    for plan in plan_candidates(graph, costs, cluster, 16, micro_batch_sizes=(2, 4)):
        validate_plan(plan, graph, cluster)


def test_dp_work_grows_polynomially_with_the_nesting(models: ModuleType) -> None:
    """Same op count, deeper nesting: a little more work per level (about 1.1-1.3x), not a factor per level
    (about 3x each before: 4,800 chain tables and 6,700 chain solves at depth 4, 120 ops, 3 branches)."""
    for branches in (2, 3):
        work = {}
        for depth in (1, 3, 4):
            graph = models.nested_graph(depth, branches, 100)
            work[depth] = dp_work(graph, models.nested_costs(graph))
        assert work[4] <= 1.5 * work[3], work
        assert work[4] <= 3 * work[1], work


def test_dp_work_grows_polynomially_with_the_ops(models: ModuleType) -> None:
    """Depth 4, twice the ops: about twice the work (the blocks repeat, and their in-flight counts spread
    a little more), far from squared."""
    graph = models.nested_graph(4, 3, 120)
    small = dp_work(graph, models.nested_costs(graph))
    graph = models.nested_graph(4, 3, 240)
    large = dp_work(graph, models.nested_costs(graph))
    assert large <= 3 * small, (small, large)


def test_three_levels_match_the_exhaustive_oracle() -> None:
    """x -> {b, c -> {d, e -> {f, g} -> h} -> i} -> output: the DP equals the best SP-aligned partition."""
    graph = make_graph({"x": (), "b": ("x",), "c": ("x",), "d": ("c",), "e": ("c",), "f": ("e",), "g": ("e",),
                        "h": ("f", "g"), "i": ("d", "h")})
    fwd = {"b": 3.0, "c": 1.0, "d": 2.0, "e": 0.5, "f": 2.0, "g": 1.0, "h": 0.5, "i": 1.0}
    costs = make_costs(graph, {op: fwd.get(op, 0.0) for op in graph.names}, overhead_ms=0.5)
    for num_devices in (3, 4):
        request = make_request(graph, costs, make_cluster(num_devices), 8, micro_batch_sizes=(2, 4))
        oracle = min(bottleneck(request.model, p.stages) for p in plan_exhaustive(request, sp_aligned=True))
        found = partition_sp(request.model, request.sp_tree, num_devices, (2, 4), request.memory_limit)
        best = min(bottleneck(request.model, plans[0]) for plans in found.values())
        assert oracle - 1e-9 <= best <= oracle * (1 + TOLERANCE) + 1e-9


def bottleneck(model: CostModel, stages: Sequence[StageSpec]) -> float:
    return max(model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in stages)
