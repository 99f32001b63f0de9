"""validate_plan catches every broken invariant, with the numbers in the message."""

from __future__ import annotations

import dataclasses
import random

import pytest

from graphpipe.errors import PlanValidationError
from graphpipe.planner.api import plan_candidates
from graphpipe.stages.crossing import crossing_tensors
from graphpipe.stages.stage_graph import Plan, Stage, StageEdge
from graphpipe.stages.validate import _acyclic, _check_convex, validate_plan
from tests.planner.factories import branches_graph, make_cluster, make_costs, make_graph

GRAPH = branches_graph(2, 1)  # x -> b0_0, b1_0 -> cat -> head -> output


def plan_of(groups: list[tuple[str, ...]], edges: list[tuple[int, int, tuple[str, ...]]],
            in_flight: list[int] | None = None) -> Plan:
    counts = in_flight or [2] * len(groups)
    stages = tuple(Stage(idx=i, ops=ops, ranks=(i,), micro_batch_size=1, in_flight_samples=counts[i])
                   for i, ops in enumerate(groups))
    return Plan(graph_name="g", stages=stages, global_batch_size=4, num_devices=len(groups), planner="test",
                edges=tuple(StageEdge(src=a, dst=b, tensors=t, bytes_per_sample=1.0) for a, b, t in edges))


def test_planner_output_is_valid() -> None:
    cluster = make_cluster(4)
    for plan in plan_candidates(GRAPH, make_costs(GRAPH), cluster, 4):
        validate_plan(plan, GRAPH, cluster)


def test_valid_hand_made_plan() -> None:
    """The input x is read from the data by every stage that needs it: no edge carries it."""
    plan = plan_of([("x", "b0_0"), ("b1_0",), ("cat", "head", "output")],
                   [(0, 2, ("b0_0",)), (1, 2, ("b1_0",))], [2, 2, 1])
    validate_plan(plan, GRAPH)


def test_an_edge_carrying_a_model_input_is_refused() -> None:
    plan = plan_of([("x", "b0_0"), ("b1_0",), ("cat", "head", "output")],
                   [(0, 1, ("x",)), (0, 2, ("b0_0",)), (1, 2, ("b1_0",))], [3, 2, 1])
    with pytest.raises(PlanValidationError, match="carries"):
        validate_plan(plan, GRAPH)


def test_missing_op() -> None:
    plan = plan_of([("x", "b0_0"), ("cat", "head", "output")], [(0, 1, ("b0_0",))])
    with pytest.raises(PlanValidationError, match="in no stage"):
        validate_plan(plan, GRAPH)


def test_not_convex() -> None:
    plan = plan_of([("x", "b0_0", "head", "output"), ("b1_0", "cat")], [(0, 1, ("b0_0",))])
    with pytest.raises(PlanValidationError, match="not convex"):
        validate_plan(plan, GRAPH)


def test_wrong_edge_tensors() -> None:
    plan = plan_of([("x", "b0_0"), ("b1_0",), ("cat", "head", "output")],
                   [(0, 1, ("b0_0",)), (0, 2, ("b0_0",)), (1, 2, ("b1_0",))], [3, 2, 1])
    with pytest.raises(PlanValidationError, match="carries"):
        validate_plan(plan, GRAPH)


def test_wrong_in_flight() -> None:
    plan = plan_of([("x", "b0_0"), ("b1_0",), ("cat", "head", "output")],
                   [(0, 2, ("b0_0",)), (1, 2, ("b1_0",))], [1, 1, 1])
    with pytest.raises(PlanValidationError, match="in-flight"):
        validate_plan(plan, GRAPH)


def test_memory_too_large() -> None:
    plan = plan_candidates(GRAPH, make_costs(GRAPH), make_cluster(2), 4)[0]
    big = dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, memory_bytes=1 << 40) for s in plan.stages))
    with pytest.raises(PlanValidationError, match="GiB per device"):
        validate_plan(big, GRAPH, make_cluster(2))


def test_more_devices_than_the_cluster() -> None:
    plan = plan_candidates(GRAPH, make_costs(GRAPH), make_cluster(4), 4, micro_batch_sizes=[1])[0]
    with pytest.raises(PlanValidationError, match="devices"):
        validate_plan(plan, GRAPH, make_cluster(plan.world_size - 1))


def test_stages_without_a_cycle_are_convex() -> None:
    """`validate_structure` tests each stage's convexity only where the stages' data edges form a cycle: on random
    DAGs cut at random, wherever they form none, every stage passes the per-stage test. Both kinds of cut occur,
    and some cuts with a cycle are convex all the same (the per-stage test still decides those)."""
    rng = random.Random(7)
    seen = {"acyclic": 0, "not convex": 0, "cycle of convex stages": 0}
    for _ in range(400):
        names = [f"o{idx}" for idx in range(rng.randint(2, 9))]
        preds = {"x": ()} | {name: tuple(rng.sample(["x", *names[:idx]], min(idx + 1, rng.randint(1, 3))))
                             for idx, name in enumerate(names)}
        graph = make_graph(preds)
        stage_of = {op: rng.randrange(rng.randint(1, 4)) for op in graph.names}
        used = sorted(set(stage_of.values()))
        stage_of = {op: used.index(stage) for op, stage in stage_of.items()}
        plan = plan_of([tuple(op for op in graph.names if stage_of[op] == idx) for idx in range(len(used))], [])
        try:
            _check_convex(plan, graph, stage_of)
            convex = True
        except PlanValidationError:
            convex = False
        if _acyclic(list(range(len(used))), crossing_tensors(graph, stage_of)):
            assert convex, stage_of
            seen["acyclic"] += 1
        else:
            seen["not convex" if not convex else "cycle of convex stages"] += 1
    assert all(seen.values()), seen
