"""plan_candidates: one validated plan per micro-batch size; infeasible requests explained with numbers."""

from __future__ import annotations

import pytest

from graphpipe.errors import PlanningError
from graphpipe.planner.api import PLANNERS, default_micro_batch_sizes, plan_candidates
from graphpipe.stages.stage_graph import Plan
from tests.planner.factories import GiB, branches_graph, chain_graph, make_cluster, make_costs


def test_default_micro_batch_sizes_are_powers_of_two_dividing_the_batch() -> None:
    assert default_micro_batch_sizes(12) == (1, 2, 4)
    assert default_micro_batch_sizes(16) == (1, 2, 4, 8, 16)


def test_one_plan_per_micro_batch_size_best_first() -> None:
    graph = branches_graph(2, 3)
    plans = plan_candidates(graph, make_costs(graph, overhead_ms=0.3), make_cluster(4), 8)
    sizes = [p.stages[0].micro_batch_size for p in plans]
    assert set(sizes) <= {1, 2, 4, 8} and 8 in sizes
    assert [p.predicted_tps_ms for p in plans] == sorted(p.predicted_tps_ms for p in plans)
    for plan in plans:
        assert plan.search_time_s > 0 and plan.planner == "graphpipe"
        assert plan.lower_bound_samples_per_s >= plan.predicted_samples_per_s
        assert Plan.from_dict(plan.to_dict()) == plan


def test_registry_names() -> None:
    assert set(PLANNERS) == {"graphpipe", "sequential", "parallel-only", "pipedream", "piper", "exhaustive"}


def test_unknown_planner() -> None:
    graph = chain_graph(3)
    with pytest.raises(PlanningError, match="unknown planner"):
        plan_candidates(graph, make_costs(graph), make_cluster(2), 4, planner="nope")


@pytest.mark.parametrize("planner", sorted(set(PLANNERS) - {"exhaustive"}))
def test_more_devices_than_ops_go_to_data_parallelism(planner: str) -> None:
    """Two ops on 16 devices: every planner gives the stages several data-parallel devices each (small
    weights, so more devices pay), and the plans validate (`plan_candidates` checks them)."""
    graph = chain_graph(2)
    costs = make_costs(graph, param_bytes=1 << 10)
    best = plan_candidates(graph, costs, make_cluster(16), 64, planner=planner)[0]
    assert best.world_size > len(graph.ops) and max(s.data_parallel_degree for s in best.stages) > 1


def test_batch_not_divisible() -> None:
    graph = chain_graph(3)
    with pytest.raises(PlanningError, match="divides the mini-batch of 8"):
        plan_candidates(graph, make_costs(graph), make_cluster(2), 8, micro_batch_sizes=[3, 5])


def test_model_that_cannot_fit_says_how_much_is_needed() -> None:
    graph = chain_graph(4)
    costs = make_costs(graph, param_bytes=1 << 30)
    with pytest.raises(PlanningError, match=r"needs 16.00 GiB .* 2 devices of 8.00 GiB"):
        plan_candidates(graph, costs, make_cluster(2), 4, memory_limit=8 * GiB)
    with pytest.raises(PlanningError, match=r"op 'l0' alone needs 4.00 GiB"):
        plan_candidates(graph, costs, make_cluster(2), 4, memory_limit=2 * GiB)


def test_a_model_too_big_for_all_devices_together_says_how_many_it_takes() -> None:
    graph = chain_graph(4)
    costs = make_costs(graph, param_bytes=1 << 30)  # 4 x 4 GiB of weights, gradients and Adam state, and a few bytes
    with pytest.raises(PlanningError, match=r"more than 2 devices of 6.00 GiB hold together: use at least 3 devices "
                                            r"of 6.00 GiB, or devices of at least 8.01 GiB") as err:
        plan_candidates(graph, costs, make_cluster(2), 4, memory_limit=6 * GiB, micro_batch_sizes=[1])
    assert "micro-batch-sizes" not in str(err.value)  # one sample per micro-batch is already the least


def test_a_model_that_fits_in_total_but_not_in_stages_says_so() -> None:
    graph = chain_graph(3)
    costs = make_costs(graph, param_bytes=1 << 30)  # three ops of 4 GiB on 2 devices of 7 GiB: one holds 8 GiB
    with pytest.raises(PlanningError, match=r"which 2 devices of 7.00 GiB hold together, but no split into stages"):
        plan_candidates(graph, costs, make_cluster(2), 4, memory_limit=7 * GiB, micro_batch_sizes=[1])
