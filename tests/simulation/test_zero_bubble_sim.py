"""The simulator prices a split backward's halves and runs the zero-bubble schedule: never slower than 1F1B on a
chain and on fork/joins with W = I = half a backward, at the same peak memory."""

from __future__ import annotations

import pytest

from graphpipe.simulation.simulator import iteration_time_s, simulate
from graphpipe.stages.stage_graph import Plan
from tests.simulation.factories import chain, diamond, fan, make_costs, make_plan

SHAPES = {
    "chain": lambda: chain(4, 1, 8),
    "chain-dp": lambda: chain(3, 2, 16, ranks_per_stage=[1, 2, 1]),
    "diamond": lambda: diamond(1, 8),
    "fan": lambda: fan(3, 2, 1, 16),
    "sizes": lambda: make_plan([(0, 1), (1, 2)], [1, 2, 4], 16),
}


@pytest.mark.parametrize("uneven", [False, True])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_zero_bubble_is_no_slower_than_one_f_one_b_at_the_same_memory(name: str, uneven: bool) -> None:
    plan: Plan = SHAPES[name]()
    fwd = [1.0 + (0.5 * (s.idx % 3) if uneven else 0.0) for s in plan.stages]
    costs = make_costs(plan, fwd_ms=fwd, bwd_ms=2.0)
    whole, split = (simulate(plan, costs, schedule=kind) for kind in ("1f1b", "zero-bubble"))
    assert split.iteration_time_s <= whole.iteration_time_s
    assert split.peak_memory_bytes == whole.peak_memory_bytes
    assert iteration_time_s(plan, costs, schedule="zero-bubble") == split.iteration_time_s


def test_the_drain_holds_input_gradients_alone() -> None:
    """Chain of 3, 4 micro-batches, F = 1 and B = 2 per micro-batch: 1F1B takes 18 units, zero-bubble 16 (the
    docstring of `graphpipe.schedule.zero_bubble`)."""
    plan = chain(3, 1, 4)
    costs = make_costs(plan, fwd_ms=1.0, bwd_ms=2.0)
    assert simulate(plan, costs, schedule="1f1b").iteration_time_s == pytest.approx(18e-3)
    assert simulate(plan, costs, schedule="zero-bubble").iteration_time_s == pytest.approx(16e-3)


def test_input_and_weight_halves_split_the_backward() -> None:
    """I = W = half the backward on a stage with predecessors; on a source, I is empty and W the whole."""
    plan = chain(2, 1, 2)
    timeline = simulate(plan, make_costs(plan, fwd_ms=1.0, bwd_ms=3.0), schedule="zero-bubble").timeline
    durations = {event.action: event.duration_ms for event in timeline.events if event.kind == "backward"}
    assert durations["s1.I0"] == durations["s1.W0"] == pytest.approx(1.5)
    assert (durations["s0.I0"], durations["s0.W0"]) == (pytest.approx(0.0), pytest.approx(3.0))
