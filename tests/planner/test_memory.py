"""Memory per device: 4 x parameters + in-flight activations (shared with the simulator)."""

from __future__ import annotations

from graphpipe.planner.memory import (
    OPTIMIZER_STATE_FACTOR,
    max_in_flight_micro_batches,
    stage_memory_bytes,
    static_memory_bytes,
)


def test_static_state_is_weights_gradients_and_two_adam_moments() -> None:
    assert OPTIMIZER_STATE_FACTOR == 4
    assert static_memory_bytes(1000) == 4000


def test_in_flight_samples_count_whole_micro_batches_of_activations() -> None:
    # 12 samples in flight at b = 4: three micro-batches of 300 bytes each on one device
    assert stage_memory_bytes(param_bytes=10, act_bytes_per_micro_batch=300, in_flight_samples=12,
                              micro_batch_size=4) == 40 + 900


def test_most_micro_batches_that_fit() -> None:
    assert max_in_flight_micro_batches(param_bytes=10, act_bytes_per_micro_batch=300, memory_limit=1000) == 3
    assert max_in_flight_micro_batches(param_bytes=300, act_bytes_per_micro_batch=1, memory_limit=1000) == -1
    assert max_in_flight_micro_batches(param_bytes=0, act_bytes_per_micro_batch=0, memory_limit=1) > 1000
