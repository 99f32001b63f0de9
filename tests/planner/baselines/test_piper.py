"""Piper: exact against a brute force over its own space, its budgets, and how it gives up."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

from graphpipe.cli.main import main
from graphpipe.cost.formulas.memory import max_in_flight_micro_batches
from graphpipe.errors import PlanningError
from graphpipe.graph.capture import capture
from graphpipe.graph.op_graph import OpGraph
from graphpipe.models import load_model
from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.baselines.downsets import find_downsets
from graphpipe.planner.baselines.piper import DEFAULT_MAX_DOWNSETS, DEFAULT_MAX_EXPLORED, plan_piper
from graphpipe.planner.options import PlanOptions
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import divisors_up_to
from tests.planner.factories import branches_graph, make_cluster, make_costs, make_graph

MiB = 2**20


def skewed_graph() -> OpGraph:
    """Two branches of unequal length and a shortcut from the input to the join."""
    return make_graph({"x": (), "a0": ("x",), "a1": ("a0",), "a2": ("a1",), "b0": ("x",), "b1": ("b0",),
                       "join": ("a2", "b1", "a0"), "head": ("join",)}, name="skewed")


def unit_downsets(request: PlanRequest) -> list[int]:
    """Every downset of the units, by trying every subset."""
    units = request.units
    pos = {key: idx for idx, key in enumerate(units.keys)}
    need = [sum(1 << pos[p] for p in units.preds[key]) for key in units.keys]
    return [mask for mask in range(1 << len(need))
            if all(need[idx] & mask == need[idx] for idx in range(len(need)) if mask >> idx & 1)]


def brute_force(request: PlanRequest, size: int) -> float:
    """The best bottleneck TPS over every chain of downsets with a degree per stage, the stage p-th from the
    end holding min(p, B / b) micro-batches in flight within memory; inf if none fits."""
    downsets, units = unit_downsets(request), request.units.ops
    full, model = downsets[-1], request.model
    num_micro_batches = request.global_batch_size // size

    def stage_tps(upper: int, lower: int, degree: int, position: int) -> float:
        ops = [op for idx in range(len(units)) if (upper & ~lower) >> idx & 1 for op in units[idx]]
        cost = model.stage_cost(ops, degree, size)
        k_max = max_in_flight_micro_batches(cost.param_bytes, cost.act_bytes, request.memory_limit,
                                            num_micro_batches)
        return cost.tps_ms if min(position, num_micro_batches) <= k_max else math.inf

    @functools.cache
    def best(upper: int, devices: int, position: int) -> float:
        """Stages for `upper` (already followed by position - 1 stages) on at most `devices` devices."""
        if upper == 0:
            return 0.0
        found = math.inf
        for lower, degree in itertools.product(downsets, divisors_up_to(size, devices)):
            if lower & upper == lower and lower != upper:
                tps = stage_tps(upper, lower, degree, position)
                if tps < found:
                    found = min(found, max(tps, best(lower, devices - degree, position + 1)))
        return found

    return best(full, request.num_devices, 1)


def bottleneck(request: PlanRequest, stages: tuple) -> float:  # type: ignore[type-arg]
    return max(request.model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in stages)


CASES = [(branches_graph(2, 2), 4, None), (branches_graph(3, 1), 4, 9 * MiB), (branches_graph(2, 3), 3, 12 * MiB),
         (skewed_graph(), 4, 10 * MiB), (skewed_graph(), 2, None)]


@pytest.mark.parametrize(("graph", "devices", "memory"), CASES, ids=[f"{g.name}-{d}-{m}" for g, d, m in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_piper_is_exact_over_its_space(graph: OpGraph, devices: int, memory: int | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    fwd = {op.name: float(rng.uniform(0.2, 3.0)) for op in graph.ops}
    costs = make_costs(graph, fwd, overhead_ms=0.2, act_bytes=MiB, param_bytes=MiB // 2)
    request = make_request(graph, costs, make_cluster(devices), 8, micro_batch_sizes=[1, 2, 4, 8],
                           memory_limit=memory, planner="piper")
    found = {p.stages[0].micro_batch_size: bottleneck(request, p.stages) for p in plan_piper(request)}
    expected = {size: brute_force(request, size) for size in request.micro_batch_sizes}
    assert set(found) == {size for size, tps in expected.items() if math.isfinite(tps)}
    for size, tps in found.items():
        assert tps == pytest.approx(expected[size], rel=1e-9)


def test_memory_binds_in_the_cases() -> None:
    """The tight memory limits above leave some micro-batch size infeasible or slower: the check matters."""
    graph, devices, memory = CASES[1]
    costs = make_costs(graph, overhead_ms=0.2, act_bytes=MiB, param_bytes=MiB // 2)
    loose = make_request(graph, costs, make_cluster(devices), 8, planner="piper")
    tight = make_request(graph, costs, make_cluster(devices), 8, planner="piper", memory_limit=memory)
    assert any(brute_force(tight, size) > brute_force(loose, size) for size in (1, 2, 4, 8))


def test_gives_up_with_the_count_of_downsets() -> None:
    graph = branches_graph(3, 3)
    request = make_request(graph, make_costs(graph), make_cluster(2), 2, planner="piper")
    count = len(unit_downsets(request))
    with pytest.raises(PlanningError, match=rf"no strategy within 10 downsets: .* has {count} downsets.*"
                                            "grows exponentially with the number of parallel branches"):
        plan_candidates(graph, make_costs(graph), make_cluster(2), 2, planner="piper", max_downsets=10)


def test_stops_counting_at_the_exploration_budget() -> None:
    graph = branches_graph(6, 4)
    with pytest.raises(PlanningError, match=r"has at least [\d,]+ downsets \(counting stopped past 300\)"):
        plan_candidates(graph, make_costs(graph), make_cluster(2), 2, planner="piper", max_explored=300)


def test_budgets_are_options() -> None:
    assert PlanOptions().max_explored is None
    assert PlanOptions(max_downsets=5, max_explored=7).max_explored == 7
    with pytest.raises(PlanningError, match="max_explored must be positive"):
        PlanOptions(max_explored=0)


def test_budgets_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "toy_branches", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "2",
            "--batch", "4", "--planner", "piper"]
    assert main([*args, "--max-downsets", "3", "--time-limit", "30"]) == 1
    assert "no strategy within 3 downsets" in capsys.readouterr().err
    assert main([*args, "--max-explored", "2"]) == 1
    assert "counting stopped past 2" in capsys.readouterr().err
    assert main(["compare", "--model", "toy_branches", "--devices", "2", "--batch", "4", "--planners", "piper",
                 "--max-downsets", "3", "--json"]) == 0
    assert "no strategy within 3 downsets" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*args, "--time-limit", "0"])


@pytest.mark.parametrize(("model", "count"), [("candle_uno", r"78,132 downsets"),
                                              ("dlrm", r"at least [\d,]+ downsets \(counting stopped past 200,000\)")])
def test_gives_up_on_the_paper_models_at_layer_granularity(model: str, count: str) -> None:
    """The paper's reason: each branch MLP is a stack of Linear layers, so the branches' layer prefixes
    multiply (5^7 = 78,125 for seven branches of four layers), past the original's budgets."""
    graph = paper_graph(model)
    with pytest.raises(PlanningError, match=rf"has {count}.* or use planner 'graphpipe', whose search grows"):
        plan_candidates(graph, make_costs(graph), make_cluster(8), 64, planner="piper", granularity="layer")


def test_mmt_layer_graph_is_within_the_budget() -> None:
    graph = paper_graph("mmt")
    request = make_request(graph, make_costs(graph), make_cluster(8), 64, planner="piper", granularity="layer")
    assert len(find_downsets(request.units, max_downsets=DEFAULT_MAX_DOWNSETS, max_explored=DEFAULT_MAX_EXPLORED,
                             deadline=math.inf, graph_name="mmt")) == 6_566


def paper_graph(model: str) -> OpGraph:
    zoo = load_model(model, "paper", device="meta")
    return capture(zoo.model, zoo.inputs, name=model)
