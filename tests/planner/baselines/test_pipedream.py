"""PipeDream's antichain-DAG DP: its states, its optimum against an exhaustive search of its own space,
agreement with the sequential planner on a chain, and the give-up message."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from graphpipe.cost.formulas.memory import max_in_flight_micro_batches
from graphpipe.errors import PlanningError
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.baselines import pipedream
from graphpipe.planner.baselines.antichains import AntichainLimitError, antichain_dag
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import TOLERANCE, divisors_up_to
from tests.planner.factories import GiB, branches_graph, chain_graph, make_cluster, make_costs, make_graph


def _request(graph: OpGraph, num_devices: int, size: int, **fields: object) -> PlanRequest:
    fwd = {op: 1.0 + (idx * 7) % 5 for idx, op in enumerate(graph.names)}
    costs = make_costs(graph, fwd, overhead_ms=0.2, act_bytes=1 << 26)
    return make_request(graph, costs, make_cluster(num_devices, devices_per_node=2), 8,
                        micro_batch_sizes=(size,), planner="pipedream", **fields)


def _chains(states: list[int], full: int) -> Iterator[list[tuple[int, int]]]:
    """Every chain of states from the empty downset to `full`, as (lower, upper) steps."""
    def walk(lower: int) -> Iterator[list[tuple[int, int]]]:
        if lower == full:
            yield []
            return
        for upper in states:
            if upper != lower and upper & lower == lower:
                for rest in walk(upper):
                    yield [(lower, upper), *rest]
    yield from walk(0)


def _exhaustive_tps(request: PlanRequest, size: int) -> float:
    """The best bottleneck TPS over every chain of states and every replication factor per stage, each stage
    keeping as many micro-batches in flight as stages from it to the end (at most the mini-batch)."""
    states = list(antichain_dag(request.units, float("inf"), 10**6).states)
    units, model = request.units.ops, request.model
    best = float("inf")
    for steps in _chains(states, states[0]):
        for degrees in itertools.product(divisors_up_to(size, request.num_devices), repeat=len(steps)):
            if sum(degrees) > request.num_devices:
                continue
            worst = 0.0
            for pos, ((lower, upper), degree) in enumerate(zip(steps, degrees)):
                diff = upper & ~lower
                ops = [op for idx in range(diff.bit_length()) if diff >> idx & 1 for op in units[idx]]
                cost = model.stage_cost(ops, degree, size)
                fits = max_in_flight_micro_batches(cost.param_bytes, cost.act_bytes, request.memory_limit,
                                                   request.global_batch_size // size)
                worst = max(worst, cost.tps_ms if fits >= len(steps) - pos else float("inf"))
            best = min(best, worst)
    return best


def test_the_states_are_the_downsets_of_the_units() -> None:
    graph = branches_graph(2, 1)  # units: b0_0 (with the input x), b1_0, cat, head, output
    dag = antichain_dag(make_request(graph, make_costs(graph), make_cluster(2), 2).units, float("inf"), 100)
    assert len(dag.states) == 7  # {}, a, b, a+b, then +cat, +head, +output
    assert dag.states[0] == (1 << dag.num_units) - 1 and dag.states[-1] == 0
    sizes = [state.bit_count() for state in dag.states]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(("graph", "num_devices", "size", "memory_gib"), [
    (branches_graph(2, 2), 3, 2, 16.0),
    (branches_graph(3, 1), 4, 4, 16.0),
    (branches_graph(2, 2), 4, 4, 0.45),  # memory binds: deep pipelines keep too many micro-batches
    (make_graph({"x": (), "a": ("x",), "b": ("a",), "c": ("x",), "d": ("b", "c"), "e": ("a", "d")}), 3, 2, 16.0),
])
def test_pipedream_is_the_best_chain_of_its_states(graph: OpGraph, num_devices: int, size: int,
                                                   memory_gib: float) -> None:
    request = _request(graph, num_devices, size, memory_limit=memory_gib * GiB)
    expected = _exhaustive_tps(request, size)
    found = plan_candidates(graph, request.costs, request.cluster, 8, planner="pipedream", micro_batch_sizes=(size,),
                            memory_limit=memory_gib * GiB)
    if expected == float("inf"):
        assert not found
    else:
        assert min(p.predicted_tps_ms for p in found) == pytest.approx(expected, rel=1e-9)


def test_pipedream_equals_sequential_on_a_chain() -> None:
    graph = chain_graph(9)
    request = _request(graph, 4, 4)
    tps = {name: min(p.predicted_tps_ms for p in plan_candidates(graph, request.costs, request.cluster, 8,
                                                                     planner=name))
           for name in ("pipedream", "sequential")}
    assert tps["sequential"] == pytest.approx(tps["pipedream"], rel=TOLERANCE)


def test_pipedream_beats_one_order_on_branches() -> None:
    """The antichain DAG holds every downset, so PipeDream is never worse than one topological order."""
    graph = branches_graph(3, 2)
    request = _request(graph, 4, 4)
    tps = {name: min(p.predicted_tps_ms for p in plan_candidates(graph, request.costs, request.cluster, 8,
                                                                     planner=name))
           for name in ("pipedream", "sequential")}
    assert tps["pipedream"] <= tps["sequential"] * (1 + TOLERANCE)


def test_pipedream_gives_up_with_the_states_built_and_the_fix() -> None:
    graph = branches_graph(8, 3)  # 4^8 downsets
    with pytest.raises(AntichainLimitError):
        antichain_dag(_request(graph, 4, 4).units, float("inf"), 1000)
    with pytest.raises(PlanningError, match=r"antichain states built .*granularity layer.*'graphpipe'"):
        plan_candidates(graph, make_costs(graph), make_cluster(4), 4, planner="pipedream", time_limit_s=0.01)


def test_pipedream_gives_up_at_the_deadline_during_the_dp() -> None:
    graph = branches_graph(3, 3)
    request = _request(graph, 4, 4)
    start = time.perf_counter()
    with pytest.raises(PlanningError, match=r"gave up after 1e-09 s: the antichain DAG .* has \d+ states"):
        plan_candidates(graph, request.costs, request.cluster, 8, planner="pipedream", time_limit_s=1e-9)
    assert time.perf_counter() - start < 5


def test_pipedream_gives_up_past_its_pair_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = branches_graph(3, 3)  # 4^3 states of the branches, 3 more of the input and the join
    monkeypatch.setattr(pipedream, "MAX_PAIRS", 100)
    with pytest.raises(PlanningError, match=r"has 67 states and more than 100 stages between them \(at least "
                                            r"\d+, from \d+ of its states\)"):
        plan_candidates(graph, make_costs(graph), make_cluster(4), 4, planner="pipedream")
