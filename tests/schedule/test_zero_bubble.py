"""The zero-bubble schedule: split backwards with W's in each stage's bubbles, under the 1F1B in-flight limit."""

from __future__ import annotations

import dataclasses

import pytest

import graphpipe.schedule.zero_bubble as zero_bubble_module
from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action, ActionKind
from graphpipe.schedule.backward_split import split_backward_ms
from graphpipe.schedule.generate import make_schedule
from graphpipe.schedule.grid import format_grid
from graphpipe.schedule.schedule import Schedule
from graphpipe.schedule.validate import validate_schedule
from graphpipe.schedule.warmup import warmup_counts
from graphpipe.simulation.memory import peak_live_micro_batches
from graphpipe.stages.stage_graph import Plan
from tests.schedule.docstring_tables import docstring_table
from tests.schedule.test_validate import PLANS
from tests.simulation.factories import chain, diamond

ZB = "zero-bubble"
SPLIT = (ActionKind.INPUT_GRAD, ActionKind.WEIGHT_GRAD)


def test_docstring_table() -> None:
    drawn = format_grid(make_schedule(chain(3, 1, 4), ZB), compute_only=True)
    assert drawn == docstring_table(zero_bubble_module.__doc__)


@pytest.mark.parametrize("recompute", ["none", "s1"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_plan_shape_validates_with_split_backwards(name: str, recompute: str) -> None:
    plan = PLANS[name]().with_recompute(recompute)
    schedule = make_schedule(plan, ZB)
    validate_schedule(schedule, plan)
    for stage in plan.stages:
        kinds = {action.kind for action in schedule.actions[stage.idx]}
        assert (ActionKind.BACKWARD in kinds) == stage.recompute
        assert set(SPLIT) <= kinds or stage.recompute


@pytest.mark.parametrize("name", sorted(PLANS))
def test_held_w_work_stays_within_the_one_f_one_b_in_flight_limit(name: str) -> None:
    """A micro-batch is held from its F to its W; no stage holds more than its 1F1B warm-up, so the memory the
    planner's in-flight rule gives holds for the split schedule too."""
    plan = PLANS[name]()
    limits = warmup_counts(plan)
    split, whole = make_schedule(plan, ZB), make_schedule(plan, "1f1b")
    for stage in plan.stages:
        peak = peak_live_micro_batches(split.actions[stage.idx])
        assert peak <= limits[stage.idx]
        assert peak == peak_live_micro_batches(whole.actions[stage.idx])


def test_weights_wait_for_a_bubble_or_the_limit() -> None:
    """On a fork/join the join's predecessors drain at different times: each W runs where its stage would wait,
    or where one more forward would pass the in-flight limit; never ahead of work the stage could do."""
    plan = diamond(1, 8)
    order = [a for a in make_schedule(plan, ZB).actions[1] if a.kind.is_compute]
    for index, action in enumerate(order[:-1]):
        if action.kind is ActionKind.WEIGHT_GRAD and order[index + 1].kind is ActionKind.FORWARD:
            held = sum(a.kind.held_change for a in order[:index])
            assert held == warmup_counts(plan)[1]


def test_text_forms_parse_back() -> None:
    for text in ("s2.I3", "s2.W3"):
        assert str(Action.parse(text)) == text
    schedule = make_schedule(diamond(1, 4), ZB)
    assert Schedule.from_text(schedule.to_text()).actions == schedule.actions


def test_source_stages_have_no_input_gradient_to_compute() -> None:
    assert split_backward_ms(4.0, receives_inputs=False) == (0.0, 4.0)
    assert split_backward_ms(4.0, receives_inputs=True) == (2.0, 2.0)


# ---- the validator's rules for split backwards ----------------------------------------------------------
def _edited(plan: Plan, stage: int, change: dict[str, str]) -> Schedule:
    """The zero-bubble schedule with stage `stage`'s actions replaced as `change` says ("" drops one)."""
    schedule = make_schedule(plan, ZB)
    texts = [change.get(str(a), str(a)) for a in schedule.actions[stage]]
    texts = [text for text in texts if text]
    actions = dict(schedule.actions)
    actions[stage] = tuple(Action.parse(t) for t in texts)
    return dataclasses.replace(schedule, actions=actions)


def _swap(plan: Plan, stage: int, first: str, second: str) -> Schedule:
    schedule = make_schedule(plan, ZB)
    texts = [str(a) for a in schedule.actions[stage]]
    i, j = texts.index(first), texts.index(second)
    texts[i], texts[j] = texts[j], texts[i]
    actions = dict(schedule.actions)
    actions[stage] = tuple(Action.parse(t) for t in texts)
    return dataclasses.replace(schedule, actions=actions)


def test_a_weight_gradient_before_its_input_gradient_is_rejected() -> None:
    plan = chain(2, 1, 4)
    with pytest.raises(ScheduleError, match=r"W0 before I0"):
        validate_schedule(_swap(plan, 1, "s1.I0", "s1.W0"), plan)


def test_whole_and_split_backwards_on_one_stage_are_rejected() -> None:
    plan = chain(2, 1, 4)
    with pytest.raises(ScheduleError, match=r"all whole \(B\) or all split \(I, W\), not both"):
        validate_schedule(_edited(plan, 1, {"s1.I1": "s1.B1", "s1.W1": ""}), plan)


def test_a_missing_weight_gradient_is_rejected() -> None:
    plan = chain(2, 1, 4)
    schedule = make_schedule(plan, ZB)
    actions = dict(schedule.actions)
    actions[1] = tuple(a for a in schedule.actions[1] if str(a) != "s1.W3")
    with pytest.raises(ScheduleError, match="only 3 of 4 weight_grads"):
        validate_schedule(dataclasses.replace(schedule, actions=actions), plan)


def test_a_split_on_a_recomputing_stage_is_rejected() -> None:
    plan = chain(3, 1, 4)
    schedule = make_schedule(plan, ZB)
    with pytest.raises(ScheduleError, match="stage 1 recomputes its forward, so it cannot split its backward"):
        validate_schedule(schedule, plan.with_recompute("s1"))
