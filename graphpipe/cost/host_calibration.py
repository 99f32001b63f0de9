"""What a one-process op profile cannot see of a CPU host, measured with the runtime running a pipeline.

A plan's stages run in worker processes that compute at the same time and pass tensors. A per-op profile
times each op alone, in one process, with its weights hot in cache: in a pipeline on busy cores the same
ops run slower (the processes share caches, memory bandwidth and the cores with gloo's threads, and one
busy core clocks higher than two), and the runtime adds host work per action (slicing, the stage call,
`autograd.backward`, posting a send) and per iteration (clearing gradients, the optimizer's fixed part). So
`graphpipe.runtime.host_timing.measure_runtime` trains a reference model as a chain on `workers` gloo ranks
at several micro-batch sizes, and `fit_host` fits, over sizes and ranks,

    action ms = compute_scale x (the profile's sum over the rank's ops) + action overhead

(one scale; forward and backward each their own overhead) by least squares relative to each action, and
takes the iteration's time outside its actions plus the optimizer-step action, less Adam's streaming of
the state, as the step overhead. `HostCalibration.device` and `.costs` apply it: the op costs scaled, the
overheads on the device, so the planner's rule and the simulator read them as they read any device.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.time_per_sample import ADAM_PASSES
from graphpipe.errors import CostError

MIN_SCALE = 0.05  # below this the actions' times do not follow the ops' (the ops are lost in the overheads)


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeTiming:
    """One rank's medians at one micro-batch size: per forward and backward action, and per iteration."""

    micro_batch_size: int  # samples of one action on this rank
    fwd_ms: float  # one forward action
    bwd_ms: float
    outside_ms: float  # an iteration less every action it ran (the schedule's waits for a receive included)
    step_ms: float  # the optimizer-step action
    iteration_ms: float
    iteration_spread: float  # (p90 - p10) / median of the timed iterations
    ops: tuple[str, ...] = ()  # the ops this rank ran (its stage's); empty: every op of the profile


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCalibration:
    """The fitted host terms (see the module docstring) and how well they reproduce what was measured."""

    workers: int
    compute_scale: float
    fwd_action_overhead_us: float
    bwd_action_overhead_us: float
    step_overhead_us: float
    median_rel_error: float  # of the fitted action times against the measured ones
    iteration_spread: float  # (p90 - p10) / median of the measured iterations, worst size: the host's noise
    step_bandwidth_gb_per_s: float = 0.0  # Adam's streaming, measured on its own (0: the fitted device's memory)

    def device(self, fitted: Device) -> Device:
        """`fitted` (a device whose analytic costs match the one-process profile) with its compute slowed by
        `compute_scale` and the host's overheads on it."""
        scale = self.compute_scale
        return dataclasses.replace(
            fitted, name=f"{fitted.name}-host", peak_tflops=fitted.peak_tflops / scale,
            elementwise_tflops=(fitted.elementwise_tflops or fitted.peak_tflops / 8) / scale,
            mem_bandwidth_gb_per_s=fitted.mem_bandwidth_gb_per_s / scale,
            kernel_overhead_us=fitted.kernel_overhead_us * scale,
            fwd_action_overhead_us=self.fwd_action_overhead_us, bwd_action_overhead_us=self.bwd_action_overhead_us,
            step_overhead_us=self.step_overhead_us, step_bandwidth_gb_per_s=self.step_bandwidth_gb_per_s)

    def costs(self, measured: CostTable) -> CostTable:
        """A one-process profile's times scaled to what the ops take with `workers` processes busy."""
        return scaled_costs(measured, self.compute_scale)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def scaled_costs(table: CostTable, scale: float) -> CostTable:
    """`table` with every forward and backward time multiplied by `scale` (sizes and bytes unchanged)."""
    entries = {op: {size: dataclasses.replace(cost, fwd_ms=cost.fwd_ms * scale, bwd_ms=cost.bwd_ms * scale)
                    for size, cost in per_size.items()} for op, per_size in table.entries.items()}
    return dataclasses.replace(table, entries=entries)


def fit_host(timings: Sequence[Sequence[SizeTiming]], profile: CostTable, device: Device,
             step_bandwidth_gb_per_s: float = 0.0) -> HostCalibration:
    """Fit the host terms to each worker's `timings` against `profile` (the one-process op costs, with each
    op's weights) of the model the workers trained. Each rank's weights stream in Adam's step at
    `step_bandwidth_gb_per_s` (measured: `graphpipe.runtime.host_timing.measure_adam_streaming`; 0: `device`'s
    memory); the step's fixed part is what is left of the iteration's rest, so a model with other parameter
    bytes than the reference's is charged its own streaming."""
    rows, measured, steps = [], [], []
    bandwidth = step_bandwidth_gb_per_s or device.mem_bandwidth_gb_per_s
    for per_worker in timings:
        for timing in per_worker:
            ops = timing.ops or tuple(profile.entries)
            fwd, bwd, param_bytes = _profile_sums(profile, timing.micro_batch_size, ops)
            rows += [(fwd, 1.0, 0.0), (bwd, 0.0, 1.0)]
            measured += [timing.fwd_ms, timing.bwd_ms]
            steps.append(timing.outside_ms + timing.step_ms - ADAM_PASSES * param_bytes / (bandwidth * 1e9) * 1e3)
    if len(rows) < 6:
        raise CostError(f"need action times at 3 or more micro-batch sizes to fit the host, got {len(rows) // 2}")
    design, target = np.array(rows), np.array(measured)
    scale, fwd_over, bwd_over = _relative_fit(design, target)
    if scale < MIN_SCALE:
        raise CostError(f"the runtime's actions do not grow with the ops' profiled time (fitted scale {scale:.3g}): "
                        "the model's ops are too small to see its compute behind the per-action overheads; "
                        "calibrate with a larger model (the default, mmt)")
    predicted = design @ np.array([scale, fwd_over, bwd_over])
    step_ms = statistics.median(steps)
    return HostCalibration(
        workers=len(timings), compute_scale=float(scale), fwd_action_overhead_us=float(fwd_over) * 1e3,
        bwd_action_overhead_us=float(bwd_over) * 1e3, step_overhead_us=max(0.0, step_ms) * 1e3,
        median_rel_error=float(np.median(np.abs(predicted - target) / target)),
        iteration_spread=max(t.iteration_spread for worker in timings for t in worker),
        step_bandwidth_gb_per_s=step_bandwidth_gb_per_s)


def _profile_sums(profile: CostTable, size: int, ops: tuple[str, ...]) -> tuple[float, float, int]:
    """Forward ms, backward ms and weight bytes of `ops` at `size` samples."""
    costs = [profile.at(op, size) for op in ops]
    return sum(c.fwd_ms for c in costs), sum(c.bwd_ms for c in costs), sum(c.param_bytes for c in costs)


def _relative_fit(design: np.ndarray, target: np.ndarray) -> tuple[float, float, float]:
    """Least squares of (scale, forward overhead, backward overhead) on errors relative to each action; an
    overhead the fit puts below zero is held at zero and the rest refitted."""
    weighted, goal = design / target[:, None], np.ones_like(target)
    free = [0, 1, 2]
    while True:
        solution = np.zeros(3)
        solution[free] = np.linalg.lstsq(weighted[:, free], goal, rcond=None)[0]
        negative = [col for col in free[1:] if solution[col] < 0]
        if not negative:
            return float(solution[0]), float(solution[1]), float(solution[2])
        free = [col for col in free if col not in negative]
