"""Memory per device of a stage, shared by the planner and the simulator.

    memory = static + activations
    static = 4 × parameter bytes    (`graphpipe.cost.formulas.memory`, with the in-flight cap)
    activations = (held micro-batches) × act_bytes of one micro-batch on one device
    held micro-batches = in_flight_samples / micro_batch_size, rounded up, at most B / micro_batch_size

`act_bytes` of one micro-batch on one device is the cost table read at micro_batch_size / d
samples, so in-flight samples are shared over the d data-parallel devices. A stage holds
whole micro-batches and never more than the mini-batch (`graphpipe.stages.in_flight`).

A recomputing stage (`Stage.recompute`, `recompute_input_bytes` given) holds instead the inputs of each
held micro-batch plus one micro-batch's full activations (`graphpipe.cost.formulas.memory.recompute_activation_bytes`).
"""

from __future__ import annotations

from graphpipe.cost.formulas.memory import recompute_activation_bytes, static_memory_bytes
from graphpipe.stages.in_flight import held_samples


def activation_memory_bytes(act_bytes_per_micro_batch: float, in_flight_samples: int, micro_batch_size: int,
                            global_batch_size: int | None = None, *,
                            recompute_input_bytes: float | None = None) -> float:
    """Activations alive at the peak: held micro-batches × one micro-batch's stored activations; with
    `recompute_input_bytes` (one micro-batch's inputs on one device), the recomputing stage's rule."""
    held = held_samples(in_flight_samples, micro_batch_size, global_batch_size) // micro_batch_size
    if recompute_input_bytes is not None:
        return recompute_activation_bytes(recompute_input_bytes, act_bytes_per_micro_batch, held)
    return act_bytes_per_micro_batch * held


def stage_memory_bytes(param_bytes: float, act_bytes_per_micro_batch: float, in_flight_samples: int,
                       micro_batch_size: int, global_batch_size: int | None = None, *,
                       recompute_input_bytes: float | None = None) -> float:
    """Peak bytes on one device of a stage (`recompute_input_bytes`: a recomputing stage's inputs per micro-batch)."""
    return static_memory_bytes(param_bytes) + activation_memory_bytes(
        act_bytes_per_micro_batch, in_flight_samples, micro_batch_size, global_batch_size,
        recompute_input_bytes=recompute_input_bytes)
