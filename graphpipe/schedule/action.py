"""Schedule actions: small immutable values with a text form that parses back.

Text forms (stage s2, micro-batch 3, peer stage s4):

    s2.F3        forward of micro-batch 3
    s2.B3        backward of micro-batch 3
    s2.SF3>s4    send the activations of micro-batch 3 to stage 4
    s4.RF3<s2    receive them
    s4.SB3>s2    send the gradient of micro-batch 3 back to stage 2
    s2.RB3<s4    receive it
    s2.AR        all-reduce the gradients inside the stage's data-parallel group
    s2.STEP      optimizer step

Micro-batch numbers are in the numbering of the stage that runs the action. When two
stages use different micro-batch sizes, a communication action carries the micro-batch
of the stage that runs it; the schedule generator and runtime map sample ranges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from graphpipe.errors import ScheduleError


class ActionKind(str, Enum):
    FORWARD = "F"
    BACKWARD = "B"
    SEND_ACT = "SF"
    RECV_ACT = "RF"
    SEND_GRAD = "SB"
    RECV_GRAD = "RB"
    ALL_REDUCE = "AR"
    STEP = "STEP"

    @property
    def is_compute(self) -> bool:
        return self in (ActionKind.FORWARD, ActionKind.BACKWARD)

    @property
    def is_send(self) -> bool:
        return self in (ActionKind.SEND_ACT, ActionKind.SEND_GRAD)

    @property
    def is_recv(self) -> bool:
        return self in (ActionKind.RECV_ACT, ActionKind.RECV_GRAD)


_PATTERN = re.compile(r"^s(\d+)\.(?:(STEP|AR)|(F|B)(\d+)|(SF|SB)(\d+)>s(\d+)|(RF|RB)(\d+)<s(\d+))$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    stage: int
    kind: ActionKind
    micro_batch: int = -1  # -1 for AR and STEP
    peer: int = -1  # the other stage of a send or receive

    def __post_init__(self) -> None:
        needs_mb = self.kind not in (ActionKind.ALL_REDUCE, ActionKind.STEP)
        if needs_mb != (self.micro_batch >= 0):
            raise ScheduleError(f"action {self.kind.value} on stage {self.stage}: micro-batch {self.micro_batch}")
        if (self.kind.is_send or self.kind.is_recv) != (self.peer >= 0):
            raise ScheduleError(f"action {self.kind.value} on stage {self.stage}: peer {self.peer}")

    def __str__(self) -> str:
        head = f"s{self.stage}.{self.kind.value}"
        if self.kind in (ActionKind.ALL_REDUCE, ActionKind.STEP):
            return head
        if self.kind.is_send:
            return f"{head}{self.micro_batch}>s{self.peer}"
        if self.kind.is_recv:
            return f"{head}{self.micro_batch}<s{self.peer}"
        return f"{head}{self.micro_batch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        match = _PATTERN.match(text.strip())
        if not match:
            raise ScheduleError(f"cannot parse action {text!r}; expected forms like s2.F3, s2.SF3>s4, s4.RB3<s2, "
                                "s2.AR, s2.STEP")
        stage = int(match[1])
        if match[2]:
            return cls(stage=stage, kind=ActionKind(match[2]))
        if match[3]:
            return cls(stage=stage, kind=ActionKind(match[3]), micro_batch=int(match[4]))
        if match[5]:
            return cls(stage=stage, kind=ActionKind(match[5]), micro_batch=int(match[6]), peer=int(match[7]))
        return cls(stage=stage, kind=ActionKind(match[8]), micro_batch=int(match[9]), peer=int(match[10]))


def F(stage: int, micro_batch: int) -> Action:  # noqa: N802 - reads like the text form
    return Action(stage=stage, kind=ActionKind.FORWARD, micro_batch=micro_batch)


def B(stage: int, micro_batch: int) -> Action:  # noqa: N802
    return Action(stage=stage, kind=ActionKind.BACKWARD, micro_batch=micro_batch)
