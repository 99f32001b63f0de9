"""Analytic costs: a roofline with a per-kernel overhead, from each op's FLOPs and bytes.

    time = max(matmul_flops / (peak * efficiency(rows)) + other_flops / elementwise_peak,
               bytes / bandwidth) + kernels * kernel_overhead

Three effects make small micro-batches run less efficiently per sample, which is what
makes the micro-batch size worth choosing: the kernel overhead is paid per call, the
weights are read per call (a GEMV at batch 1 is memory bound), and a GEMM with few rows
(M) does not fill the tensor cores. The last is modelled by a saturating efficiency
curve, rows / (rows + half_rows), with the device's `matmul_half_rows` (64 on GPUs: half
of the peak at 64 rows, 94% at 1024; a CPU core saturates after a few rows).

Batch-dependent quantities (FLOPs, activation traffic, saved and output bytes) are taken
per sample from the example batch and scaled to the micro-batch size b; weight traffic
and kernel counts are per call. `param_bytes` counts the parameters that train (buffers
such as BatchNorm statistics excluded). Memory kept for backward (`act_bytes`) follows the rule
in `graphpipe.cost.flops`: ops with weights or two operands keep their inputs,
activations keep their output, dropout a one-byte mask, additions and copies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.cost.flops import OpWork, op_work, trainable_param_bytes
from graphpipe.cost.presets import device_preset
from graphpipe.errors import CostError
from graphpipe.graph.op_graph import OpGraph, OpNode

__all__ = [
    "PassWork",
    "analytic_costs",
    "analytic_op_cost",
    "check_micro_batch_sizes",
    "default_micro_batch_sizes",
    "elementwise_tflops",
    "matmul_efficiency",
    "pass_work",
    "resolve_device",
    "roofline_ms",
]

ELEMENTWISE_PEAK_DIVISOR = 8.0  # `elementwise_tflops` = peak / 8 when a device leaves it 0
MIN_DEFAULT_MAX_BATCH = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class PassWork:
    """The work of one forward or backward call of an op on one micro-batch."""

    matmul_flops: float
    matmul_rows: float
    other_flops: float
    traffic_bytes: float
    num_kernels: int


def matmul_efficiency(rows: float, half_rows: float) -> float:
    """Fraction of the matmul peak a GEMM with `rows` rows reaches (1 when rows are unknown)."""
    return rows / (rows + half_rows) if rows > 0 else 1.0


def elementwise_tflops(device: Device) -> float:
    return device.elementwise_tflops or device.peak_tflops / ELEMENTWISE_PEAK_DIVISOR


def pass_work(work: OpWork, scale: float, *, backward: bool, param_bytes: int) -> PassWork:
    """Forward or backward work on `scale` times the example batch (see the backward rule in flops.py)."""
    if not backward:
        return PassWork(matmul_flops=work.matmul_flops * scale, matmul_rows=work.matmul_rows * scale,
                        other_flops=work.other_flops * scale,
                        traffic_bytes=work.act_traffic_bytes * scale + work.param_traffic_bytes,
                        num_kernels=work.fwd_kernels)
    factor = work.bwd_flops_factor
    weight_bytes = 2.0 * param_bytes if work.has_params else 0.0  # read the weights, write their gradient
    return PassWork(matmul_flops=work.matmul_flops * factor * scale, matmul_rows=work.matmul_rows * scale,
                    other_flops=work.other_flops * factor * scale,
                    traffic_bytes=2.0 * work.act_traffic_bytes * scale + weight_bytes,
                    num_kernels=work.bwd_kernels)


def roofline_ms(work: PassWork, device: Device) -> float:
    """Milliseconds of one pass: the slower of compute and memory, plus the kernel overheads."""
    if work.num_kernels == 0:
        return 0.0
    efficiency = matmul_efficiency(work.matmul_rows, device.matmul_half_rows)
    compute_s = (work.matmul_flops / (device.peak_tflops * 1e12 * efficiency)
                 + work.other_flops / (elementwise_tflops(device) * 1e12))
    memory_s = work.traffic_bytes / (device.mem_bandwidth_gb_per_s * 1e9)
    return max(compute_s, memory_s) * 1e3 + work.num_kernels * device.kernel_overhead_us / 1e3


def analytic_op_cost(op: OpNode, device: Device, scale: float, work: OpWork | None = None) -> OpCost:
    """Cost of `op` on `scale` times the graph's example batch."""
    work = op_work(op) if work is None else work
    param_bytes = trainable_param_bytes(op)
    fwd = pass_work(work, scale, backward=False, param_bytes=param_bytes)
    bwd = pass_work(work, scale, backward=True, param_bytes=param_bytes)
    output_scale = 1.0 if op.kind == "get_attr" else scale  # a parameter read does not grow with the batch
    return OpCost(fwd_ms=roofline_ms(fwd, device), bwd_ms=roofline_ms(bwd, device),
                  act_bytes=round(work.saved_bytes * scale), output_bytes=round(op.output_bytes * output_scale),
                  param_bytes=param_bytes)


def default_micro_batch_sizes(example_batch_size: int) -> tuple[int, ...]:
    """Powers of two from 1 up to the first one >= max(512, the example batch)."""
    limit = max(MIN_DEFAULT_MAX_BATCH, example_batch_size)
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def resolve_device(device: str | Device) -> Device:
    return device_preset(device) if isinstance(device, str) else device


def analytic_costs(graph: OpGraph, device: str | Device = "v100-16gb", *,
                   micro_batch_sizes: Sequence[int] | None = None) -> CostTable:
    """A cost table for `graph` on `device` from FLOPs and bytes (source "analytic")."""
    dev = resolve_device(device)
    sizes = (default_micro_batch_sizes(graph.example_batch_size) if micro_batch_sizes is None
             else check_micro_batch_sizes(micro_batch_sizes))
    example = graph.example_batch_size
    entries: dict[str, dict[int, OpCost]] = {}
    for op in graph.ops:
        work = op_work(op)
        entries[op.name] = {size: analytic_op_cost(op, dev, size / example, work) for size in sizes}
    return CostTable(device=dev.name, source="analytic", entries=entries)


def check_micro_batch_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    """Sorted unique sizes; raises CostError for an empty list or a size below 1."""
    unique = tuple(sorted({int(size) for size in sizes}))
    if not unique or unique[0] < 1:
        raise CostError(f"micro-batch sizes must be positive integers, got {list(sizes)}; e.g. 1,2,4,8")
    return unique
