"""PlanOptions: one checked value for how to plan, the same as its fields given as keywords."""

from __future__ import annotations

import dataclasses

import pytest

from graphpipe.errors import PlanningError
from graphpipe.planner.api import plan_candidates
from graphpipe.planner.options import PlanOptions
from graphpipe.planning import plan
from tests.planner.factories import branches_graph, make_cluster, make_costs


def test_keywords_build_the_same_options_as_the_value() -> None:
    graph = branches_graph(2, 3)
    costs, cluster = make_costs(graph, overhead_ms=0.3), make_cluster(4)
    options = PlanOptions(planner="sequential", micro_batch_sizes=(2, 4), rank_by="tps")
    by_value = plan(graph, costs, cluster, 8, options)
    by_keywords = plan(graph, costs, cluster, 8, planner="sequential", micro_batch_sizes=[2, 4], rank_by="tps")
    assert dataclasses.replace(by_value, search_time_s=0) == dataclasses.replace(by_keywords, search_time_s=0)
    assert by_value.planner == "sequential"


def test_keywords_refine_a_given_value() -> None:
    graph = branches_graph(2, 3)
    plans = plan_candidates(graph, make_costs(graph), make_cluster(4), 8, PlanOptions(planner="sequential"),
                            micro_batch_sizes=(4,))
    assert {p.stages[0].micro_batch_size for p in plans} == {4} and all(p.planner == "sequential" for p in plans)


@pytest.mark.parametrize(("fields", "message"), [
    ({"rank_by": "speed"}, "unknown ranking 'speed'"),
    ({"granularity": "block"}, "unknown granularity 'block'"),
    ({"memory_limit": 0}, "memory_limit must be positive"),
    ({"max_downsets": -5}, "max_downsets must be positive"),
])
def test_bad_options_are_refused_once_with_the_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(PlanningError, match=message):
        PlanOptions(**fields)  # type: ignore[arg-type]


def test_an_unknown_keyword_names_the_known_options() -> None:
    graph = branches_graph(2, 1)
    with pytest.raises(PlanningError, match=r"unknown plan option.*mini_batch.*the options are planner"):
        plan(graph, make_costs(graph), make_cluster(2), 4, mini_batch=4)


def test_an_unknown_planner_names_the_planners() -> None:
    graph = branches_graph(2, 1)
    with pytest.raises(PlanningError, match="unknown planner 'nope'; choose one of graphpipe"):
        plan(graph, make_costs(graph), make_cluster(2), 4, planner="nope")
