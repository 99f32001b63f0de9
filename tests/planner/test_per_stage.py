"""Per-stage micro-batch sizes: a refinement that never worsens TPS and keeps memory and the rule."""

from __future__ import annotations

from graphpipe.planner.api import plan_candidates
from graphpipe.stages.validate import validate_plan
from tests.planner.factories import GiB, chain_graph, make_cluster, make_costs


def test_bottleneck_stage_takes_a_larger_micro_batch_than_the_memory_bound_one() -> None:
    """Chain of 3 ops, one per device (weights); the last op's activations cap a uniform size at 2,
    while the first op, the bottleneck, runs better at 4 (b_i > b_j: the upstream micro-batch is split)."""
    graph = chain_graph(3)
    costs = make_costs(graph, {"l0": 3.0, "l1": 1.0, "l2": 1.0}, overhead_ms=2.0,
                       act_bytes={"x": 0, "l0": 1 << 20, "l1": 1 << 20, "l2": 1 << 28, "output": 0},
                       param_bytes=1 << 29)
    cluster = make_cluster(3)
    kwargs = {"micro_batch_sizes": (1, 2, 4), "memory_limit": 2.6 * GiB}
    uniform = plan_candidates(graph, costs, cluster, 8, **kwargs)[0]
    mixed = plan_candidates(graph, costs, cluster, 8, per_stage_micro_batch=True, **kwargs)[0]
    validate_plan(mixed, graph, cluster, memory_limit=2.6 * GiB)
    assert uniform.stages[0].micro_batch_size == 2
    assert mixed.predicted_tps_ms < uniform.predicted_tps_ms
    sizes = [s.micro_batch_size for s in mixed.stages]
    assert sizes[0] == 4 and max(sizes[1:]) <= 2 and mixed.schedule == "kfkb"
    # n_j + b_i, rounded up to whole micro-batches of b_i = 4 (the stage holds 4-sample micro-batches)
    expected = -(-(mixed.stages[1].in_flight_samples + 4) // 4) * 4
    assert mixed.stages[0].in_flight_samples == expected


def test_refined_plan_memory_is_what_the_simulator_holds() -> None:
    """With b_i > b_j the planner's memory per stage equals the simulated peak (whole micro-batches)."""
    from graphpipe.simulation.simulator import simulate

    graph = chain_graph(3)
    costs = make_costs(graph, {"l0": 3.0, "l1": 1.0, "l2": 1.0}, overhead_ms=2.0,
                       act_bytes={"x": 0, "l0": 1 << 20, "l1": 1 << 20, "l2": 1 << 28, "output": 0},
                       param_bytes=1 << 29)
    cluster = make_cluster(3)
    mixed = plan_candidates(graph, costs, cluster, 8, per_stage_micro_batch=True, micro_batch_sizes=(1, 2, 4),
                            memory_limit=2.6 * GiB)[0]
    result = simulate(mixed, costs, cluster, schedule=mixed.schedule)
    sizes = [s.micro_batch_size for s in mixed.stages]
    assert sizes[0] == 4 > sizes[1]
    for stage in mixed.stages:
        assert result.peak_in_flight_samples[stage.idx] == stage.in_flight_samples
        assert all(result.peak_memory_bytes[rank] == stage.memory_bytes for rank in stage.ranks)
