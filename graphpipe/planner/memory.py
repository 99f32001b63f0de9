"""Memory per device of a stage, shared by the planner and the simulator.

    memory = static + activations
    static = 4 × parameter bytes    (fp32 weights, their gradients, Adam's two moments)
    activations = (in_flight_samples / micro_batch_size) × act_bytes of one micro-batch on one device

`act_bytes` of one micro-batch on one device is the cost table read at micro_batch_size / d
samples, so in-flight samples are shared over the d data-parallel devices.
"""

from __future__ import annotations

OPTIMIZER_STATE_FACTOR = 4  # weights + gradients + Adam first and second moments, all fp32


def static_memory_bytes(param_bytes: float) -> float:
    return OPTIMIZER_STATE_FACTOR * param_bytes


def activation_memory_bytes(act_bytes_per_micro_batch: float, in_flight_samples: int, micro_batch_size: int) -> float:
    """Activations alive at the peak: in-flight micro-batches × one micro-batch's stored activations."""
    return act_bytes_per_micro_batch * in_flight_samples / micro_batch_size


def stage_memory_bytes(param_bytes: float, act_bytes_per_micro_batch: float, in_flight_samples: int,
                       micro_batch_size: int) -> float:
    """Peak bytes on one device of a stage."""
    return static_memory_bytes(param_bytes) + activation_memory_bytes(
        act_bytes_per_micro_batch, in_flight_samples, micro_batch_size)


def max_in_flight_micro_batches(param_bytes: float, act_bytes_per_micro_batch: float, memory_limit: float) -> int:
    """Most micro-batches a stage can keep in flight within `memory_limit` (-1 if its weights alone do not fit)."""
    spare = memory_limit - static_memory_bytes(param_bytes)
    if spare < 0:
        return -1
    if act_bytes_per_micro_batch <= 0:
        return 1 << 30
    return int(spare // act_bytes_per_micro_batch)
