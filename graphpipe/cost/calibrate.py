"""Fit a `Device` to a measured cost table, so the analytic model predicts what was measured.

Each measured (op, micro-batch, forward or backward) time t is modelled as in
`graphpipe.cost.analytic`:

    t = max(a * matmul_flops / efficiency(rows) + c * other_flops, w * bytes) + o * kernels

with a = 1/peak, c = 1/elementwise peak, w = 1/bandwidth, o = kernel overhead. Given
which side of the max each entry is on, this is linear in (a, c, w, o): solve a
non-negative weighted least-squares problem, re-decide the sides with the new
parameters, and repeat until they settle. The efficiency curve's `matmul_half_rows`
is chosen from a grid of powers of two, keeping the one with the smallest loss. A
parameter the data cannot pin down (no compute-bound entries, say) keeps the value of
the `base` device. Weights are
1 / (t + mean t): relative error for the large entries, absolute for the small ones, so
that both the per-op shape and the total of an iteration are fitted; one extra row asks
the sum of all predictions to match the sum of all measurements (what a simulated
iteration adds up).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from graphpipe.cost.analytic import elementwise_tflops, pass_work
from graphpipe.cost.cluster import Device
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.flops import op_work, trainable_param_bytes
from graphpipe.cost.presets import DEVICE_PRESETS
from graphpipe.errors import CostError
from graphpipe.graph.op_graph import OpGraph

MAX_ROUNDS = 50
TOTAL_WEIGHT = 3.0  # how much more than one entry the sum over all entries counts (times sqrt(entries))
# Multipliers of the base (1/peak, 1/elementwise peak, 1/bandwidth, overhead) to start from.
START_FACTORS = ((1.0, 1.0, 1.0, 1.0), (0.01, 0.01, 1.0, 1.0), (100.0, 100.0, 1.0, 1.0),
                 (1.0, 1.0, 0.01, 1.0), (1.0, 1.0, 100.0, 1.0))
HALF_ROWS_GRID = tuple(float(2**power) for power in range(11))  # 1 .. 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFit:
    """A fitted device and how well the analytic model then reproduces the measured table."""

    device: Device
    num_entries: int  # (op, micro-batch, pass) times fitted
    median_rel_error: float  # median over entries of |predicted - measured| / measured
    total_rel_error: float  # (sum predicted - sum measured) / sum measured: the error of a whole iteration

    def __str__(self) -> str:
        d = self.device
        return (f"{d.name}: peak {d.peak_tflops:.4g} TFLOP/s, elementwise {d.elementwise_tflops:.4g} TFLOP/s, "
                f"{d.mem_bandwidth_gb_per_s:.4g} GB/s, {d.kernel_overhead_us:.3g} us/kernel, half peak at "
                f"{d.matmul_half_rows:g} rows; fit over "
                f"{self.num_entries} entries: median error {self.median_rel_error:.1%}, "
                f"total {self.total_rel_error:+.1%}")


def calibrate_device(graph: OpGraph, measured: CostTable, base: Device | None = None, name: str = "cpu") -> Device:
    """The device whose analytic costs for `graph` best match `measured` (see `fit_device` for the error)."""
    return fit_device(graph, measured, base, name).device


def fit_device(graph: OpGraph, measured: CostTable, base: Device | None = None, name: str = "cpu") -> DeviceFit:
    """Fit peak, elementwise peak, bandwidth, kernel overhead and matmul_half_rows; `base` gives
    the memory and the values of parameters the data does not determine."""
    start = base or DEVICE_PRESETS["cpu"]
    work, times = _features(graph, measured)
    if len(times) < 4:
        raise CostError(f"only {len(times)} measured entries with work to fit; profile more ops or sizes")
    base_params = np.array([1 / (start.peak_tflops * 1e12), 1 / (elementwise_tflops(start) * 1e12),
                            1 / (start.mem_bandwidth_gb_per_s * 1e9), start.kernel_overhead_us * 1e-6])
    weights = 1.0 / (times + np.mean(times))
    fits = []
    for half_rows in HALF_ROWS_GRID:
        features = _with_efficiency(work, half_rows)
        params = _fit_params(features, times, weights, base_params)
        fits.append((_loss(features, times, weights, params), half_rows, params))
    _, half_rows, params = min(fits, key=lambda fit: fit[0])
    predicted = _predict(_with_efficiency(work, half_rows), params)
    device = Device(name=name, peak_tflops=float(1 / params[0] / 1e12),
                    elementwise_tflops=float(1 / params[1] / 1e12),
                    mem_bandwidth_gb_per_s=float(1 / params[2] / 1e9), memory_bytes=start.memory_bytes,
                    kernel_overhead_us=float(params[3] * 1e6), matmul_half_rows=half_rows)
    return DeviceFit(device=device, num_entries=len(times),
                     median_rel_error=float(np.median(np.abs(predicted - times) / times)),
                     total_rel_error=float((predicted.sum() - times.sum()) / times.sum()))


def _features(graph: OpGraph, measured: CostTable) -> tuple[np.ndarray, np.ndarray]:
    """Rows (matmul flops, matmul rows, other flops, bytes, kernels) and measured seconds, one per entry."""
    rows: list[tuple[float, float, float, float, float]] = []
    times: list[float] = []
    for op in graph.ops:
        work = op_work(op)
        if op.name not in measured.entries or work.fwd_kernels == 0:
            continue  # ops the model treats as free are not fitted
        for size, cost in measured.entries[op.name].items():
            scale = size / graph.example_batch_size
            for backward, ms in ((False, cost.fwd_ms), (True, cost.bwd_ms)):
                one = pass_work(work, scale, backward=backward, param_bytes=trainable_param_bytes(op))
                if ms <= 0 or one.num_kernels == 0:
                    continue
                rows.append((one.matmul_flops, one.matmul_rows, one.other_flops, one.traffic_bytes,
                             float(one.num_kernels)))
                times.append(ms / 1e3)
    return np.array(rows, dtype=float).reshape(-1, 5), np.array(times, dtype=float)


def _with_efficiency(work: np.ndarray, half_rows: float) -> np.ndarray:
    """Columns (matmul flops / efficiency, other flops, bytes, kernels): linear in the fitted parameters."""
    rows = work[:, 1]
    efficiency = np.where(rows > 0, rows / (rows + half_rows), 1.0)
    return np.column_stack([work[:, 0] / efficiency, work[:, 2], work[:, 3], work[:, 4]])


def _predict(features: np.ndarray, params: np.ndarray) -> np.ndarray:
    compute = features[:, 0] * params[0] + features[:, 1] * params[1]
    predicted: np.ndarray = np.maximum(compute, features[:, 2] * params[2]) + features[:, 3] * params[3]
    return predicted


def _fit_params(features: np.ndarray, times: np.ndarray, weights: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Alternate between deciding each entry's bound and a linear fit, from several starting guesses
    (the base device, and its compute or memory made 100x faster or slower); keep the best."""
    best, best_loss = base, _loss(features, times, weights, base)
    for factors in START_FACTORS:
        params = _alternate(features, times, weights, base, base * np.array(factors))
        loss = _loss(features, times, weights, params)
        if loss < best_loss:
            best, best_loss = params, loss
    return _unseen_bandwidth_kept(features, best, base)


def _unseen_bandwidth_kept(features: np.ndarray, params: np.ndarray, base: np.ndarray) -> np.ndarray:
    """When no entry is memory bound, any small enough bandwidth term fits equally well (the data
    cannot see it, and which value the solver lands on depends on its rounding): keep the base's,
    if no entry becomes memory bound with it."""
    compute = features[:, 0] * params[0] + features[:, 1] * params[1]
    if np.any(compute < features[:, 2] * params[2]) or np.any(compute < features[:, 2] * base[2]):
        return params
    kept = params.copy()
    kept[2] = base[2]
    return kept


def _alternate(features: np.ndarray, times: np.ndarray, weights: np.ndarray, base: np.ndarray,
               start: np.ndarray) -> np.ndarray:
    best, best_loss = start, _loss(features, times, weights, start)
    params = start
    previous: np.ndarray | None = None
    total_weight = TOTAL_WEIGHT * np.sqrt(len(times)) / times.sum()
    for _ in range(MAX_ROUNDS):
        compute_bound = features[:, 0] * params[0] + features[:, 1] * params[1] >= features[:, 2] * params[2]
        if previous is not None and np.array_equal(compute_bound, previous):
            break
        previous = compute_bound
        design = np.column_stack([features[:, 0] * compute_bound, features[:, 1] * compute_bound,
                                  features[:, 2] * ~compute_bound, features[:, 3]])
        params = _nnls_with_fallback(
            np.vstack([design * weights[:, None], design.sum(axis=0) * total_weight]),
            np.append(times * weights, times.sum() * total_weight), base)
        loss = _loss(features, times, weights, params)
        if loss < best_loss:
            best, best_loss = params, loss
    return best


def _loss(features: np.ndarray, times: np.ndarray, weights: np.ndarray, params: np.ndarray) -> float:
    predicted = _predict(features, params)
    total_error = TOTAL_WEIGHT * np.sqrt(len(times)) * (predicted.sum() - times.sum()) / times.sum()
    return float(np.sum(((predicted - times) * weights) ** 2) + total_error**2)


def _nnls_with_fallback(design: np.ndarray, target: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Least squares with positive coefficients; columns left out of the best subset keep `fallback`.

    With four unknowns every subset can be tried, which is exact and needs no solver; when the
    unconstrained solution is already positive it is the answer.
    """
    num_cols = design.shape[1]
    best, best_residual = fallback.copy(), float(np.sum((design @ fallback - target) ** 2))
    for size in range(num_cols, 0, -1):
        for cols in itertools.combinations(range(num_cols), size):
            candidate = _solve_subset(design, target, fallback, cols)
            if candidate is None:
                continue
            if size == num_cols:
                return candidate
            residual = float(np.sum((design @ candidate - target) ** 2))
            if residual < best_residual:
                best, best_residual = candidate, residual
    return best


def _solve_subset(design: np.ndarray, target: np.ndarray, fallback: np.ndarray,
                  cols: tuple[int, ...]) -> np.ndarray | None:
    """Fit the columns `cols` with the others fixed at `fallback`; None unless all come out positive."""
    fixed = [col for col in range(design.shape[1]) if col not in cols]
    rhs = target - design[:, fixed] @ fallback[fixed]
    sub = design[:, cols]
    if not np.any(sub):
        return None
    norms = np.linalg.norm(sub, axis=0)
    norms[norms == 0] = 1.0
    scaled, *_ = np.linalg.lstsq(sub / norms, rhs, rcond=None)  # columns span ~1e12 in scale
    solution = scaled / norms
    if np.any(solution <= 0):
        return None
    candidate = fallback.copy()
    candidate[list(cols)] = solution
    return candidate
