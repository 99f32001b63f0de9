"""The in-flight rule of docs/method.md §3, with the paper's checks, and the simulator agreeing with it."""

from __future__ import annotations

import dataclasses

import pytest

from graphpipe.simulation.simulator import simulate
from graphpipe.stages.in_flight import chain_in_flight, held_samples, in_flight_samples
from graphpipe.stages.stage_graph import Plan
from tests.simulation.factories import make_costs, make_plan


def test_chain_of_three_with_one_micro_batch_size() -> None:
    assert chain_in_flight([4, 4, 4]) == (12, 8, 4)


def test_chain_of_three_with_growing_micro_batches_runs_kfkb() -> None:
    assert chain_in_flight([1, 2, 4]) == (10, 8, 4)


def test_upstream_micro_batch_larger_than_downstream_holds_whole_micro_batches() -> None:
    """[ours] b_i > b_j: n_j + b_i samples, rounded up to whole micro-batches of b_i."""
    assert chain_in_flight([4, 2]) == (8, 2)  # 2 + 4 = 6 is one and a half micro-batches of 4
    assert chain_in_flight([4, 2, 1]) == (8, 4, 1)
    assert chain_in_flight([8, 2]) == (16, 2)  # 2 + 8 = 10 samples: two micro-batches of 8


def test_rounding_is_to_the_stages_own_micro_batch() -> None:
    assert held_samples(10, 8) == 16
    assert held_samples(6, 4) == 8
    assert held_samples(8, 4) == 8
    assert held_samples(10, 8, global_batch_size=8) == 8


def test_a_stage_never_holds_more_than_the_mini_batch() -> None:
    """Mini-batch 16 in micro-batches of 16: one micro-batch is all there is, however deep the chain."""
    assert chain_in_flight([16, 16], global_batch_size=16) == (16, 16)
    assert chain_in_flight([4, 4, 4], global_batch_size=8) == (8, 8, 4)
    assert chain_in_flight([4, 4, 4], global_batch_size=64) == (12, 8, 4)


def test_fork_takes_the_larger_successor() -> None:
    """s0 -> s1 -> s3 and s0 -> s2 -> s4 -> s3: the fork counts the longer branch."""
    succ = {0: (1, 2), 1: (3,), 2: (4,), 4: (3,)}
    counts = in_flight_samples(succ, dict.fromkeys(range(5), 2))
    assert counts == {3: 2, 1: 4, 4: 4, 2: 6, 0: 8}
    capped = in_flight_samples(succ, dict.fromkeys(range(5), 2), global_batch_size=4)
    assert capped == {3: 2, 1: 4, 4: 4, 2: 4, 0: 4}


def test_one_size_everywhere_is_depth_to_sink_times_b() -> None:
    succ = {0: (1, 2), 1: (3,), 2: (3,)}
    counts = in_flight_samples(succ, dict.fromkeys(range(4), 3))
    assert counts == {0: 9, 1: 6, 2: 6, 3: 3}


def _with_rule(plan: Plan) -> Plan:
    """The plan with in-flight counts from the rule, capped by its mini-batch."""
    rule = in_flight_samples(plan.successors, {s.idx: s.micro_batch_size for s in plan.stages},
                             plan.global_batch_size)
    stages = tuple(dataclasses.replace(s, in_flight_samples=rule[s.idx]) for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


@pytest.mark.parametrize(("edges", "sizes", "global_batch"), [
    ([(0, 1)], [4, 2], 16),                      # b_i > b_j: rule 8, not 6
    ([(0, 1)], [8, 2], 32),
    ([(0, 1), (1, 2)], [4, 2, 1], 16),
    ([(0, 1), (1, 2)], [8, 2, 2], 16),
    ([(0, 1), (0, 2), (1, 3), (2, 3)], [4, 2, 4, 2], 32),
    ([(0, 1)], [16, 16], 16),                    # one micro-batch per mini-batch
    ([(0, 1), (1, 2), (2, 3)], [2, 2, 2, 2], 4),  # deeper than the mini-batch has micro-batches
    ([(0, 1), (1, 2)], [1, 2, 4], 8),
])
def test_simulated_peak_is_the_rule_exactly(edges: list[tuple[int, int]], sizes: list[int],
                                            global_batch: int) -> None:
    plan = _with_rule(make_plan(edges, sizes, global_batch))
    for kind in ("kfkb",) if len(set(sizes)) > 1 else ("1f1b", "kfkb"):
        result = simulate(plan, make_costs(plan), schedule=kind)
        assert dict(result.peak_in_flight_samples) == {s.idx: s.in_flight_samples for s in plan.stages}
