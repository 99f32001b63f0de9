"""The event-driven core: run every stage's action list in simulated time.

Each stage is one sequential stream (its ranks run in lock-step on their shares). A
forward, backward, all-reduce or step occupies the stream for its duration. A send
costs the stream nothing: its transfer starts when it is posted (after the previous
transfer on the same stage pair and direction, which keeps messages in order) and
occupies neither the sender's nor the receiver's compute. A receive holds the stream
until its transfer has arrived. Every action remembers what it waited for, so the
critical path can be walked back from the last optimizer step.

When the ranks of a node share fewer host cores than there are ranks (`Cluster.cores_per_node`,
see `cores.py`), compute actions also wait for a free core; the engine then runs one action
at a time, always of the stage that is ready earliest, so that cores go to requests in time
order. Otherwise each stage runs ahead as far as it can (faster, and the same times).

The lists are first compiled to plain tuples (durations and message keys resolved
once), because the planner simulates many candidate plans. A planner ranking candidates
needs only the iteration time (`iteration_ms`): the engine then records no events and
stops as soon as some stage's clock plus the compute still ahead of it passes the time
to beat (the stage's clock only moves forward, by at least each action's duration); until
a stage's last backward has run, the gradient's trip upstream after it (the caller's drain
bound) counts too. A split backward's halves (I and W) are priced by `graphpipe.schedule.backward_split`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from graphpipe.cost.cluster import Cluster
from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action, ActionKind, Step
from graphpipe.schedule.backward_split import split_backward_ms
from graphpipe.schedule.grid import format_grid
from graphpipe.schedule.lower_comm import CLOSING_KINDS, comm_around
from graphpipe.schedule.messages import message_samples
from graphpipe.schedule.schedule import Schedule
from graphpipe.simulation.comm_model import message_ms, optimizer_step_ms, plan_stage_all_reduce_ms
from graphpipe.simulation.cores import CorePool, cores_are_shared
from graphpipe.simulation.result import Event
from graphpipe.stages.stage_cost import StageCost
from graphpipe.stages.stage_graph import Plan

_RUN, _SEND, _RECV = 0, 1, 2
_DIRECTION = {kind: kind.direction for kind in ActionKind if kind.is_message}

Slot = tuple[int, int]  # (stage, position in its list)
MessageKey = tuple[int, int, str, int]  # (sender stage, receiver stage, "F" or "B", message)
Op = tuple[int, float, MessageKey | None, Action | None, str, int]  # code, duration, key, action, event kind, number


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """What the engine saw: one event per action and transfer, and what each action waited for."""

    events: tuple[Event, ...]
    cause: Mapping[Slot, Slot | None]
    end_ms: Mapping[Slot, float]


def run_schedule(plan: Plan, schedule: Schedule, costs: Mapping[int, StageCost], cluster: Cluster) -> Run:
    """Simulate one iteration of `schedule`; raise `ScheduleError` (with the grid) on a deadlock."""
    compiled = {stage: _compile(plan, stage, actions, costs[stage], cluster)
                for stage, actions in schedule.actions.items()}
    engine = _Engine(plan, compiled, _cores(plan, cluster))
    stuck = engine.run()
    if stuck:
        waits = ", ".join(f"s{s} waits at {schedule.actions[s][p]}" for s, p in sorted(stuck.items()))
        raise ScheduleError(f"deadlock in simulation: {waits}\n{format_grid(schedule, marks=stuck, window=8)}")
    return Run(events=tuple(sorted(engine.events, key=lambda e: (e.start_ms, e.stage, e.end_ms))),
               cause=engine.cause, end_ms=engine.end_ms)


def iteration_ms(plan: Plan, compute: Mapping[int, Sequence[Step]], costs: Mapping[int, StageCost], cluster: Cluster,
                 beat_ms: float = math.inf, drain_ms: Mapping[int, float] | None = None) -> float | None:
    """`run_schedule`'s iteration (the last action's end) for the schedule that lowers `compute` (each stage's
    compute order as steps: `graphpipe.schedule.generate.compute_steps`), or None as soon as it is certain to end
    after `beat_ms`. Nothing is recorded, and the lowered lists are compiled without an `Action` per
    compute or message (see the module docstring). `drain_ms`: per stage, a least time from the end of its last
    backward to the end of the iteration (its all-reduce and step included), for an earlier stop."""
    compiled = {stage: _compile_compute(plan, stage, steps, costs[stage], cluster)
                for stage, steps in compute.items()}
    if any(kind.half_of is not None for steps in compute.values() for kind, _ in steps):
        drain_ms = None  # see `_least_ahead`: the drain of whole backwards does not bound split ones
    engine = _Engine(plan, compiled, _cores(plan, cluster), record=False, beat_ms=beat_ms, drain_ms=drain_ms)
    try:
        stuck = engine.run()
    except _BeatenError:
        return None
    if stuck:
        waits = ", ".join(f"s{s} at position {p}" for s, p in sorted(stuck.items()))
        raise ScheduleError(f"deadlock in simulation: {waits} (simulate the plan for the schedule's grid)")
    return max(engine.clock.values(), default=0.0)


def _cores(plan: Plan, cluster: Cluster) -> CorePool | None:
    return CorePool(plan, cluster) if cores_are_shared(plan, cluster) else None


class _BeatenError(Exception):
    """Raised inside `iteration_ms` when the iteration is certain to end after the time to beat."""


class _Engine:
    def __init__(self, plan: Plan, compiled: Mapping[int, list[Op]], cores: CorePool | None = None,
                 record: bool = True, beat_ms: float = math.inf, drain_ms: Mapping[int, float] | None = None) -> None:
        self.plan, self.compiled, self.cores = plan, compiled, cores
        self.record, self.beat_ms = record, beat_ms
        # per stage and position, the least time the iteration still runs past the stage's clock
        self.ahead_ms = {} if math.isinf(beat_ms) else {
            stage: _least_ahead(ops, (drain_ms or {}).get(stage, 0.0)) for stage, ops in compiled.items()}
        self.pos = dict.fromkeys(compiled, 0)
        self.clock = dict.fromkeys(compiled, 0.0)
        self.arrivals: dict[MessageKey, tuple[float, Slot]] = {}
        self.channel_free: dict[tuple[int, int, str], float] = {}
        self.events: list[Event] = []
        self.cause: dict[Slot, Slot | None] = {}
        self.end_ms: dict[Slot, float] = {}

    def run(self) -> dict[int, int]:
        """Run every stage as far as it goes; the stages left waiting (stage: position), empty when all ended."""
        if self.cores is None:
            progress = True
            while progress:
                progress = False
                for stage in self.compiled:
                    progress = self._advance(stage) or progress
        else:
            self._run_in_time_order()
        return {s: p for s, p in self.pos.items() if p < len(self.compiled[s])}

    def _run_in_time_order(self) -> None:
        """Run one action at a time, of the stage that is ready earliest (ties: lower stage)."""
        while True:
            ready = [(self.clock[s], s) for s, p in self.pos.items()
                     if p < len(self.compiled[s]) and self._can_run(s, p)]
            if not ready:
                return
            self._advance(min(ready)[1], limit=1)

    def _can_run(self, stage: int, pos: int) -> bool:
        code, _, key, *_ = self.compiled[stage][pos]
        return code != _RECV or key in self.arrivals

    def _advance(self, stage: int, limit: int | None = None) -> bool:
        """Run `stage`'s actions (at most `limit`) until it finishes or blocks on a receive; True if any ran."""
        if not self.record and self.cores is None:
            return self._advance_clock(stage)
        ops, pos, clock = self.compiled[stage], self.pos[stage], self.clock[stage]
        ranks = self.plan.stages[stage].ranks
        start_pos, record = pos, self.record
        stop = len(ops) if limit is None else min(len(ops), pos + limit)
        while pos < stop:
            code, duration, key, action, kind, micro_batch = ops[pos]
            cause: Slot | None = (stage, pos - 1) if pos else None
            end = clock + duration
            if code == _RUN and self.cores is not None and duration > 0:
                duration = self.cores.duration_ms(stage, duration)
                start, waited = self.cores.acquire(stage, clock, duration, (stage, pos))
                if start > clock:
                    if record:
                        self.events.append(Event(stage=stage, ranks=ranks, action=str(action), kind="core_wait",
                                                 start_ms=clock, end_ms=start, micro_batch=micro_batch))
                    clock, cause = start, waited
                end = clock + duration
            if code == _RECV:
                assert key is not None
                got = self.arrivals.get(key)
                if got is None:
                    break
                if got[0] > clock:
                    end, cause = got[0], got[1]
            elif code == _SEND:  # posted asynchronously: the stream goes on at once
                assert key is not None
                self._post(key, duration, clock, (stage, pos), ranks, action)
                end = clock
            if record:
                if code != _SEND:
                    self.events.append(Event(stage=stage, ranks=ranks, action=str(action), kind=kind, start_ms=clock,
                                             end_ms=end, micro_batch=micro_batch))
                self.cause[(stage, pos)], self.end_ms[(stage, pos)] = cause, end
            clock = end
            pos += 1
        self.pos[stage], self.clock[stage] = pos, clock
        if self.ahead_ms and clock + self.ahead_ms[stage][pos] > self.beat_ms:
            raise _BeatenError
        return pos > start_pos

    def _advance_clock(self, stage: int) -> bool:
        """`_advance` where nothing is recorded and no core is shared (a ranking's simulation): the same clocks,
        arrivals and stop, without the events, causes and core waits, in one loop over the stage's tuples
        (`tests/simulation/test_iteration_time.py` holds its iteration equal to the recording path's)."""
        ops, pos, clock = self.compiled[stage], self.pos[stage], self.clock[stage]
        arrivals, post = self.arrivals, self._post
        start_pos, stop = pos, len(ops)
        while pos < stop:
            code, duration, key, _, _, _ = ops[pos]
            if code == _RUN:
                clock = clock + duration
            elif code == _RECV:
                assert key is not None
                got = arrivals.get(key)
                if got is None:
                    break
                if got[0] > clock:
                    clock = got[0]
            else:  # a send: its transfer starts once the channel is free
                assert key is not None
                post(key, duration, clock, (stage, pos), (), None)
            pos += 1
        self.pos[stage], self.clock[stage] = pos, clock
        if self.ahead_ms and clock + self.ahead_ms[stage][pos] > self.beat_ms:
            raise _BeatenError
        return pos > start_pos

    def _post(self, key: MessageKey, duration: float, posted_ms: float, slot: Slot, ranks: tuple[int, ...],
              action: Action | None) -> None:
        """Start a transfer once its channel is free; record when it arrives."""
        channel = (key[0], key[1], key[2])
        start = max(posted_ms, self.channel_free.get(channel, 0.0))
        self.channel_free[channel] = start + duration
        self.arrivals[key] = (start + duration, slot)
        if duration > 0 and self.record:
            self.events.append(Event(stage=key[0], ranks=ranks, action=str(action), kind="transfer", start_ms=start,
                                     end_ms=start + duration, micro_batch=key[3]))


def _least_ahead(ops: Sequence[Op], drain_ms: float) -> list[float]:
    """Per position, the compute still ahead on the stream (core stretch only lengthens it), plus, up to the
    last backward, what `drain_ms` adds beyond the stream's own work after that backward: the last backward
    ends at least that compute, less the work after it, past the clock, and the iteration `drain_ms` later.
    The caller's drain (`plan_bounds`) counts each predecessor's whole backward after the gradient arrives; under
    split backwards a predecessor's W overlaps the gradient's further trip upstream, so `iteration_ms` then
    passes no drain and only the stream's own compute bounds it."""
    ahead = list(accumulate((op[1] if op[0] == _RUN else 0.0 for op in reversed(ops)), initial=0.0))[::-1]
    last = max((pos for pos, op in enumerate(ops) if op[4] == "backward"), default=-1)
    extra = drain_ms - ahead[last + 1]
    if extra > 0:
        for pos in range(last + 1):
            ahead[pos] += extra
    return ahead


def _compile(plan: Plan, stage: int, actions: tuple[Action, ...], cost: StageCost, cluster: Cluster) -> list[Op]:
    """Each action as (code, duration, message key, the action, event kind, micro-batch)."""
    fixed = _stream_kinds(plan, stage, cost, cluster)
    transfers = _Transfers(plan, cluster)
    ops: list[Op] = []
    for action in actions:
        kind = action.kind
        if kind.is_send:
            key = (stage, action.peer, _DIRECTION[kind], action.micro_batch)
            duration = transfers.ms(key)
            ops.append((_SEND, duration, key, action, "send", action.micro_batch))
        elif kind.is_recv:
            key = (action.peer, stage, _DIRECTION[kind], action.micro_batch)
            ops.append((_RECV, 0.0, key, action, "recv", action.micro_batch))
        else:
            duration, event_kind = _stream_cost(fixed, stage, action)
            ops.append((_RUN, duration, None, action, event_kind, action.micro_batch))
    return ops


def _compile_compute(plan: Plan, stage: int, compute: Sequence[Step], cost: StageCost, cluster: Cluster) -> list[Op]:
    """`_compile` of the stage's lowered list (`lower_comm`), built from its compute order's steps with the
    lowering's own rules (`comm_around`) but no `Action` per compute or message: the ranking's simulations lower
    thousands of each."""
    fixed = _stream_kinds(plan, stage, cost, cluster)
    around = {kind: ([(peer, _DIRECTION[recv], per_micro) for recv, peer, per_micro in before],
                     [(peer, _DIRECTION[send], per_micro) for send, peer, per_micro in after])
              for kind, (before, after) in comm_around(plan, stage).items()}
    transfer_ms = _Transfers(plan, cluster).ms
    ops: list[Op] = []
    append = ops.append
    for kind, number in compute:
        before, after = around[kind]
        for peer, direction, per_micro in before:
            for n in range(number * per_micro, (number + 1) * per_micro):
                append((_RECV, 0.0, (peer, stage, direction, n), None, "recv", n))
        duration, event_kind = fixed[kind] if kind in fixed else _stream_cost(
            fixed, stage, Action(stage=stage, kind=kind, micro_batch=number))
        append((_RUN, duration, None, None, event_kind, number))
        for peer, direction, per_micro in after:
            for n in range(number * per_micro, (number + 1) * per_micro):
                key = (stage, peer, direction, n)
                append((_SEND, transfer_ms(key), key, None, "send", n))
    for kind in CLOSING_KINDS:
        duration, event_kind = _stream_cost(fixed, stage, Action(stage=stage, kind=kind))
        append((_RUN, duration, None, None, event_kind, -1))
    return ops


def _stream_cost(fixed: Mapping[ActionKind, tuple[float, str]], stage: int, action: Action) -> tuple[float, str]:
    """Duration and event kind of an action that occupies the stream (`_stream_kinds`); other kinds are refused."""
    if action.kind not in fixed:
        raise ScheduleError(f"stage {stage}: the simulator has no cost for action kind {action.kind.name} ({action})")
    return fixed[action.kind]


def _stream_kinds(plan: Plan, stage: int, cost: StageCost, cluster: Cluster) -> dict[ActionKind, tuple[float, str]]:
    """Duration and event kind of every kind that occupies the stage's stream; other kinds are refused."""
    all_reduce_ms = plan_stage_all_reduce_ms(cluster, plan, stage, cost)
    input_ms, weight_ms = split_backward_ms(cost.bwd_ms, bool(plan.predecessors[stage]))
    return {ActionKind.FORWARD: (cost.fwd_ms, _event_kind(ActionKind.FORWARD)),
            ActionKind.BACKWARD: (cost.bwd_ms, _event_kind(ActionKind.BACKWARD)),
            ActionKind.INPUT_GRAD: (input_ms, _event_kind(ActionKind.INPUT_GRAD)),
            ActionKind.WEIGHT_GRAD: (weight_ms, _event_kind(ActionKind.WEIGHT_GRAD)),
            ActionKind.ALL_REDUCE: (all_reduce_ms, _event_kind(ActionKind.ALL_REDUCE)),
            ActionKind.STEP: (optimizer_step_ms(cluster, cost.param_bytes), _event_kind(ActionKind.STEP))}


def _event_kind(kind: ActionKind) -> str:
    """Its compute ("forward", "backward"; a split backward's halves are "backward" too), "all_reduce" or "step":
    the names the Gantt chart and trace colour."""
    if kind.compute is not None:
        return (kind.half_of or kind.compute).value
    if kind.is_collective:
        return "all_reduce"
    if kind.is_step:
        return "step"
    raise ScheduleError(f"action kind {kind.name} does not occupy a stage's stream")


class _Transfers:
    """Transfer times of the messages one stage sends. Which rank holds a sample repeats every micro-batch
    of each stage (`sample_split`), so the pieces of a message repeat every lcm(b_sender, b_receiver)
    samples: per edge, its samples per message, that period and its tensors, and the times per position
    in the period (a schedule sends thousands of messages on a few edges, one time per edge where both
    stages have the same micro-batch size)."""

    def __init__(self, plan: Plan, cluster: Cluster) -> None:
        self.plan, self.cluster = plan, cluster
        self._edges: dict[tuple[int, str], tuple[int, int, float, int]] = {}
        self._times: dict[tuple[int, str, int], float] = {}

    def ms(self, key: MessageKey) -> float:
        """The transfer time of the message `key` (sent by this stage)."""
        sender, receiver, direction, message = key
        plan = self.plan
        edge_key = (receiver, direction)
        found = self._edges.get(edge_key)
        if found is None:
            src, dst = (sender, receiver) if direction == "F" else (receiver, sender)
            edge = plan.edge(src, dst)
            period = math.lcm(plan.stages[sender].micro_batch_size, plan.stages[receiver].micro_batch_size)
            found = self._edges[edge_key] = (int(message_samples(plan, src, dst)), period, edge.bytes_per_sample,
                                             len(edge.tensors))
        per_message, period, bytes_per_sample, num_tensors = found
        start = message * per_message
        time_key = (receiver, direction, start % period)
        hit = self._times.get(time_key)
        if hit is None:
            hit = self._times[time_key] = message_ms(self.cluster, plan.stages[sender], plan.stages[receiver], start,
                                                     start + per_message, bytes_per_sample, num_tensors)
        return hit
