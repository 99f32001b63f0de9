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

Numbering. `F` and `B` carry the running stage's own micro-batch number: micro-batch m
of a stage with micro-batch size b holds samples [m*b, (m+1)*b) of the mini-batch.

A send or receive carries a *message* number in the numbering of its stage edge. A
message on edge src -> dst holds g = min(b_src, b_dst) samples, and message n holds
samples [n*g, (n+1)*g) (so both ends use the same number for the same message):

- equal sizes: message n is micro-batch n on both stages (the numbers coincide);
- b_src < b_dst (k = b_dst / b_src): src sends its micro-batch m as message m; dst's
  micro-batch m is messages m*k .. m*k+k-1, all received before dst's `F m`;
- b_src > b_dst (k = b_src / b_dst): src's micro-batch m is split into messages
  m*k .. m*k+k-1, each sent after src's `F m`; dst receives message m before its `F m`.

Gradients travel the same messages backwards (`SB n` on dst, `RB n` on src). For every
ordered pair of stages and direction the sends and the receives list the same message
numbers in the same order (the runtime relies on message order per rank pair). The
validator (`graphpipe.schedule.validate`) enforces all of this.
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
        return self in _COMPUTE

    @property
    def is_send(self) -> bool:
        return self in _SENDS

    @property
    def is_recv(self) -> bool:
        return self in _RECVS


# Plain sets (not enum attribute lookups) keep these checks cheap in the simulator's inner loop.
_COMPUTE = frozenset({ActionKind.FORWARD, ActionKind.BACKWARD})
_SENDS = frozenset({ActionKind.SEND_ACT, ActionKind.SEND_GRAD})
_RECVS = frozenset({ActionKind.RECV_ACT, ActionKind.RECV_GRAD})


_PATTERN = re.compile(r"^s(\d+)\.(?:(STEP|AR)|(F|B)(\d+)|(SF|SB)(\d+)>s(\d+)|(RF|RB)(\d+)<s(\d+))$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    stage: int
    kind: ActionKind
    micro_batch: int = -1  # -1 for AR and STEP
    peer: int = -1  # the other stage of a send or receive

    def __post_init__(self) -> None:
        code = self.kind.value
        if (code not in ("AR", "STEP")) != (self.micro_batch >= 0):
            raise ScheduleError(f"action {code} on stage {self.stage}: micro-batch {self.micro_batch}")
        if (len(code) == 2 and code[1] in "FB") != (self.peer >= 0):
            raise ScheduleError(f"action {code} on stage {self.stage}: peer {self.peer}")

    def __str__(self) -> str:
        code = self.kind.value
        if self.peer >= 0:  # a send (">") or a receive ("<")
            return f"s{self.stage}.{code}{self.micro_batch}{'>' if code[0] == 'S' else '<'}s{self.peer}"
        if self.micro_batch >= 0:
            return f"s{self.stage}.{code}{self.micro_batch}"
        return f"s{self.stage}.{code}"

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
