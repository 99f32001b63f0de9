"""gp.plan: candidates ranked by simulation or TPS; search time, planner and predictions filled in."""

from __future__ import annotations

import pytest

import graphpipe as gp
from graphpipe.errors import PlanningError
from graphpipe.planner.stage_graph import Plan
from graphpipe.planning import plan
from tests.planner.factories import branches_graph, make_cluster, make_costs


def test_rank_by_tps_picks_the_smallest_tps() -> None:
    graph = branches_graph(2, 3)
    costs = make_costs(graph, overhead_ms=0.3)
    best = plan(graph, costs, make_cluster(4), 8, rank_by="tps")
    assert best.planner == "graphpipe" and best.search_time_s > 0
    assert best.predicted_iteration_s == pytest.approx(8 * best.predicted_tps_ms / 1e3)
    assert best.predicted_samples_per_s == pytest.approx(1e3 / best.predicted_tps_ms)


def test_rank_by_simulation_uses_the_simulated_iteration() -> None:
    from graphpipe.simulation.simulator import simulate

    graph = branches_graph(2, 3)
    costs = make_costs(graph, overhead_ms=0.3)
    cluster = make_cluster(4)
    best = plan(graph, costs, cluster, 8, planner="sequential")
    result = simulate(best, costs, cluster)
    assert best.planner == "sequential"
    assert best.predicted_iteration_s == pytest.approx(result.iteration_time_s)
    assert best.predicted_samples_per_s == pytest.approx(result.samples_per_s)
    assert Plan.from_dict(best.to_dict()) == best


def test_public_name_is_callable_even_after_the_plan_package_is_imported() -> None:
    import graphpipe.planner.api  # noqa: F401 - binds graphpipe.planner to the sub-package

    graph = branches_graph(2, 1)
    assert gp.plan(graph, make_costs(graph), make_cluster(2), 2, rank_by="tps").num_stages >= 1


def test_unknown_ranking() -> None:
    graph = branches_graph(2, 1)
    with pytest.raises(PlanningError, match="unknown ranking"):
        plan(graph, make_costs(graph), make_cluster(2), 2, rank_by="luck")
