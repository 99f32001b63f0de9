"""The min-max DP shared by the sequential baselines (PipeDream, Piper): stages in a chain.

`best[state]` is an array over (devices m, stages k): the smallest bottleneck TPS with
which the ops after `state` can be staged on at most m devices in at most k stages. A stage
followed by at most k - 1 stages holds at most k micro-batches in flight (1F1B on a chain),
which is the memory check (never more than the B / b micro-batches of a mini-batch); the
optimum over k makes it exact.
"""

from __future__ import annotations

import numpy as np

from graphpipe.cost.formulas.memory import max_in_flight_micro_batches


def empty(num_devices: int, max_stages: int) -> np.ndarray:
    return np.full((num_devices + 1, max_stages + 1), np.inf)


def relax(best: np.ndarray, choice: np.ndarray, rest: np.ndarray, tps_ms: float, num_devices: int,
          k_max: int, tag: int) -> None:
    """Try one stage on `num_devices` devices (at most `k_max` micro-batches in flight) before `rest`."""
    if k_max < 1:
        return
    size_m, size_k = best.shape
    cap = min(size_k - 1, k_max)
    candidate = np.maximum(rest[: size_m - num_devices, :cap], tps_ms)
    region = best[num_devices:, 1 : cap + 1]
    better = candidate < region
    if better.any():
        region[better] = candidate[better]
        choice[num_devices:, 1 : cap + 1][better] = tag


def in_flight_cap(param_bytes: float, act_bytes: float, memory_limit: float, num_micro_batches: int) -> int:
    """Most micro-batches in flight that fit; unbounded when the whole mini-batch fits (no stage holds more)."""
    return max_in_flight_micro_batches(param_bytes, act_bytes, memory_limit, num_micro_batches)
