"""Lower communication onto a compute order: the sends and receives of every stage edge.

Given each stage's order of computes, insert what each compute kind consumes before it and
produces after it (`ActionKind.consumes`, `ActionKind.produces`):

- before `F m`: `RF n<p` for every predecessor p (sorted) and every message n of m;
- after `F m`: `SF n>s` for every successor s (sorted): fan-out sends one copy to each;
- before `B m`: `RB n<s` for every successor s: fan-in, the runtime sums the gradients;
- after `B m`: `SB n>p` for every predecessor p;
- a split backward's `I m` as `B m` (it sends the gradients), its `W m` with nothing around it;
- at the end: `AR` then `STEP`.

A chain of 2 stages with 2 micro-batches under 1F1B, lowered:

    stage | 0       1       2       3       4       5       6       7       8       9
    ------+---------------------------------------------------------------------------
    s0    | F0      SF0>s1  F1      SF1>s1  RB0<s1  B0      RB1<s1  B1      AR      STEP
    s1    | RF0<s0  F0      B0      SB0>s0  RF1<s0  F1      B1      SB1>s0  AR      STEP

Sends never block, and a receive sits right before the compute that needs it, so the
lowered schedule deadlocks only if the compute order itself does (the validator checks).
Forwards and backwards run in increasing micro-batch order on every stage, so the
sends and receives of each stage pair come in the same order on both ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action, ActionKind, recv_kind, send_kind
from graphpipe.schedule.messages import messages_of
from graphpipe.schedule.schedule import Schedule
from graphpipe.stages.stage_graph import Plan

Messages = list[tuple[ActionKind, int, int]]  # (send or receive kind, peer stage, messages per micro-batch)
CLOSING_KINDS = (ActionKind.ALL_REDUCE, ActionKind.STEP)  # every stage's list ends with these


def lower_comm(plan: Plan, compute: Mapping[int, Sequence[Action]], kind: str) -> Schedule:
    """The full schedule: `compute` (per stage, compute actions only) with communication inserted."""
    actions = {stage.idx: _lower_stage(plan, stage.idx, compute[stage.idx]) for stage in plan.stages}
    counts = {stage.idx: plan.num_micro_batches(stage.idx) for stage in plan.stages}
    return Schedule(kind=kind, num_micro_batches=counts, actions=actions)


def _lower_stage(plan: Plan, idx: int, compute: Sequence[Action]) -> tuple[Action, ...]:
    out: list[Action] = []
    around = comm_around(plan, idx)
    for action in compute:
        if not action.kind.is_compute:
            raise ScheduleError(f"lowering takes compute actions only, got {action}")
        before, after = around[action.kind]
        _comm(out, idx, action.micro_batch, before)
        out.append(action)
        _comm(out, idx, action.micro_batch, after)
    out += [Action(stage=idx, kind=kind) for kind in CLOSING_KINDS]
    return tuple(out)


def comm_around(plan: Plan, idx: int) -> dict[ActionKind, tuple[Messages, Messages]]:
    """Per compute kind of stage `idx`: the receives before it and the sends after it, each as (message kind,
    peer, messages per micro-batch of `idx`) in peer order. The one statement of the rules above: the
    lowering and the simulator's ranking path (`graphpipe.simulation.engine.iteration_ms`) both read it."""
    return {kind: (_messages(plan, idx, None if kind.consumes is None else recv_kind(kind.consumes)),
                   _messages(plan, idx, None if kind.produces is None else send_kind(kind.produces)))
            for kind in ActionKind if kind.is_compute}


def _messages(plan: Plan, idx: int, kind: ActionKind | None) -> Messages:
    if kind is None:
        return []
    upstream = kind.peer_is_upstream
    peers = plan.predecessors[idx] if upstream else plan.successors[idx]
    return [(kind, peer, len(messages_of(plan, idx, 0, *((peer, idx) if upstream else (idx, peer)))))
            for peer in peers]


def _comm(out: list[Action], idx: int, micro_batch: int, messages: Messages) -> None:
    """Append one action per message of `micro_batch` on each edge of `messages` (`comm_around`)."""
    for kind, peer, per_micro in messages:
        first = micro_batch * per_micro
        out += [Action(stage=idx, kind=kind, micro_batch=n, peer=peer) for n in range(first, first + per_micro)]
