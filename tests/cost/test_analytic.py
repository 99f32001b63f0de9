"""The analytic roofline: exact FLOPs, monotone times, efficiency that grows with the micro-batch."""

from __future__ import annotations

import itertools

import pytest

from graphpipe.cost.analytic import analytic_costs, default_micro_batch_sizes, matmul_efficiency
from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.flops import op_flops
from graphpipe.cost.presets import device_preset
from graphpipe.errors import CostError
from graphpipe.graph.op_graph import OpGraph, OpNode
from tests.cost.graphs import linear_op, meta, mixed_graph, mlp_graph

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
# A device without kernel overhead and an instant memory: time is FLOPs over the peak.
IDEAL = Device(name="ideal", peak_tflops=1.0, mem_bandwidth_gb_per_s=1e12, memory_bytes=2**30,
               kernel_overhead_us=0.0, matmul_half_rows=0.0)


def test_linear_time_on_an_ideal_device_is_its_exact_flops() -> None:
    graph = mlp_graph(batch=8, width=64, hidden=256)
    table = analytic_costs(graph, IDEAL, micro_batch_sizes=[8, 32])
    for batch in (8, 32):
        fwd = table.at("fc1", batch).fwd_ms
        assert fwd == pytest.approx(2 * batch * 64 * 256 / 1e12 * 1e3)
        assert table.at("fc1", batch).bwd_ms == pytest.approx(2 * fwd)
    assert op_flops(graph.op("fc1")) == 2 * 8 * 64 * 256


@pytest.mark.parametrize("device", ["v100-16gb", "h100-80gb", "cpu"])
def test_every_time_grows_with_the_micro_batch(device: str) -> None:
    for graph in (mlp_graph(), mixed_graph()):
        table = analytic_costs(graph, device, micro_batch_sizes=SIZES)
        for name in graph.names:
            fwd = [table.at(name, b).fwd_ms for b in SIZES]
            bwd = [table.at(name, b).bwd_ms for b in SIZES]
            assert fwd == sorted(fwd) and bwd == sorted(bwd), name


def test_time_per_sample_falls_for_small_micro_batches() -> None:
    graph = mixed_graph()
    table = analytic_costs(graph, "v100-16gb", micro_batch_sizes=SIZES)
    per_sample = [sum(table.at(n, b).fwd_ms + table.at(n, b).bwd_ms for n in graph.names) / b for b in SIZES]
    assert all(later < earlier for earlier, later in itertools.pairwise(per_sample[:5]))
    assert per_sample[0] > 2 * per_sample[-1]


def test_small_matmuls_do_not_reach_the_peak() -> None:
    assert matmul_efficiency(1, 64) < 0.02 < matmul_efficiency(64, 64) == 0.5 < matmul_efficiency(4096, 64) < 1
    no_overhead = Device(name="g", peak_tflops=100.0, mem_bandwidth_gb_per_s=1e9, memory_bytes=2**30,
                         kernel_overhead_us=0.0)
    op = linear_op("fc", "x", 4, 4096, 4096, lead=(16,))  # compute bound: 64 rows per call at batch 4
    graph = OpGraph(name="g", example_batch_size=4, ops=(
        OpNode(name="x", kind="placeholder", target="x", outputs=(meta(4, 16, 4096),)), op,
        OpNode(name="output", kind="output", target="output", inputs=("fc",), outputs=(meta(4, 16, 4096),))))
    table = analytic_costs(graph, no_overhead, micro_batch_sizes=[4])
    ideal_ms = 2 * 64 * 4096 * 4096 / 100e12 * 1e3
    assert table.at("fc", 4).fwd_ms == pytest.approx(2 * ideal_ms)  # half the peak at 64 rows


def test_sizes_scale_with_the_batch_and_weights_do_not() -> None:
    graph = mlp_graph(batch=8)
    table = analytic_costs(graph, "a100-80gb", micro_batch_sizes=[2, 8, 32])
    for op in graph.ops:
        small, big = table.at(op.name, 2), table.at(op.name, 32)
        assert big.output_bytes == 16 * small.output_bytes == op.output_bytes * 4
        assert big.act_bytes == 16 * small.act_bytes
        assert big.param_bytes == small.param_bytes == op.param_bytes
    assert table.at("fc1", 8).act_bytes == 8 * 64 * 4  # a Linear keeps its input
    assert table.at("add", 8).act_bytes == 0  # an addition keeps nothing


def test_free_ops_take_no_time_but_hand_over_their_outputs() -> None:
    graph = mixed_graph()
    table = analytic_costs(graph)
    for name in ("tokens", "ids", "getitem", "flat", "output"):
        cost = table.at(name, 16)
        assert cost.fwd_ms == cost.bwd_ms == 0.0 and cost.act_bytes == 0
    assert table.at("tokens", 4).output_bytes == graph.op("tokens").output_bytes


def test_defaults_device_name_and_json_round_trip(tmp_path) -> None:
    graph = mixed_graph()
    table = analytic_costs(graph)
    assert table.source == "analytic" and table.device == "v100-16gb"
    assert table.micro_batch_sizes == default_micro_batch_sizes(graph.example_batch_size) == tuple(
        2**k for k in range(10))
    assert default_micro_batch_sizes(1000)[-1] == 1024
    path = str(tmp_path / "costs.json")
    table.save(path)
    loaded = CostTable.load(path)
    assert loaded.entries == table.entries and loaded.source == "analytic"
    assert analytic_costs(graph, device_preset("v100-16gb")).entries == table.entries


def test_bad_requests_raise_cost_errors() -> None:
    with pytest.raises(CostError, match="positive"):
        analytic_costs(mlp_graph(), micro_batch_sizes=[0, 2])
    with pytest.raises(CostError, match="choose one of"):
        analytic_costs(mlp_graph(), "k80")
