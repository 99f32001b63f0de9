"""Time per sample (TPS), the planner's objective for one stage (docs/method.md §2).

    TPS = (compute + p2p) / b + all_reduce / B

with compute and p2p the times of one micro-batch of b samples on one device, and the
data-parallel all-reduce of the stage's gradients, once per iteration, spread over the B
samples of the mini-batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def time_per_sample_ms(compute_ms: float, comm_ms: float, all_reduce_ms: float, micro_batch_size: int,
                       global_batch_size: int) -> float:
    return (compute_ms + comm_ms) / micro_batch_size + all_reduce_ms / global_batch_size


def time_per_sample_ms_array(compute_per_sample_ms: np.ndarray, comm_ms: np.ndarray,
                             all_reduce_ms: Sequence[np.ndarray | float], micro_batch_size: int,
                             global_batch_size: int) -> np.ndarray:
    """`time_per_sample_ms` over the DP's degree x segment tables: `all_reduce_ms[k]` is added to row k (degree k).

    The compute comes already divided by b (the DP keeps the compute per sample as a table of its own), so this
    sums compute / b + p2p / b where the scalar divides the sum: equal up to the last bit. `comm_ms` is
    overwritten with the result."""
    tps = comm_ms
    tps /= micro_batch_size
    tps += compute_per_sample_ms
    for row, reduce_ms in zip(tps, all_reduce_ms):
        row += reduce_ms / global_batch_size
    return tps
