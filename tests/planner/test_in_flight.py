"""The in-flight rule of PAPER.md §3, with the paper's checks."""

from __future__ import annotations

from graphpipe.planner.in_flight import chain_in_flight, in_flight_samples


def test_chain_of_three_with_one_micro_batch_size() -> None:
    assert chain_in_flight([4, 4, 4]) == (12, 8, 4)


def test_chain_of_three_with_growing_micro_batches_runs_kfkb() -> None:
    assert chain_in_flight([1, 2, 4]) == (10, 8, 4)


def test_upstream_micro_batch_larger_than_downstream_is_split() -> None:
    """[ours] b_i > b_j: n_i = n_j + b_i."""
    assert chain_in_flight([4, 2]) == (6, 2)


def test_fork_takes_the_larger_successor() -> None:
    """s0 -> s1 -> s3 and s0 -> s2 -> s4 -> s3: the fork counts the longer branch."""
    succ = {0: (1, 2), 1: (3,), 2: (4,), 4: (3,)}
    counts = in_flight_samples(succ, dict.fromkeys(range(5), 2))
    assert counts == {3: 2, 1: 4, 4: 4, 2: 6, 0: 8}


def test_one_size_everywhere_is_depth_to_sink_times_b() -> None:
    succ = {0: (1, 2), 1: (3,), 2: (3,)}
    counts = in_flight_samples(succ, dict.fromkeys(range(4), 3))
    assert counts == {0: 9, 1: 6, 2: 6, 3: 3}
