"""Action and Schedule text forms parse back to the same values."""

from __future__ import annotations

import pytest

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action, ActionKind
from graphpipe.schedule.schedule import Schedule

TEXTS = ["s2.F3", "s2.B3", "s2.SF3>s4", "s4.RF3<s2", "s4.SB3>s2", "s2.RB3<s4", "s2.AR", "s2.STEP", "s10.F12"]


@pytest.mark.parametrize("text", TEXTS)
def test_action_text_round_trips(text: str) -> None:
    action = Action.parse(text)
    assert str(action) == text
    assert Action.parse(str(action)) == action


def test_parsed_fields() -> None:
    action = Action.parse("s4.RB7<s9")
    assert (action.stage, action.kind, action.micro_batch, action.peer) == (4, ActionKind.RECV_GRAD, 7, 9)
    assert action.kind.is_recv and not action.kind.is_compute


@pytest.mark.parametrize("text", ["s2.X3", "2.F3", "s2.F", "s2.SF3", "s2.AR1"])
def test_bad_text_is_rejected(text: str) -> None:
    with pytest.raises(ScheduleError, match="cannot parse"):
        Action.parse(text)


def test_schedule_text_round_trips() -> None:
    text = "# schedule 1f1b micro-batches s0=2 s1=2\ns0: s0.F0 s0.SF0>s1 s0.RB0<s1 s0.B0 s0.AR s0.STEP\n" \
           "s1: s1.RF0<s0 s1.F0 s1.B0 s1.SB0>s0 s1.AR s1.STEP\n"
    schedule = Schedule.from_text(text)
    assert schedule.to_text() == text
    assert Schedule.from_dict(schedule.to_dict()).actions == schedule.actions
    assert schedule.num_micro_batches == {0: 2, 1: 2}


def test_action_under_wrong_stage_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="listed under stage"):
        Schedule(kind="1f1b", num_micro_batches={0: 1}, actions={0: (Action.parse("s1.F0"),)})
