"""Calibration recovers a device from the table it produced, and reports how well it fits."""

from __future__ import annotations

import pytest

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.calibrate import calibrate_device, fit_device
from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.errors import CostError
from graphpipe.graph.op_graph import OpGraph, OpNode
from tests.cost.graphs import linear_op, meta, mixed_graph, mlp_graph, unary_op

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
TRUE = Device(name="truth", peak_tflops=0.08, elementwise_tflops=0.01, mem_bandwidth_gb_per_s=12.0,
              memory_bytes=2**30, kernel_overhead_us=9.0, matmul_half_rows=8.0)
BASE = Device(name="guess", peak_tflops=1.0, elementwise_tflops=0.1, mem_bandwidth_gb_per_s=100.0,
              memory_bytes=3 * 2**30, kernel_overhead_us=50.0)


def mixed_bounds_graph(batch: int = 64) -> OpGraph:
    """A big compute-bound GEMM, memory-bound elementwise ops, and tiny overhead-bound ops."""
    return OpGraph(name="bounds", example_batch_size=batch, ops=(
        OpNode(name="x", kind="placeholder", target="x", outputs=(meta(batch, 1024),)),
        linear_op("big", "x", batch, 1024, 4096),
        unary_op("gelu", "big", "GELU", (batch, 4096)),
        unary_op("relu", "gelu", "relu", (batch, 4096)),
        linear_op("small", "relu", batch, 4096, 16),
        unary_op("tanh", "small", "tanh", (batch, 16)),
        OpNode(name="output", kind="output", target="output", inputs=("tanh",), outputs=(meta(batch, 16),)),
    ))


@pytest.mark.parametrize("graph", [mixed_bounds_graph(), mixed_graph(batch=16, seq=64)], ids=["bounds", "mixed"])
def test_recovers_known_device_parameters(graph: OpGraph) -> None:
    synthetic = analytic_costs(graph, TRUE, micro_batch_sizes=SIZES)
    fit = fit_device(graph, synthetic, base=BASE, name="fitted")
    device = fit.device
    assert device.name == "fitted" and device.memory_bytes == BASE.memory_bytes
    assert device.peak_tflops == pytest.approx(TRUE.peak_tflops, rel=1e-3)
    assert device.mem_bandwidth_gb_per_s == pytest.approx(TRUE.mem_bandwidth_gb_per_s, rel=1e-3)
    assert device.kernel_overhead_us == pytest.approx(TRUE.kernel_overhead_us, rel=1e-3)
    assert device.matmul_half_rows == TRUE.matmul_half_rows
    assert fit.median_rel_error < 1e-6 and abs(fit.total_rel_error) < 1e-6
    assert fit.num_entries > 0
    refit = analytic_costs(graph, device, micro_batch_sizes=SIZES)
    for name in graph.names:
        assert refit.at(name, 4).fwd_ms == pytest.approx(synthetic.at(name, 4).fwd_ms, rel=1e-3)
    assert calibrate_device(graph, synthetic, base=BASE) == Device(**{**device.to_dict(), "name": "cpu"})


def test_a_parameter_the_data_cannot_see_keeps_the_base_value() -> None:
    graph = mlp_graph(batch=8)
    fast_memory = Device(name="t", peak_tflops=0.05, mem_bandwidth_gb_per_s=1e6, memory_bytes=2**30,
                         kernel_overhead_us=5.0, elementwise_tflops=0.01)
    base = Device(name="guess", peak_tflops=1.0, mem_bandwidth_gb_per_s=1e5, memory_bytes=2**30,
                  kernel_overhead_us=50.0, elementwise_tflops=0.1)
    fit = fit_device(graph, analytic_costs(graph, fast_memory, micro_batch_sizes=SIZES), base=base)
    assert fit.device.mem_bandwidth_gb_per_s == base.mem_bandwidth_gb_per_s  # nothing was memory bound
    assert fit.device.peak_tflops == pytest.approx(0.05, rel=1e-3)
    assert fit.median_rel_error < 1e-6


def test_noisy_measurements_give_a_close_fit_and_report_the_error() -> None:
    graph = mixed_bounds_graph()
    clean = analytic_costs(graph, TRUE, micro_batch_sizes=SIZES)
    noisy = CostTable(device="cpu", source="measured", entries={
        name: {size: OpCost(fwd_ms=cost.fwd_ms * (1.1 if idx % 2 else 0.9), bwd_ms=cost.bwd_ms,
                            act_bytes=cost.act_bytes, output_bytes=cost.output_bytes, param_bytes=cost.param_bytes)
               for idx, (size, cost) in enumerate(per.items())}
        for name, per in clean.entries.items()})
    fit = fit_device(graph, noisy, base=BASE)
    assert 0.0 < fit.median_rel_error < 0.15 and abs(fit.total_rel_error) < 0.05
    assert fit.device.peak_tflops == pytest.approx(TRUE.peak_tflops, rel=0.15)
    assert "median error" in str(fit)


def test_too_few_entries_raise() -> None:
    graph = mlp_graph()
    table = analytic_costs(graph, TRUE, micro_batch_sizes=[1])
    only_one = CostTable(device="cpu", source="measured", entries={"fc1": table.entries["fc1"]})
    with pytest.raises(CostError, match="entries"):
        fit_device(graph, only_one)
