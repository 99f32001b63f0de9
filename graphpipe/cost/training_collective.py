"""The all-reduce as data-parallel training meets it, as the ring formula's link.

`graphpipe.runtime.loopback.measure_all_reduce` times gloo's all-reduce between two processes that call it
together. Replicas in training do not: they compute the same ops on shared cores, one finishes its backward
later, and the other waits for it inside the all-reduce. The simulator's replicas are identical and arrive
together, so on a measured link their iteration ends where the average replica's compute ends, not the
slowest's (data-parallel plans came out 2-50% short on the development machine). With two replicas, one
waits for the other's lag and the other not at all: the mean over the replicas of their all-reduce time is
the transfer plus half the lag, and a simulated replica computing at the fitted (mean) pace that then takes
that long ends where the slowest does. So the link keeps the measured bandwidth and takes as its latency
whatever makes the ring formula give that mean for the reference's gradients.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from graphpipe.cost.cluster import Link
from graphpipe.cost.formulas.communication import ring_all_reduce_ms
from graphpipe.cost.host_calibration import SizeTiming
from graphpipe.errors import CostError


def collective_in_training(replicas: Sequence[Sequence[SizeTiming]], grad_bytes: float, alone: Link) -> Link:
    """`alone` (the all-reduce measured on its own) with its latency raised so that the ring formula on it gives
    the replicas' mean all-reduce time for `grad_bytes` (the median over the sizes they trained at); `alone`
    itself where training waited no longer than that."""
    workers = len(replicas)
    if workers < 2 or grad_bytes <= 0:
        raise CostError(f"need 2 or more data-parallel replicas with gradients, got {workers} and {grad_bytes} bytes")
    sizes = {len(per_rank) for per_rank in replicas}
    if sizes != {len(replicas[0])} or not replicas[0]:
        raise CostError(f"every replica needs a timing per size, got {sorted(sizes)}")
    measured = statistics.median(statistics.fmean(per_rank[size].all_reduce_ms for per_rank in replicas)
                                 for size in range(len(replicas[0])))
    extra_ms = measured - ring_all_reduce_ms(alone, grad_bytes, workers)
    if extra_ms <= 0:
        return alone
    return dataclasses.replace(alone, name="gloo-all-reduce-in-training",
                               latency_us=alone.latency_us + extra_ms * 1e3 / (2 * (workers - 1)))
