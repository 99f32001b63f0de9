"""Stage cost: compute at b / d per device, communication over the boundary, amortised all-reduce."""

from __future__ import annotations

import pytest

from graphpipe.cost.formulas.communication import p2p_ms, ring_all_reduce_ms
from graphpipe.cost.formulas.time_per_sample import ADAM_PASSES
from graphpipe.planner.stage_cost import CostModel
from graphpipe.stages.crossing import crossing_tensors
from tests.planner.factories import branches_graph, chain_graph, make_cluster, make_costs


def test_compute_is_read_at_the_per_device_batch() -> None:
    graph = chain_graph(3)
    model = CostModel(graph, make_costs(graph, fwd_ms=1.0), make_cluster(4), global_batch_size=8)
    one = model.stage_cost(("l0", "l1"), num_devices=1, micro_batch_size=4)
    two = model.stage_cost(("l0", "l1"), num_devices=2, micro_batch_size=4)
    assert one.fwd_ms == pytest.approx(2 * 4.0) and one.bwd_ms == pytest.approx(2 * 8.0)
    assert two.fwd_ms == pytest.approx(one.fwd_ms / 2)


def test_tps_adds_communication_and_all_reduce_shares() -> None:
    graph = chain_graph(3)
    cluster = make_cluster(2, devices_per_node=2, latency_us=10.0)
    model = CostModel(graph, make_costs(graph, param_bytes=1 << 20, output_bytes=1000), cluster, global_batch_size=8)
    cost = model.stage_cost(("l1",), num_devices=2, micro_batch_size=4)
    messages, bytes_per_sample = model.boundary(("l1",))
    assert (messages, bytes_per_sample) == (2, 2000.0)  # receives l0, sends l1
    comm = p2p_ms(cluster.intra_node, messages, bytes_per_sample * 2)
    reduce_ms = ring_all_reduce_ms(cluster.intra_node, 1 << 20, 2)
    assert cost.comm_ms == pytest.approx(comm) and cost.all_reduce_ms == pytest.approx(reduce_ms)
    step_ms = ADAM_PASSES * (1 << 20) / 1000e9 * 1e3  # the optimizer step streams the state (no fixed overhead here)
    assert cost.step_ms == pytest.approx(step_ms)
    assert cost.tps_ms == pytest.approx((cost.fwd_ms + cost.bwd_ms + comm) / 4 + (reduce_ms + step_ms) / 8)


def test_ring_all_reduce_formula() -> None:
    link = make_cluster(4).intra_node
    assert ring_all_reduce_ms(link, 1e9, 1) == 0.0
    assert ring_all_reduce_ms(link, 1e9, 4) == pytest.approx(2 * 3 / 4 * 1e9 / (100e9) * 1e3)


def test_crossing_tensors_name_producers_once_per_stage_pair() -> None:
    graph = branches_graph(2, 1)
    stage_of = {"x": 0, "b0_0": 1, "b1_0": 2, "cat": 3, "head": 3, "output": 3}
    tensors = crossing_tensors(graph, stage_of)
    assert tensors == {(1, 3): ("b0_0",), (2, 3): ("b1_0",)}  # the input x is read from the data, not sent


def test_a_stage_is_costed_once_and_the_same_as_with_its_boundary_given() -> None:
    graph = chain_graph(3)
    model = CostModel(graph, make_costs(graph, output_bytes=1000), make_cluster(4), global_batch_size=8)
    first = model.stage_cost(("l0", "l1"), num_devices=2, micro_batch_size=4)
    assert model.stage_cost(["l0", "l1"], num_devices=2, micro_batch_size=4) is first  # cached
    given = model.stage_cost(("l0", "l1"), 2, 4, boundary=model.boundary(("l0", "l1")),
                             params=sum(model.param_bytes[op] for op in ("l0", "l1")))
    assert given == first and given is not first  # the caller's numbers are not cached
