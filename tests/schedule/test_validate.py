"""The validator accepts generated schedules and rejects broken ones with the grid marked."""

from __future__ import annotations

import pytest

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action
from graphpipe.schedule.generate import make_schedule
from graphpipe.schedule.schedule import Schedule
from graphpipe.schedule.validate import validate_schedule
from graphpipe.stages.stage_graph import Plan
from tests.simulation.factories import chain, diamond, fan, make_plan

PLANS = {
    "chain": lambda: chain(4, 2, 16),
    "diamond": lambda: diamond(1, 6),
    "fan": lambda: fan(4, 2, 2, 8),
    "kfkb-up": lambda: make_plan([(0, 1), (1, 2)], [1, 2, 4], 16),
    "kfkb-down": lambda: make_plan([(0, 1), (1, 2)], [4, 2, 1], 16),
    "skip": lambda: make_plan([(0, 1), (1, 2), (0, 2)], [2, 2, 2], 8),
}


@pytest.mark.parametrize("kind", ["1f1b", "gpipe", "kfkb"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_generated_schedules_validate(name: str, kind: str) -> None:
    plan = PLANS[name]()
    validate_schedule(make_schedule(plan, kind), plan)


def _edit(plan: Plan, stage: int, texts: list[str]) -> Schedule:
    schedule = make_schedule(plan)
    actions = dict(schedule.actions)
    actions[stage] = tuple(Action.parse(t) for t in texts)
    return Schedule(kind="1f1b", num_micro_batches=schedule.num_micro_batches, actions=actions)


def _texts(plan: Plan, stage: int) -> list[str]:
    return [str(a) for a in make_schedule(plan).actions[stage]]


def test_forward_before_its_receive_is_marked_in_the_grid() -> None:
    plan = chain(2, 1, 2)
    texts = _texts(plan, 1)
    texts[0], texts[1] = texts[1], texts[0]  # s1.F0 before s1.RF0<s0
    with pytest.raises(ScheduleError, match=r"F0 runs before receiving message\(s\) \[0\] from s0") as err:
        validate_schedule(_edit(plan, 1, texts), plan)
    assert "*F0*" in str(err.value) and "stage |" in str(err.value)


def test_backward_before_forward_is_rejected() -> None:
    plan = chain(1, 1, 2)
    with pytest.raises(ScheduleError, match="B0 before F0"):
        validate_schedule(_edit(plan, 0, ["s0.B0", "s0.F0", "s0.F1", "s0.B1", "s0.AR", "s0.STEP"]), plan)


def test_missing_step_is_rejected() -> None:
    plan = chain(1, 1, 1)
    with pytest.raises(ScheduleError, match="AR then STEP"):
        validate_schedule(_edit(plan, 0, ["s0.F0", "s0.B0", "s0.AR"]), plan)


def test_send_to_a_stage_that_is_not_a_successor_is_rejected() -> None:
    plan = chain(3, 1, 1)
    texts = _texts(plan, 0)
    texts[texts.index("s0.SF0>s1")] = "s0.SF0>s2"
    with pytest.raises(ScheduleError, match="s2 is not one"):
        validate_schedule(_edit(plan, 0, texts), plan)


def test_mismatched_message_order_is_rejected() -> None:
    """Both receives come before the forward that needs them, but in the other order than sent."""
    plan = make_plan([(0, 1)], [1, 2], 2)
    texts = _texts(plan, 1)
    assert texts[:2] == ["s1.RF0<s0", "s1.RF1<s0"]
    texts[0], texts[1] = texts[1], texts[0]
    with pytest.raises(ScheduleError, match="message order differs"):
        validate_schedule(_edit(plan, 1, texts), plan)


def test_deadlock_is_found_and_every_waiting_stage_marked() -> None:
    """s1 waits for a gradient before it has sent the activation s2 needs to make it."""
    plan = chain(3, 1, 1)
    texts = _texts(plan, 1)
    assert texts == ["s1.RF0<s0", "s1.F0", "s1.SF0>s2", "s1.RB0<s2", "s1.B0", "s1.SB0>s0", "s1.AR", "s1.STEP"]
    texts = ["s1.RF0<s0", "s1.F0", "s1.RB0<s2", "s1.SF0>s2", "s1.B0", "s1.SB0>s0", "s1.AR", "s1.STEP"]
    with pytest.raises(ScheduleError, match="deadlock") as err:
        validate_schedule(_edit(plan, 1, texts), plan)
    message = str(err.value)
    assert "s1 waits at s1.RB0<s2" in message and "s2 waits at s2.RF0<s1" in message
    assert "*RB0<s2*" in message and "*RF0<s1*" in message


def test_wrong_micro_batch_count_is_rejected() -> None:
    plan = chain(1, 1, 2)
    schedule = make_schedule(plan)
    bad = Schedule(kind="1f1b", num_micro_batches={0: 3}, actions=schedule.actions)
    with pytest.raises(ScheduleError, match="3 micro-batches, the plan 2"):
        validate_schedule(bad, plan)
