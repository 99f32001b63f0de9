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


# ---- activation recomputation ------------------------------------------------------------------------
# A stage that recomputes (`Stage.recompute`) keeps only its inputs per micro-batch in flight and runs its
# forward again inside its backward, under `torch.utils.checkpoint`: the full activations of a micro-batch
# exist only from that recompute to the end of the same backward, and a stage runs one backward at a time.
#
#     activations = held micro-batches × input bytes of one micro-batch + activations of one micro-batch
#     k_max       = floor((memory limit - static - activations of one micro-batch) / input bytes of one)
#
# "Input bytes" are what the checkpoint keeps of a micro-batch: the values the stage receives (its incoming
# stage edges' bytes per sample) and the model inputs it reads, at the rank's share of the micro-batch
# (`graphpipe.stages.recompute.recompute_input_bytes`). Counting the one micro-batch whose forward is
# recomputed both in the held inputs and in its full activations is on the safe side by one input.

def recompute_activation_bytes(input_bytes_per_micro_batch: float, act_bytes_per_micro_batch: float,
                               held_micro_batches: int) -> float:
    """Activations alive at the peak of a recomputing stage that holds `held_micro_batches` micro-batches: the
    inputs of each, plus one micro-batch's full activations while its backward recomputes them (0 when it holds
    none)."""
    if held_micro_batches <= 0:
        return 0.0
    return held_micro_batches * input_bytes_per_micro_batch + act_bytes_per_micro_batch


def max_in_flight_micro_batches_recompute(param_bytes: float, input_bytes_per_micro_batch: float,
                                          act_bytes_per_micro_batch: float, memory_limit: float,
                                          num_micro_batches: int | None = None) -> int:
    """`max_in_flight_micro_batches` of a recomputing stage: the weights and one micro-batch's full activations
    must fit, then every held micro-batch costs its inputs alone (-1 where the first part does not fit): the rule
    for a stage whose micro-batches cost their inputs, in the memory one micro-batch's activations leave."""
    return max_in_flight_micro_batches(param_bytes, input_bytes_per_micro_batch,
                                       memory_limit - act_bytes_per_micro_batch, num_micro_batches)


def max_in_flight_micro_batches_recompute_array(param_bytes: np.ndarray, input_bytes_per_micro_batch: np.ndarray,
                                                act_bytes_per_micro_batch: np.ndarray, memory_limit: float,
                                                num_micro_batches: int, cap: int) -> np.ndarray:
    """`max_in_flight_micro_batches_recompute` elementwise as int32, read as `max_in_flight_micro_batches_array`
    reads its scalar (UNBOUNDED and anything above `cap` as `cap`, anything below -1 as -1), for the DP's tables
    once it prices recomputing segments. `input_bytes_per_micro_batch` is overwritten."""
    spare = memory_limit - OPTIMIZER_STATE_FACTOR * param_bytes - act_bytes_per_micro_batch
    k_max = input_bytes_per_micro_batch
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(spare, k_max, out=k_max)
    np.floor(k_max, out=k_max)
    whole = k_max >= num_micro_batches
    most = float(cap)
    np.fmin(k_max, most, out=k_max)
    np.copyto(k_max, most, where=whole)
    np.copyto(k_max, -1.0, where=spare < 0)
    np.fmax(k_max, -1.0, out=k_max)
    return k_max.astype(np.int32)
