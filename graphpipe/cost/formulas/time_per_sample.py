"""Time per sample (TPS), the one rule that prices a stage (docs/method.md §2), for the planner and the simulator.

    TPS = (compute + p2p + actions) / b + (all_reduce + step) / B

per micro-batch of b samples on one device: the ops' compute, the point-to-point traffic and the
device's fixed host cost of the stage's forward and backward actions (`action_overheads_ms`, which
the simulator adds to each forward and backward it runs); once per iteration, spread over the B
samples of the mini-batch: the data-parallel all-reduce of the stage's gradients and its optimizer
step (`optimizer_step_ms`, which the simulator runs after it). Every pricer calls these: the
planner's scalar `CostModel.stage_cost`, the DP's and the baselines' tables through the numpy twins
below (each beside its scalar, same operations in the same order, so they agree to the last bit on
the same inputs), the reference DP of the tests, and the simulator's stage costs and steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphpipe.cost.cluster import Device

ADAM_PASSES = 7  # bytes moved per parameter byte by one Adam step: 4 reads, 3 writes


def action_overheads_ms(device: Device) -> tuple[float, float]:
    """(forward, backward) ms every action of a stage pays on top of its ops, once per micro-batch."""
    return device.fwd_action_overhead_us / 1e3, device.bwd_action_overhead_us / 1e3


def actions_ms(device: Device) -> float:
    """Both actions of one micro-batch: what the TPS adds per micro-batch."""
    fwd, bwd = action_overheads_ms(device)
    return fwd + bwd


def step_bandwidth_gb_per_s(device: Device) -> float:
    """What the optimizer streams its state at: the device's `step_bandwidth_gb_per_s`, else its memory's."""
    return device.step_bandwidth_gb_per_s or device.mem_bandwidth_gb_per_s


def optimizer_step_ms(device: Device, param_bytes: float) -> float:
    """Adam's step on a stage: weights, gradients and both moments streamed through device memory, plus the
    device's fixed `step_overhead_us` (paid with or without weights: the runtime steps every stage)."""
    return ADAM_PASSES * param_bytes / (step_bandwidth_gb_per_s(device) * 1e9) * 1e3 + device.step_overhead_us / 1e3


def optimizer_step_ms_array(device: Device, param_bytes: np.ndarray) -> np.ndarray:
    """`optimizer_step_ms` elementwise."""
    step: np.ndarray = ADAM_PASSES * param_bytes / (step_bandwidth_gb_per_s(device) * 1e9) * 1e3 \
        + device.step_overhead_us / 1e3
    return step


def optimizer_step_line(device: Device) -> tuple[float, float]:
    """(ms per byte, fixed ms) of `optimizer_step_ms`, for bounds that search over byte counts (equal to it up to
    rounding)."""
    return ADAM_PASSES / (step_bandwidth_gb_per_s(device) * 1e9) * 1e3, device.step_overhead_us / 1e3


def iteration_ms_per_sample(all_reduce_ms: float, step_ms: float, global_batch_size: int) -> float:
    """What a stage does once per iteration, per sample of the mini-batch."""
    return (all_reduce_ms + step_ms) / global_batch_size


def iteration_ms_per_sample_array(all_reduce_ms: np.ndarray | float, step_ms: np.ndarray,
                                  global_batch_size: int) -> np.ndarray:
    """`iteration_ms_per_sample` elementwise (`all_reduce_ms` a plain 0.0 on one device). Depends on neither the
    micro-batch nor the compute, so a caller keeps it per degree for all its tables."""
    per_sample: np.ndarray = (all_reduce_ms + step_ms) / global_batch_size
    return per_sample


def time_per_sample_ms(device: Device, compute_ms: float, comm_ms: float, all_reduce_ms: float, param_bytes: float,
                       micro_batch_size: int, global_batch_size: int) -> float:
    """The TPS of a stage from one micro-batch's compute (its ops' fwd + bwd) and p2p time, its gradients'
    all-reduce and its weights (for the optimizer step)."""
    return (compute_ms + comm_ms + actions_ms(device)) / micro_batch_size + iteration_ms_per_sample(
        all_reduce_ms, optimizer_step_ms(device, param_bytes), global_batch_size)


def time_per_sample_ms_array(device: Device, compute_ms: np.ndarray, comm_ms: np.ndarray,
                             per_iteration: np.ndarray | float, micro_batch_size: int) -> np.ndarray:
    """`time_per_sample_ms` elementwise, the once-per-iteration part given as `iteration_ms_per_sample_array` of the
    same cells. `comm_ms` (an array of the result's shape) is overwritten with the result."""
    tps = _per_micro_batch(device, compute_ms, comm_ms, micro_batch_size)
    tps += per_iteration
    return tps


def time_per_sample_ms_rows(device: Device, compute_ms: np.ndarray, comm_ms: np.ndarray,
                            per_iteration: Sequence[np.ndarray | float], micro_batch_size: int) -> np.ndarray:
    """`time_per_sample_ms_array` over the DP's degree x segment tables: `per_iteration[k]` belongs to row k (degree
    k). `comm_ms` is overwritten with the result."""
    tps = _per_micro_batch(device, compute_ms, comm_ms, micro_batch_size)
    for row, iteration in zip(tps, per_iteration):
        row += iteration
    return tps


def _per_micro_batch(device: Device, compute_ms: np.ndarray, comm_ms: np.ndarray, micro_batch_size: int) -> np.ndarray:
    """(compute + comm + actions) / b in place of `comm_ms`, the scalar's order (+ is commutative to the bit)."""
    out = comm_ms
    out += compute_ms
    extra = actions_ms(device)
    if extra:  # adding 0.0 changes no value the DP compares
        out += extra
    out /= micro_batch_size
    return out


def time_per_sample_floor(device: Device, all_reduce_line: tuple[float, float], micro_batch_size: int,
                          global_batch_size: int) -> tuple[float, float, float]:
    """The TPS less its p2p term, for a stage whose compute and weights a bound searches over, as
    (fixed ms per sample, ms per sample per weight byte, fixed ms per sample more where it has weights): the
    all-reduce (`all_reduce_line`, `communication.ring_all_reduce_line`) is free without weights, the step is
    not. Equal to the rule up to rounding: a bound leaves a margin."""
    step_slope, step_fixed = optimizer_step_line(device)
    reduce_slope, reduce_fixed = all_reduce_line
    return (actions_ms(device) / micro_batch_size + step_fixed / global_batch_size,
            (reduce_slope + step_slope) / global_batch_size, reduce_fixed / global_batch_size)


# ---- activation recomputation ------------------------------------------------------------------------
RECOMPUTE_FORWARDS = 1  # forwards a recomputing stage runs again per micro-batch, inside its backward


def recompute_extra_ms(ops_fwd_ms: float) -> float:
    """What recomputation adds to a stage's backward of one micro-batch: its ops' forward once more (`ops_fwd_ms`,
    without the per-action overhead: the recompute runs inside the backward action, which pays its own once).
    So a recomputing stage's backward is `bwd + recompute_extra_ms(fwd)` and its TPS gains
    `recompute_extra_ms(fwd) / b`: the rule's compute term is then fwd + bwd + fwd. Works elementwise on numpy
    arrays too."""
    return RECOMPUTE_FORWARDS * ops_fwd_ms


def recompute_compute_ms(ops_fwd_ms: float, ops_bwd_ms: float) -> float:
    """The compute term of the TPS (`time_per_sample_ms`'s `compute_ms`) of a recomputing stage: forward, then the
    backward with its forward run again."""
    return ops_fwd_ms + (ops_bwd_ms + recompute_extra_ms(ops_fwd_ms))
