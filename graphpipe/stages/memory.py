"""Memory per device of a stage, shared by the planner and the simulator.

    memory = static + activations
    static = 4 × parameter bytes    (`graphpipe.cost.formulas.memory`, with the in-flight cap)
    activations = (held micro-batches) × act_bytes of one micro-batch on one device
    held micro-batches = in_flight_samples / micro_batch_size, rounded up, at most B / micro_batch_size

`act_bytes` of one micro-batch on one device is the cost table read at micro_batch_size / d
samples, so in-flight samples are shared over the d data-parallel devices. A stage holds
whole micro-batches and never more than the mini-batch (`graphpipe.stages.in_flight`).
"""

from __future__ import annotations

from graphpipe.cost.formulas.memory import static_memory_bytes
from graphpipe.stages.in_flight import held_samples


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
