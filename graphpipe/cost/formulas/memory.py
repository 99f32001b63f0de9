"""Memory per device: the static state of a stage's weights, and how many micro-batches fit beside it.

    static  = 4 × parameter bytes    (fp32 weights, their gradients, Adam's two moments)
    k_max   = floor((memory limit - static) / activations of one micro-batch on one device)
              -1 where the weights alone do not fit; UNBOUNDED with no activations, or when all B / b
              micro-batches of the mini-batch fit (a stage never holds more)

`graphpipe.stages.memory` adds the activations a plan's stage holds; the DP reads k_max over
whole segment tables through the numpy twin.
"""

from __future__ import annotations

import numpy as np

OPTIMIZER_STATE_FACTOR = 4  # weights + gradients + Adam first and second moments, all fp32
UNBOUNDED = 1 << 30  # "any number of micro-batches fits"


def static_memory_bytes(param_bytes: float) -> float:
    return OPTIMIZER_STATE_FACTOR * param_bytes


def max_in_flight_micro_batches(param_bytes: float, act_bytes_per_micro_batch: float, memory_limit: float,
                                num_micro_batches: int | None = None) -> int:
    """Most micro-batches a stage can keep in flight within `memory_limit` (-1 if its weights alone do not fit).

    With `num_micro_batches` (B / b), a stage that fits all of them fits any in-flight count,
    since it never holds more: the answer is then UNBOUNDED.
    """
    spare = memory_limit - static_memory_bytes(param_bytes)
    if spare < 0:
        return -1
    if act_bytes_per_micro_batch <= 0:
        return UNBOUNDED
    most = int(spare // act_bytes_per_micro_batch)
    return UNBOUNDED if num_micro_batches is not None and most >= num_micro_batches else most


def max_in_flight_micro_batches_array(param_bytes: np.ndarray, act_bytes_per_micro_batch: np.ndarray,
                                      memory_limit: float, num_micro_batches: int, cap: int) -> np.ndarray:
    """`max_in_flight_micro_batches` elementwise as int32, UNBOUNDED and anything above `cap` read as `cap` (the
    most the DP asks for), anything below -1 (negative activation bytes: the DP's tables hold them where a
    stop precedes its start, cells no segment is) as -1. `act_bytes_per_micro_batch` is overwritten.

    The quotient is rounded before the floor, where the scalar's `//` floors the exact quotient: the two
    agree whenever the byte counts are whole numbers below 2**52."""
    spare = memory_limit - OPTIMIZER_STATE_FACTOR * param_bytes
    k_max = act_bytes_per_micro_batch
    with np.errstate(divide="ignore", invalid="ignore"):  # no activations: inf, or nan with no spare either
        np.divide(spare, k_max, out=k_max)
    np.floor(k_max, out=k_max)
    whole = k_max >= num_micro_batches  # holding the whole mini-batch is no limit
    most = float(cap)
    np.fmin(k_max, most, out=k_max)  # fmin takes the cap over nan
    np.copyto(k_max, most, where=whole)
    np.copyto(k_max, -1.0, where=spare < 0)
    np.fmax(k_max, -1.0, out=k_max)
    return k_max.astype(np.int32)
