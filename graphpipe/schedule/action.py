"""Schedule actions: small immutable values with a text form that parses back.

Text forms (stage s2, micro-batch 3, peer stage s4):

    s2.F3        forward of micro-batch 3
    s2.B3        backward of micro-batch 3
    s2.I3        input-gradient half of that backward (a split backward: what the predecessors wait for)
    s2.W3        weight-gradient half of it (`graphpipe.runtime.split_backward`), after I3
    s2.SF3>s4    send the activations of micro-batch 3 to stage 4
    s4.RF3<s2    receive them
    s4.SB3>s2    send the gradient of micro-batch 3 back to stage 2
    s2.RB3<s4    receive it
    s2.AR        all-reduce the gradients inside the stage's data-parallel group
    s2.STEP      optimizer step

Numbering. `F` and `B` carry the running stage's own micro-batch number: micro-batch m
of a stage with micro-batch size b holds samples [m*b, (m+1)*b) of the mini-batch.

A stage runs each micro-batch's backward either whole (`B`) or split (`I` then `W`), the same way for all of
its micro-batches (`graphpipe.schedule.zero_bubble`).

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
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from graphpipe.errors import ScheduleError


class Compute(str, Enum):
    """Which computation a compute action runs."""

    FORWARD = "forward"
    BACKWARD = "backward"
    INPUT_GRAD = "input_grad"  # a split backward's first half: the gradients of the stage's received values
    WEIGHT_GRAD = "weight_grad"  # its second half: the gradients of the stage's parameters


class Payload(str, Enum):
    """What a message carries. Activations flow to successor stages, gradients back to predecessors."""

    ACTIVATION = "activation"
    GRADIENT = "gradient"

    @property
    def direction(self) -> str:
        """The message direction in text forms and message keys: "F" (forward) or "B" (backward)."""
        return "F" if self is Payload.ACTIVATION else "B"


@dataclass(frozen=True, slots=True, kw_only=True)
class Traits:
    """What an action kind does; the one place a new kind is described (see `ActionKind`)."""

    compute: Compute | None = None
    consumes: Payload | None = None  # a compute kind: received from every peer before it runs
    produces: Payload | None = None  # a compute kind: sent to every peer after it runs
    sends: Payload | None = None
    receives: Payload | None = None
    collective: bool = False  # the data-parallel (and shared-weight) gradient all-reduce
    step: bool = False  # the optimizer step
    half_of: Compute | None = None  # a compute kind that does part of another's work (a split backward's I and W)
    # How the count of micro-batches whose activations the stage holds changes (the in-flight and memory rule,
    # `held_change`): a forward makes them, and the last compute that reads them frees them. A split backward's
    # I leaves them held: its W still reads what the forward saved (the layers' inputs), so held W work costs
    # a whole micro-batch's activations until the W has run.
    held_change: int = 0
    param_grads: bool = False  # adds to the parameters' gradients (the all-reduce waits for the last one)


class ActionKind(str, Enum):
    """The kinds of schedule action, each with its text code and `Traits`.

    Everything that runs, lowers, checks or simulates schedules reads these properties instead of
    naming kinds, so a new kind (say a weight-gradient compute) is added here, plus a handler in
    the executor and a cost in the simulator, which refuse kinds they do not know.
    """

    _value_: str
    traits: Traits
    _payload: Payload | None  # derived once per kind: actions read these on every construction
    _numbered: bool

    FORWARD = "F", Traits(compute=Compute.FORWARD, consumes=Payload.ACTIVATION, produces=Payload.ACTIVATION,
                          held_change=1)
    BACKWARD = "B", Traits(compute=Compute.BACKWARD, consumes=Payload.GRADIENT, produces=Payload.GRADIENT,
                           held_change=-1, param_grads=True)
    INPUT_GRAD = "I", Traits(compute=Compute.INPUT_GRAD, consumes=Payload.GRADIENT, produces=Payload.GRADIENT,
                             half_of=Compute.BACKWARD)
    WEIGHT_GRAD = "W", Traits(compute=Compute.WEIGHT_GRAD, half_of=Compute.BACKWARD, held_change=-1,
                              param_grads=True)
    SEND_ACT = "SF", Traits(sends=Payload.ACTIVATION)
    RECV_ACT = "RF", Traits(receives=Payload.ACTIVATION)
    SEND_GRAD = "SB", Traits(sends=Payload.GRADIENT)
    RECV_GRAD = "RB", Traits(receives=Payload.GRADIENT)
    ALL_REDUCE = "AR", Traits(collective=True)
    STEP = "STEP", Traits(step=True)

    def __new__(cls, code: str, traits: Traits) -> ActionKind:
        member = str.__new__(cls, code)
        member._value_ = code
        member.traits = traits
        member._payload = traits.sends or traits.receives
        member._numbered = traits.compute is not None or member._payload is not None
        return member

    @property
    def code(self) -> str:
        """The kind's part of the text form ("F", "SF", "AR", ...)."""
        return self._value_

    @property
    def compute(self) -> Compute | None:
        return self.traits.compute

    @property
    def is_compute(self) -> bool:
        return self.traits.compute is not None

    @property
    def sends(self) -> Payload | None:
        return self.traits.sends

    @property
    def receives(self) -> Payload | None:
        return self.traits.receives

    @property
    def is_send(self) -> bool:
        return self.traits.sends is not None

    @property
    def is_recv(self) -> bool:
        return self.traits.receives is not None

    @property
    def is_message(self) -> bool:
        """A send or a receive: it names a peer stage and a message number."""
        return self.payload is not None

    @property
    def payload(self) -> Payload | None:
        """What a send or receive carries; None for other kinds."""
        return self._payload

    @property
    def direction(self) -> str:
        """The message direction, "F" (activations) or "B" (gradients); only sends and receives have one."""
        if self.payload is None:
            raise ValueError(f"action kind {self.name} carries no message, so it has no direction")
        return self.payload.direction

    @property
    def peer_is_upstream(self) -> bool:
        """Whether a send's or receive's peer is a predecessor stage (the message's edge is peer -> stage)."""
        return self.is_recv == (self.payload is Payload.ACTIVATION)

    @property
    def consumes(self) -> Payload | None:
        return self.traits.consumes

    @property
    def produces(self) -> Payload | None:
        return self.traits.produces

    @property
    def half_of(self) -> Compute | None:
        return self.traits.half_of

    @property
    def held_change(self) -> int:
        return self.traits.held_change

    @property
    def param_grads(self) -> bool:
        return self.traits.param_grads

    @property
    def is_collective(self) -> bool:
        return self.traits.collective

    @property
    def is_step(self) -> bool:
        return self.traits.step

    @property
    def has_micro_batch(self) -> bool:
        """Computes and messages carry a micro-batch (or message) number; AR and STEP do not."""
        return self._numbered


def send_kind(payload: Payload) -> ActionKind:
    """The kind that sends `payload`."""
    return _ONE_KIND[("sends", payload)]


def recv_kind(payload: Payload) -> ActionKind:
    """The kind that receives `payload`."""
    return _ONE_KIND[("receives", payload)]


def producer_kind(payload: Payload) -> ActionKind:
    """The whole compute kind whose result is sent as `payload` (not a half of one: `producer_kinds`)."""
    return _ONE_KIND[("produces", payload)]


def producer_kinds(payload: Payload) -> tuple[ActionKind, ...]:
    """Every compute kind whose result is sent as `payload`: the whole kind and the halves that produce it."""
    return tuple(kind for kind in ActionKind if kind.produces is payload)


def _one_kind_per_role() -> dict[tuple[str, Payload], ActionKind]:
    """One kind per role and payload; the halves of a split compute share their whole kind's roles."""
    table: dict[tuple[str, Payload], ActionKind] = {}
    for kind in ActionKind:
        for role in ("sends", "receives", "produces"):
            payload = getattr(kind.traits, role)
            if payload is not None and kind.half_of is None:
                if (role, payload) in table:
                    raise TypeError(f"{kind.name} and {table[(role, payload)].name} both have {role}={payload.value}")
                table[(role, payload)] = kind
    return table


_ONE_KIND = _one_kind_per_role()
_BY_CODE = {kind.code: kind for kind in ActionKind}


def _codes(pick: str) -> str:
    return "|".join(kind.code for kind in ActionKind if pick == _shape(kind))


def _shape(kind: ActionKind) -> str:
    if kind.is_send:
        return "send"
    if kind.is_recv:
        return "recv"
    return "numbered" if kind.has_micro_batch else "plain"


_PATTERN = re.compile(rf"^s(\d+)\.(?:({_codes('plain')})|({_codes('numbered')})(\d+)|({_codes('send')})(\d+)>s(\d+)"
                      rf"|({_codes('recv')})(\d+)<s(\d+))$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    stage: int
    kind: ActionKind
    micro_batch: int = -1  # -1 for AR and STEP
    peer: int = -1  # the other stage of a send or receive

    def __post_init__(self) -> None:
        kind = self.kind
        if kind._numbered != (self.micro_batch >= 0):
            raise ScheduleError(f"action {kind.code} on stage {self.stage}: micro-batch {self.micro_batch}")
        if (kind._payload is not None) != (self.peer >= 0):
            raise ScheduleError(f"action {kind.code} on stage {self.stage}: peer {self.peer}")

    def __str__(self) -> str:
        code = self.kind.code
        if self.peer >= 0:  # a send (">") or a receive ("<")
            return f"s{self.stage}.{code}{self.micro_batch}{'>' if self.kind.is_send else '<'}s{self.peer}"
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
            return cls(stage=stage, kind=_BY_CODE[match[2]])
        if match[3]:
            return cls(stage=stage, kind=_BY_CODE[match[3]], micro_batch=int(match[4]))
        if match[5]:
            return cls(stage=stage, kind=_BY_CODE[match[5]], micro_batch=int(match[6]), peer=int(match[7]))
        return cls(stage=stage, kind=_BY_CODE[match[8]], micro_batch=int(match[9]), peer=int(match[10]))


Step = tuple[ActionKind, int]  # one compute of a stage's order: (a compute kind, micro-batch)


def actions_of(stage: int, steps: Iterable[Step]) -> tuple[Action, ...]:
    """The stage's compute actions for its order's steps (`generate.compute_orders`)."""
    return tuple(Action(stage=stage, kind=kind, micro_batch=micro_batch) for kind, micro_batch in steps)
