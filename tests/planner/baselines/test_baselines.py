"""The baselines: sequential stage graphs, PipeDream and Piper DPs, parallel-only, exhaustive limits."""

from __future__ import annotations

import pytest

from graphpipe.errors import PlanningError
from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.baselines.exhaustive import set_partitions
from graphpipe.planner.baselines.piper import enumerate_downsets
from graphpipe.planner.sp_dp import TOLERANCE
from tests.planner.factories import branches_graph, chain_graph, make_cluster, make_costs


@pytest.mark.parametrize("planner", ["sequential", "pipedream", "piper"])
def test_sequential_planners_make_chains(planner: str) -> None:
    graph = branches_graph(3, 2)
    plan = plan_candidates(graph, make_costs(graph), make_cluster(4), 4, planner=planner, micro_batch_sizes=[1])[0]
    assert plan.depth == plan.num_stages  # ordering edges chain the stages
    assert [s.in_flight_samples for s in plan.stages] == list(range(plan.num_stages, 0, -1))


def test_pipedream_and_piper_agree_on_a_chain() -> None:
    graph = chain_graph(8)
    costs = make_costs(graph, {f"l{i}": 1.0 + i % 3 for i in range(8)}, overhead_ms=0.1)
    tps = {name: min(p.predicted_tps_ms for p in plan_candidates(graph, costs, make_cluster(4), 8, planner=name))
           for name in ("pipedream", "piper", "sequential")}
    assert tps["piper"] == pytest.approx(tps["pipedream"], rel=1e-9)
    assert tps["sequential"] == pytest.approx(tps["pipedream"], rel=TOLERANCE)


def test_piper_gives_up_on_many_branches() -> None:
    graph = branches_graph(6, 4)
    with pytest.raises(PlanningError, match="no strategy within 500 downsets"):
        plan_candidates(graph, make_costs(graph), make_cluster(4), 4, planner="piper",
                        max_downsets=500)


def test_downsets_of_a_diamond() -> None:
    graph = branches_graph(2, 1)  # x, b0_0, b1_0, cat, head, output
    request = make_request(graph, make_costs(graph), make_cluster(2), 2)
    downsets = enumerate_downsets(request, 100, float("inf"))
    # over units: the input x rides with its first reader b0_0, so {}, a, b, a+b, then +cat, +head, +output
    assert len(downsets) == 7
    assert downsets[0] == (1 << len(graph) - 1) - 1 and downsets[-1] == 0


def test_parallel_only_uses_the_sequential_micro_batch() -> None:
    graph = branches_graph(2, 3)
    costs = make_costs(graph, overhead_ms=0.5)
    seq = plan_candidates(graph, costs, make_cluster(4), 8, planner="sequential")[0]
    only = plan_candidates(graph, costs, make_cluster(4), 8, planner="parallel-only")
    assert {p.stages[0].micro_batch_size for p in only} == {seq.stages[0].micro_batch_size}


def test_exhaustive_refuses_big_graphs() -> None:
    graph = chain_graph(12)
    with pytest.raises(PlanningError, match="at most 10 ops"):
        plan_candidates(graph, make_costs(graph), make_cluster(2), 2, planner="exhaustive")


def test_set_partitions_count_is_bell() -> None:
    assert sum(1 for _ in set_partitions("abcd", 4)) == 15
    assert sum(1 for _ in set_partitions("abcd", 2)) == 8
