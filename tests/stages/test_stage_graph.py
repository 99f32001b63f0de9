"""Plan invariants, structure queries and JSON round-trip."""

from __future__ import annotations

import pytest

from graphpipe.errors import PlanValidationError
from graphpipe.stages.stage_graph import Plan, Stage, StageEdge


def fan_plan() -> Plan:
    """s0 -> (s1, s2) -> s3: two parallel stages between a fork and a join."""
    stages = (
        Stage(idx=0, ops=("x", "a"), ranks=(0,), micro_batch_size=2, in_flight_samples=6),
        Stage(idx=1, ops=("b",), ranks=(1, 2), micro_batch_size=2, in_flight_samples=4),
        Stage(idx=2, ops=("c",), ranks=(3,), micro_batch_size=2, in_flight_samples=4),
        Stage(idx=3, ops=("d", "output"), ranks=(4,), micro_batch_size=2, in_flight_samples=2),
    )
    edges = (StageEdge(src=0, dst=1, tensors=("a",), bytes_per_sample=64),
             StageEdge(src=0, dst=2, tensors=("a",), bytes_per_sample=64),
             StageEdge(src=1, dst=3, tensors=("b",), bytes_per_sample=32),
             StageEdge(src=2, dst=3, tensors=("c",), bytes_per_sample=32))
    return Plan(graph_name="fan", stages=stages, edges=edges, global_batch_size=8, num_devices=5, planner="test")


def test_structure() -> None:
    plan = fan_plan()
    assert plan.depth == 3 and plan.world_size == 5 and not plan.is_sequential
    assert plan.successors[0] == (1, 2) and plan.predecessors[3] == (1, 2)
    assert plan.stage_of_rank(2).idx == 1 and plan.stage_of_op("d").idx == 3
    assert plan.num_micro_batches(0) == 4
    assert plan.edge(1, 3).tensors == ("b",)


def test_round_trip(tmp_path) -> None:
    plan = fan_plan()
    path = str(tmp_path / "plan.json")
    plan.save(path)
    again = Plan.load(path)
    assert again.to_dict() == plan.to_dict()
    assert again.stages == plan.stages and again.edges == plan.edges


def test_invariants() -> None:
    plan = fan_plan()
    with pytest.raises(PlanValidationError, match="does not split"):
        Stage(idx=0, ops=("a",), ranks=(0, 1), micro_batch_size=3, in_flight_samples=3)
    with pytest.raises(PlanValidationError, match="backwards"):
        StageEdge(src=2, dst=1, tensors=("a",), bytes_per_sample=1)
    with pytest.raises(PlanValidationError, match="partition"):
        Plan(graph_name="g", stages=(plan.stages[0], Stage(idx=1, ops=("b",), ranks=(0,), micro_batch_size=2,
                                                           in_flight_samples=2)),
             edges=(), global_batch_size=8, num_devices=2, planner="t")
    with pytest.raises(PlanValidationError, match="does not divide"):
        Plan(graph_name="g", stages=plan.stages, edges=plan.edges, global_batch_size=7, num_devices=5, planner="t")
    with pytest.raises(PlanValidationError, match="not a graphpipe plan"):
        Plan.from_dict({"format": "other"})
