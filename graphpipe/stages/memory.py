"""Memory per device of a stage, shared by the planner and the simulator.

    memory = static + activations
    static = 4 × parameter bytes    (fp32 weights, their gradients, Adam's two moments)
    activations = (held micro-batches) × act_bytes of one micro-batch on one device
    held micro-batches = in_flight_samples / micro_batch_size, rounded up, at most B / micro_batch_size

`act_bytes` of one micro-batch on one device is the cost table read at micro_batch_size / d
samples, so in-flight samples are shared over the d data-parallel devices. A stage holds
whole micro-batches and never more than the mini-batch (`graphpipe.stages.in_flight`).
"""

from __future__ import annotations

from graphpipe.stages.in_flight import held_samples

OPTIMIZER_STATE_FACTOR = 4  # weights + gradients + Adam first and second moments, all fp32
UNBOUNDED = 1 << 30  # "any number of micro-batches fits"


def static_memory_bytes(param_bytes: float) -> float:
    return OPTIMIZER_STATE_FACTOR * param_bytes


def activation_memory_bytes(act_bytes_per_micro_batch: float, in_flight_samples: int, micro_batch_size: int,
                            global_batch_size: int | None = None) -> float:
    """Activations alive at the peak: held micro-batches × one micro-batch's stored activations."""
    held = held_samples(in_flight_samples, micro_batch_size, global_batch_size)
    return act_bytes_per_micro_batch * (held // micro_batch_size)


def stage_memory_bytes(param_bytes: float, act_bytes_per_micro_batch: float, in_flight_samples: int,
                       micro_batch_size: int, global_batch_size: int | None = None) -> float:
    """Peak bytes on one device of a stage."""
    return static_memory_bytes(param_bytes) + activation_memory_bytes(
        act_bytes_per_micro_batch, in_flight_samples, micro_batch_size, global_batch_size)


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
