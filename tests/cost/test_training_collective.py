"""The all-reduce link fitted to what replicas in training waited: the ring formula on it gives their mean."""

from __future__ import annotations

import pytest

from graphpipe.cost.cluster import Link
from graphpipe.cost.formulas.communication import ring_all_reduce_ms
from graphpipe.cost.host_calibration import SizeTiming
from graphpipe.cost.training_collective import collective_in_training
from graphpipe.errors import CostError

ALONE = Link(name="gloo-all-reduce-measured", latency_us=150.0, bandwidth_gb_per_s=1.5)
GRAD_BYTES = 3_000_000


def _replica(*all_reduce_ms: float) -> list[SizeTiming]:
    return [SizeTiming(micro_batch_size=size, fwd_ms=1.0, bwd_ms=2.0, outside_ms=0.1, step_ms=0.5, iteration_ms=5.0,
                       iteration_spread=0.0, all_reduce_ms=ms) for size, ms in zip((1, 2, 4), all_reduce_ms)]


def test_the_ring_on_the_fitted_link_gives_the_replicas_mean_wait() -> None:
    transfer = ring_all_reduce_ms(ALONE, GRAD_BYTES, 2)
    # one replica waits 3 ms for the other's lag at every size (one size disturbed), the other not at all
    fast, slow = _replica(transfer + 3.0, transfer + 9.0, transfer + 3.0), _replica(transfer, transfer, transfer)
    link = collective_in_training([fast, slow], GRAD_BYTES, ALONE)
    assert ring_all_reduce_ms(link, GRAD_BYTES, 2) == pytest.approx(transfer + 1.5)
    assert link.bandwidth_gb_per_s == ALONE.bandwidth_gb_per_s and link.latency_us > ALONE.latency_us


def test_no_wait_keeps_the_link_measured_alone() -> None:
    quick = _replica(0.1, 0.1, 0.1)
    assert collective_in_training([quick, quick], GRAD_BYTES, ALONE) is ALONE


def test_one_replica_or_no_gradients_is_refused() -> None:
    with pytest.raises(CostError, match="2 or more"):
        collective_in_training([_replica(1.0, 1.0, 1.0)], GRAD_BYTES, ALONE)
    with pytest.raises(CostError, match="timing per size"):
        collective_in_training([_replica(1.0, 1.0, 1.0), _replica(1.0)], GRAD_BYTES, ALONE)
