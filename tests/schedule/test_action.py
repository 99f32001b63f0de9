"""Action and Schedule text forms parse back to the same values; action kinds carry their properties."""

from __future__ import annotations

import pytest

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action, ActionKind, Compute, Payload, Traits, producer_kind, recv_kind, send_kind
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


# ---- the properties every kind carries ---------------------------------------------------------

ROLES = ("is_compute", "is_send", "is_recv", "is_collective", "is_step")
DIRECTIONS = {ActionKind.SEND_ACT: "F", ActionKind.RECV_ACT: "F", ActionKind.SEND_GRAD: "B",
              ActionKind.RECV_GRAD: "B"}


@pytest.mark.parametrize("kind", list(ActionKind))
def test_every_kind_has_exactly_one_role(kind: ActionKind) -> None:
    assert [getattr(kind, role) for role in ROLES].count(True) == 1
    assert isinstance(kind.traits, Traits)
    assert (kind.compute is not None) == kind.is_compute
    assert kind.is_message == (kind.payload is not None) == (kind.is_send or kind.is_recv)
    assert kind.has_micro_batch == (kind.is_compute or kind.is_message)


@pytest.mark.parametrize("kind", list(ActionKind))
def test_only_messages_have_a_direction(kind: ActionKind) -> None:
    if kind.is_message:
        assert kind.direction == DIRECTIONS[kind]
    else:
        assert kind not in DIRECTIONS
        with pytest.raises(ValueError, match=kind.name):
            _ = kind.direction


@pytest.mark.parametrize("payload", list(Payload))
def test_send_and_receive_of_a_payload_agree(payload: Payload) -> None:
    send, recv = send_kind(payload), recv_kind(payload)
    assert send.sends is payload and recv.receives is payload
    assert send.direction == recv.direction == payload.direction
    assert send.peer_is_upstream != recv.peer_is_upstream  # the two ends of one edge
    producer = producer_kind(payload)
    assert producer.is_compute and producer.produces is payload


def test_compute_kinds_say_what_they_exchange() -> None:
    forward, backward = ActionKind.FORWARD, ActionKind.BACKWARD
    assert (forward.compute, forward.consumes, forward.produces) == (Compute.FORWARD, Payload.ACTIVATION,
                                                                     Payload.ACTIVATION)
    assert (backward.compute, backward.consumes, backward.produces) == (Compute.BACKWARD, Payload.GRADIENT,
                                                                        Payload.GRADIENT)
    assert recv_kind(Payload.ACTIVATION).peer_is_upstream  # activations come from predecessors
    assert not recv_kind(Payload.GRADIENT).peer_is_upstream  # gradients from successors


def test_codes_are_the_text_forms() -> None:
    assert [kind.code for kind in ActionKind] == ["F", "B", "I", "W", "SF", "RF", "SB", "RB", "AR", "STEP"]
    assert all(kind.code == kind.value for kind in ActionKind)
