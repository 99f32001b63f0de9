"""Progress of a plan (`PlanOptions.progress`): every planner reports each micro-batch size it has searched and
the ranking each candidate, every phase from 0 to its total in steps of one; the plan is the same with it."""

from __future__ import annotations

import pytest

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.cluster import Cluster
from graphpipe.graph.capture import capture
from graphpipe.models import load_model
from graphpipe.planner.progress import PlanProgress, size_steps
from graphpipe.planning import plan
from tests.planner.factories import branches_graph, make_cluster, make_costs


def runs(events: list[PlanProgress]) -> list[tuple[str, list[PlanProgress]]]:
    """The events as runs of one phase each, in order."""
    out: list[tuple[str, list[PlanProgress]]] = []
    for event in events:
        if not out or out[-1][0] != event.phase or event.done == 0:
            out.append((event.phase, []))
        out[-1][1].append(event)
    return out


def check_counts(steps: list[PlanProgress]) -> None:
    """0, 1, ..., total, each step after the first naming its micro-batch size."""
    total = steps[0].total
    assert [step.done for step in steps] == list(range(total + 1))
    assert {step.total for step in steps} == {total}
    assert steps[0].detail == "" and all(step.detail.startswith("micro-batch ") for step in steps[1:])


def test_size_steps_reports_nothing_without_a_callback_and_each_size_with_one() -> None:
    assert size_steps(None, "chains", 3) is None
    events: list[PlanProgress] = []
    done = size_steps(events.append, "chains", 2)
    assert done is not None and events == [PlanProgress("chains", 0, 2)]
    done(8)
    done(4)
    assert events[1:] == [PlanProgress("chains", 1, 2, "micro-batch 8"), PlanProgress("chains", 2, 2, "micro-batch 4")]


@pytest.mark.parametrize(("planner", "searches"), [
    ("graphpipe", [["stage graphs", "chains"]]), ("sequential", [["chains"]]), ("pipedream", [["chains"]]),
    ("piper", [["chains"]]), ("parallel-only", [["chains"], ["stage graphs", "chains"]]),
])
@pytest.mark.parametrize("rank_by", ["simulation", "tps"])
def test_every_planner_reports_each_size_then_the_ranking(planner: str, searches: list[list[str]],
                                                         rank_by: str) -> None:
    """parallel-only plans twice: the sequential plan it takes its micro-batch from, then its own at that size."""
    graph = branches_graph(2, 3)
    costs, cluster = make_costs(graph, overhead_ms=0.3), make_cluster(4)
    events: list[PlanProgress] = []
    found = plan(graph, costs, cluster, 8, planner=planner, rank_by=rank_by, progress=events.append)
    ranking = ["ranking"] if rank_by == "simulation" else []
    held = "(rival: held to the chain's micro-batch)"
    rivals = ["chains (rival: sequential)", "ranking (rival: sequential)", f"stage graphs {held}", f"chains {held}",
              f"ranking {held}"] if planner == "graphpipe" and rank_by == "simulation" else []  # no layer rival
    found_runs = runs(events)
    assert [phase for phase, _ in found_runs] == \
        [phase for plan_phases in searches for phase in plan_phases + ranking] + rivals
    for _, steps in found_runs:
        check_counts(steps)
    assert [steps[0].total for phase, steps in found_runs if phase != "ranking"][:len(searches[0])] == \
        [4] * len(searches[0])  # micro-batches 1, 2, 4, 8 (parallel-only's own search: its one size)
    assert found.to_dict() | {"search_time_s": 0} == plan(graph, costs, cluster, 8, planner=planner,
                                                          rank_by=rank_by).to_dict() | {"search_time_s": 0}


def test_auto_says_which_phases_are_the_refinement() -> None:
    model, inputs, _, _ = load_model("transformer", "tiny")
    graph = capture(model, inputs, name="transformer", capture="fx")
    events: list[PlanProgress] = []
    plan(graph, analytic_costs(graph, "v100-16gb"), Cluster.preset("summit", 2), 8, granularity="auto",
         progress=events.append)
    found_runs = runs(events)
    assert [phase for phase, _ in found_runs] == ["stage graphs", "ranking", "stage graphs (refined)",
                                                  "ranking (refined)", "chains (rival: sequential)",
                                                  "ranking (rival: sequential)", "chains (refined) (rival: sequential)",
                                                  "ranking (refined) (rival: sequential)",
                                                  *[f"{phase} (rival: held to the chain's micro-batch)" for phase in
                                                    ("stage graphs", "ranking", "stage graphs (refined)",
                                                     "ranking (refined)")]]
    for _, steps in found_runs:
        check_counts(steps)
