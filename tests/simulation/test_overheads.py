"""Per-action and optimizer-step overheads of the device, and one latency per crossing tensor."""

from __future__ import annotations

import dataclasses

import pytest

from graphpipe.simulation.simulator import simulate
from graphpipe.stages.stage_graph import Plan, StageEdge
from tests.simulation.factories import chain, make_cluster, make_costs


def test_action_overheads_add_once_per_forward_and_backward() -> None:
    """Uniform chain: makespan (m + p - 1)(f + b + overheads) under GPipe, plus the step overhead."""
    num_stages, num_micro = 3, 4
    base = make_cluster(num_stages)
    plan = chain(num_stages, 2, 2 * num_micro, cluster=base)
    costs = make_costs(plan, 1.0, 2.0)
    device = dataclasses.replace(base.device, fwd_action_overhead_us=500.0, bwd_action_overhead_us=1500.0,
                                 step_overhead_us=3000.0)
    cluster = dataclasses.replace(base, device=device)
    plain = simulate(plan, costs, base, "gpipe")
    loaded = simulate(plan, costs, cluster, "gpipe")
    f, b = 2 * 1.0 + 0.5, 2 * 2.0 + 1.5
    assert plain.iteration_time_s * 1e3 == pytest.approx((num_micro + num_stages - 1) * (2 + 4))
    assert loaded.iteration_time_s * 1e3 == pytest.approx((num_micro + num_stages - 1) * (f + b) + 3.0)
    forwards = loaded.timeline.of_stage(0, "forward")
    assert all(e.duration_ms == pytest.approx(f) for e in forwards)
    steps = loaded.timeline.of_stage(0, "step")
    assert [e.duration_ms for e in steps] == pytest.approx([3.0])


def test_each_crossing_tensor_pays_the_link_latency() -> None:
    """Two stages, one micro-batch: an edge of k tensors costs k latencies each way."""
    cluster = make_cluster(2, devices_per_node=2, latency_us=200.0)
    one = chain(2, 1, 1, bytes_per_sample=1e6, cluster=cluster)
    three_edges = (StageEdge(src=0, dst=1, tensors=("a", "b", "c"), bytes_per_sample=1e6),)
    three = Plan(graph_name=one.graph_name, stages=one.stages, edges=three_edges,
                 global_batch_size=1, num_devices=2, planner="test", cluster=one.cluster)
    costs = make_costs(one, 1.0, 2.0)
    t_one = simulate(one, costs).iteration_time_s * 1e3
    t_three = simulate(three, costs).iteration_time_s * 1e3
    assert t_three - t_one == pytest.approx(2 * 2 * 0.2)
