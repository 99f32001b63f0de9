"""What a one-process op profile cannot see of a CPU host, measured with the runtime running a pipeline.

A plan's stages run in worker processes that compute at the same time and pass tensors. A per-op profile
times each op alone, in one process, with its weights hot in cache: in a pipeline on busy cores the same
ops run slower (the processes share caches, memory bandwidth and the cores with gloo's threads, and one
busy core clocks higher than two), and the runtime adds host work per action (slicing, the stage call,
`autograd.backward`, posting a send) and per iteration (clearing gradients, the optimizer's fixed part). So
`graphpipe.runtime.host_timing.measure_runtime` trains a reference model as a chain on `workers` gloo ranks
at several micro-batch sizes, and `fit_host` fits, over sizes and ranks,

    action ms = compute_scale x (the rank's ops' per-sample time) + call_scale x (their per-call time)
                + action overhead

by least squares relative to each action. An op's profiled time splits into what every call pays whatever
its samples (the intercept of the line through its profiled sizes: dispatch, small-size inefficiency) and
the rest, which grows with the samples; host work and compute need not slow alike when the host is busy.
So the forward and backward each get a call scale and one compute scale serves both, with two constraints
that keep the terms steady from one calibration to the next (`benchmarks/sim_ranking`): the call scales
are shrunk toward the compute scale, and the scales of workers at once are no lower than one worker
alone's. A per-action overhead is fitted only where the ranks' per-call sums differ (else it cannot be
told from the call scale and is held at zero). The iteration's time outside its actions plus the
optimizer-step action, less Adam's streaming of the state, is the step overhead. `HostCalibration.device`
and `.costs` apply it: the op costs scaled, the overheads on the device, so the planner's rule and the
simulator read them as they read any device.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.cost.formulas.time_per_sample import ADAM_PASSES
from graphpipe.errors import CostError

CALL_SHRINKAGE = 1.0  # weight of a per-call scale's distance from the per-sample scale, as one action's error
VARYING = 0.05  # per-call sums that differ by less than this share tell no per-action overhead from a call scale
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
    all_reduce_ms: float = 0.0  # the gradients' all-reduce, waits for the other replicas included (0: none)


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
    fwd_call_scale: float | None = None  # of the ops' per-call forward time (None: compute_scale)
    bwd_call_scale: float | None = None

    @property
    def call_scales(self) -> tuple[float, float]:
        """Forward and backward scale of the ops' per-call time."""
        fwd = self.compute_scale if self.fwd_call_scale is None else self.fwd_call_scale
        return fwd, self.compute_scale if self.bwd_call_scale is None else self.bwd_call_scale

    def device(self, fitted: Device) -> Device:
        """`fitted` (a device whose analytic costs match the one-process profile) with its compute slowed by
        `compute_scale`, its per-kernel overhead by the mean call scale, and the host's overheads on it."""
        scale = self.compute_scale
        return dataclasses.replace(
            fitted, name=f"{fitted.name}-host", peak_tflops=fitted.peak_tflops / scale,
            elementwise_tflops=(fitted.elementwise_tflops or fitted.peak_tflops / 8) / scale,
            mem_bandwidth_gb_per_s=fitted.mem_bandwidth_gb_per_s / scale,
            kernel_overhead_us=fitted.kernel_overhead_us * sum(self.call_scales) / 2,
            fwd_action_overhead_us=self.fwd_action_overhead_us, bwd_action_overhead_us=self.bwd_action_overhead_us,
            step_overhead_us=self.step_overhead_us, step_bandwidth_gb_per_s=self.step_bandwidth_gb_per_s)

    def costs(self, measured: CostTable) -> CostTable:
        """A one-process profile's times scaled to what the ops take with `workers` processes busy: each op's
        per-call part by its pass's call scale, the rest by the compute scale."""
        fwd_call, bwd_call = self.call_scales
        entries = {}
        for op, per_size in measured.entries.items():
            calls = call_part_ms(per_size, "fwd_ms"), call_part_ms(per_size, "bwd_ms")
            entries[op] = {size: dataclasses.replace(
                cost, fwd_ms=self._scaled(cost.fwd_ms, calls[0], fwd_call),
                bwd_ms=self._scaled(cost.bwd_ms, calls[1], bwd_call)) for size, cost in per_size.items()}
        return dataclasses.replace(measured, entries=entries)

    def _scaled(self, ms: float, call_ms: float, call_scale: float) -> float:
        call = min(call_ms, ms)
        return call_scale * call + self.compute_scale * (ms - call)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def call_part_ms(per_size: Mapping[int, OpCost], kind: str) -> float:
    """The part of one op's `kind` ("fwd_ms" or "bwd_ms") time that every call pays whatever its samples: the
    intercept of the least-squares line through its profiled sizes, between 0 and its fastest time (0 with
    one size: nothing tells it apart)."""
    sizes = sorted(per_size)
    if len(sizes) < 2:
        return 0.0
    times: list[float] = [getattr(per_size[size], kind) for size in sizes]
    intercept = float(np.polyfit(sizes, times, 1)[1])
    return min(max(intercept, 0.0), min(times))


def fit_host(timings: Sequence[Sequence[SizeTiming]], profile: CostTable, device: Device,
             step_bandwidth_gb_per_s: float = 0.0, *, alone: HostCalibration | None = None,
             call_shrinkage: float = CALL_SHRINKAGE) -> HostCalibration:
    """Fit the host terms to each worker's `timings` against `profile` (the one-process op costs, with each
    op's weights) of the model the workers trained. Each rank's weights stream in Adam's step at
    `step_bandwidth_gb_per_s` (measured: `graphpipe.runtime.host_timing.measure_adam_streaming`; 0: `device`'s
    memory); the step's fixed part is what is left of the iteration's rest, so a model with other parameter
    bytes than the reference's is charged its own streaming. `alone` (one worker's fit) bounds the scales from
    below: workers computing at once are not faster than one alone, and a fit that says so has traded a
    scale for the overheads (one calibration put 0.07 on the per-call scale and 1.2 ms on each action).
    `call_shrinkage` weighs the per-call scales' distance from the per-sample scale
    (`_relative_fit`)."""
    calls = {op: (call_part_ms(per_size, "fwd_ms"), call_part_ms(per_size, "bwd_ms"))
             for op, per_size in profile.entries.items()}
    bandwidth = step_bandwidth_gb_per_s or device.mem_bandwidth_gb_per_s
    parts, measured, steps = [], [], []
    for per_worker in timings:
        for timing in per_worker:
            ops = timing.ops or tuple(profile.entries)
            fwd, bwd, param_bytes = _profile_sums(profile, timing.micro_batch_size, ops)
            fwd_call, bwd_call = (sum(calls[op][kind] for op in ops) for kind in (0, 1))
            parts += [(fwd - fwd_call, fwd_call, 0.0), (bwd - bwd_call, 0.0, bwd_call)]
            measured += [timing.fwd_ms, timing.bwd_ms]
            steps.append(timing.outside_ms + timing.step_ms - ADAM_PASSES * param_bytes / (bandwidth * 1e9) * 1e3)
    if len(parts) < 6:
        raise CostError(f"need action times at 3 or more micro-batch sizes to fit the host, got {len(parts) // 2}")
    compute = np.array(parts)
    overheads = np.zeros((len(parts), 2))
    overheads[0::2, 0], overheads[1::2, 1] = _calls_vary(compute[0::2, 1]), _calls_vary(compute[1::2, 2])
    design, target = np.hstack([compute, overheads]), np.array(measured)
    scale_floors = (alone.compute_scale, *alone.call_scales) if alone is not None else (-np.inf, 0.0, 0.0)
    floors = np.array([*scale_floors, 0.0, 0.0])
    solution = _relative_fit(design, target, floors, call_shrinkage)
    factor = solution[0]
    if factor < MIN_SCALE:
        raise CostError(f"the runtime's actions do not grow with the ops' profiled time (fitted scale {factor:.3g}): "
                        "the model's ops are too small to see its compute behind the per-action overheads; "
                        "calibrate with a larger model (the default, mmt)")
    call_scales = [float(solution[col]) if design[:, col].any() else None for col in (1, 2)]
    return HostCalibration(
        workers=len(timings), compute_scale=float(factor), fwd_action_overhead_us=float(solution[3]) * 1e3,
        bwd_action_overhead_us=float(solution[4]) * 1e3, step_overhead_us=max(0.0, statistics.median(steps)) * 1e3,
        median_rel_error=float(np.median(np.abs(design @ solution - target) / target)),
        iteration_spread=max(t.iteration_spread for worker in timings for t in worker),
        step_bandwidth_gb_per_s=step_bandwidth_gb_per_s, fwd_call_scale=call_scales[0], bwd_call_scale=call_scales[1])


def _calls_vary(sums: np.ndarray) -> float:
    """1.0 where the actions' per-call sums of one pass differ enough to tell a per-action overhead from a call
    scale, else 0.0: on one worker, whose every action runs the same ops, they do not."""
    return float(sums.max() > 0 and np.ptp(sums) > VARYING * sums.max())


def _profile_sums(profile: CostTable, size: int, ops: tuple[str, ...]) -> tuple[float, float, int]:
    """Forward ms, backward ms and weight bytes of `ops` at `size` samples."""
    costs = [profile.at(op, size) for op in ops]
    return sum(c.fwd_ms for c in costs), sum(c.bwd_ms for c in costs), sum(c.param_bytes for c in costs)


def _relative_fit(design: np.ndarray, target: np.ndarray, floors: np.ndarray, shrinkage: float) -> np.ndarray:
    """Least squares of the columns' coefficients on errors relative to each action, each at least its floor,
    with the per-call scales (columns 1 and 2) shrunk toward the per-sample scale (column 0): a deviation of d
    costs as much as one action off by d x `shrinkage`, so the two parts of an op's time scale apart only
    where the actions ask for it (one size's noise tilts the line through the sizes, and an unshrunk fit once
    put 2.3-2.8 on the per-call scales of one worker alone). An all-zero column is held at zero; a coefficient
    the fit puts below its floor is held there and the rest is refitted."""
    shrink = np.zeros((2, design.shape[1]))
    for row, col in enumerate((1, 2)):
        if design[:, col].any():
            shrink[row, 0], shrink[row, col] = -shrinkage, shrinkage
    weighted = np.vstack([design / target[:, None], shrink])
    goal = np.concatenate([np.ones_like(target), np.zeros(2)])
    solution = np.zeros(design.shape[1])
    free = [col for col in range(design.shape[1]) if design[:, col].any()]
    held: list[int] = []
    while True:
        rest = goal - weighted[:, held] @ solution[held]
        solution[free] = np.linalg.lstsq(weighted[:, free], rest, rcond=None)[0]
        below = [col for col in free if solution[col] < floors[col]]
        if not below:
            return solution
        for col in below:
            solution[col] = floors[col]
        held += below
        free = [col for col in free if col not in below]
