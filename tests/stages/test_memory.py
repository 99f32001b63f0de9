"""Memory per device: 4 x parameters + in-flight activations (shared with the simulator)."""

from __future__ import annotations

import pytest

from graphpipe.cost.formulas.memory import (
    OPTIMIZER_STATE_FACTOR,
    UNBOUNDED,
    max_in_flight_micro_batches,
    static_memory_bytes,
)
from graphpipe.planner.api import plan_candidates
from graphpipe.stages.memory import stage_memory_bytes
from tests.planner.factories import GiB, chain_graph, make_cluster, make_costs


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


def test_a_stage_that_fits_the_whole_mini_batch_fits_any_in_flight_count() -> None:
    assert max_in_flight_micro_batches(param_bytes=10, act_bytes_per_micro_batch=300, memory_limit=1000,
                                       num_micro_batches=4) == 3
    assert max_in_flight_micro_batches(param_bytes=10, act_bytes_per_micro_batch=300, memory_limit=1000,
                                       num_micro_batches=3) == UNBOUNDED


def test_activations_count_whole_micro_batches_and_at_most_the_mini_batch() -> None:
    assert stage_memory_bytes(param_bytes=0, act_bytes_per_micro_batch=300, in_flight_samples=6,
                              micro_batch_size=4) == 600  # 6 samples: two micro-batches of 4
    assert stage_memory_bytes(param_bytes=0, act_bytes_per_micro_batch=300, in_flight_samples=32,
                              micro_batch_size=16, global_batch_size=16) == 300


@pytest.mark.parametrize("planner", ["graphpipe", "sequential", "pipedream", "piper", "exhaustive"])
def test_memory_check_counts_at_most_the_mini_batch(planner: str) -> None:
    """Two heavy ops, one micro-batch per mini-batch: the first of two stages holds one micro-batch
    (not two), so the two-stage plan fits where the uncapped rule would reject it."""
    graph = chain_graph(2)
    act = 3 << 30  # per sample; a micro-batch of 2 is 6 GiB per op, weights 4 × 1 GiB
    costs = make_costs(graph, act_bytes=act, param_bytes=1 << 30)
    limit = 4 * GiB + 2 * act + GiB  # one micro-batch fits, two do not
    found = plan_candidates(graph, costs, make_cluster(2), 2, planner=planner, micro_batch_sizes=(2,),
                            memory_limit=limit)
    best = found[0]
    assert best.num_stages == 2 and best.depth == 2
    assert [s.in_flight_samples for s in best.stages] == [2, 2]
    assert max(s.memory_bytes for s in best.stages) <= limit
