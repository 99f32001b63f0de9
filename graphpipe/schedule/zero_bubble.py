"""Zero-bubble 1F1B on a stage graph (`zero-bubble`): split backwards, weight gradients in each stage's bubbles.

Qi et al. (ICLR 2024) split a backward into its input-gradient half I, which the predecessor stages wait
for, and its weight-gradient half W, which only the optimizer step waits for. Each stage here keeps the
graph-aware 1F1B order of forwards and backwards (`one_f_one_b`), runs every B as its I, and places its W's:

- in its own bubbles: where the stage's next forward or I would wait for a message, its oldest pending W
  runs instead;
- under its in-flight limit: a micro-batch's activations stay held until its W (`Traits.held_change`), so
  before a forward that would hold more micro-batches than the stage's 1F1B warm-up (the planner's in-flight
  rule, `warmup.warmup_counts`), the oldest pending W runs first. The stage's peak memory is 1F1B's, and
  the planner's memory rule holds as it is;
- the W's still pending after the last I run before the all-reduce.

Where a stage would wait depends on the whole graph, since parallel branches drain at different times: the
orders come from a list-scheduling run over the stage DAG with the plan's stage times (`fwd_ms`, `bwd_ms`
divided by `backward_split.split_backward_ms`; where the plan has none, one and two units per sample a rank
computes; transfers left out) that always advances the stage able to start earliest. Only W's move and they
exchange no messages, so the forwards and I's keep 1F1B's order per stage, and the schedule is deadlock-free
because 1F1B is.

A recomputing stage (`Stage.recompute`) keeps whole backwards: under `torch.utils.checkpoint` a split
backward's I and its W would each run the stage's forward again (the validator refuses the split there).

A chain of 3 stages with 4 micro-batches and no stage times, so per micro-batch F = 1, I = 1, W = 1 (s0, a
source, has an empty I and W = 2), compute only:

    stage | 0   1   2   3   4   5   6   7   8   9   10  11
    ------+------------------------------------------------
    s0    | F0  F1  F2  I0  W0  F3  I1  W1  I2  W2  I3  W3
    s1    | F0  F1  I0  W0  F2  I1  W1  F3  I2  W2  I3  W3
    s2    | F0  I0  W0  F1  I1  W1  F2  I2  W2  F3  I3  W3

Here every W can follow its I at once: the in-flight limit forces W0 before F3 on s0, and in the drain s1
fills the wait for s2's I3 with W2. The gain over 1F1B is that a gradient leaves a stage after its I, so the
drain's critical path holds I's alone (16 units instead of 1F1B's 18 on this chain with B = 2).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from graphpipe.schedule.action import ActionKind, Step
from graphpipe.schedule.backward_split import split_backward_ms
from graphpipe.schedule.messages import messages_of, micro_batch_of
from graphpipe.schedule.one_f_one_b import one_f_one_b_compute
from graphpipe.schedule.warmup import warmup_counts
from graphpipe.stages.stage_graph import Plan

FORWARD, BACKWARD = ActionKind.FORWARD, ActionKind.BACKWARD
INPUT_GRAD, WEIGHT_GRAD = ActionKind.INPUT_GRAD, ActionKind.WEIGHT_GRAD
_UNIT_FWD_MS, _UNIT_BWD_MS = 1.0, 2.0  # per sample on a rank: the stage times of a plan that records none


@dataclass(slots=True)
class _Stream:
    """One stage during the list-scheduling run."""

    base: list[Step]  # 1F1B's forwards and (split or whole) backwards, in order
    times: dict[ActionKind, float]
    limit: int  # most micro-batches held at once
    pos: int = 0
    clock: float = 0.0
    held: int = 0
    pending: deque[int] = field(default_factory=deque)  # micro-batches whose W is still to run
    out: list[Step] = field(default_factory=list)


def zero_bubble_compute(plan: Plan) -> dict[int, list[Step]]:
    """Each stage's computes in zero-bubble order (before `lower_comm`)."""
    return _ListScheduler(plan).run()


class _ListScheduler:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        limits = warmup_counts(plan)
        self.streams = {idx: _Stream(base=_base_order(plan, idx, steps), times=_stage_times(plan, idx),
                                     limit=limits[idx])
                        for idx, steps in one_f_one_b_compute(plan).items()}
        self.finished: dict[tuple[bool, int, int], float] = {}  # (gradient?, stage, micro-batch) -> end
        self.needs: dict[tuple[int, ActionKind, int], list[tuple[bool, int, int]]] = {}

    def run(self) -> dict[int, list[Step]]:
        neighbours = {idx: (idx, *self.plan.predecessors[idx], *self.plan.successors[idx]) for idx in self.streams}
        choices = {idx: self._choice(idx) for idx in self.streams}
        while True:
            ready = [(choice[0], idx) for idx, choice in choices.items() if choice is not None]
            if not ready:
                break
            start, idx = min(ready)
            choice = choices[idx]
            assert choice is not None
            self._run(idx, start, choice[1])
            for other in neighbours[idx]:
                choices[other] = self._choice(other)
        assert all(s.pos == len(s.base) and not s.pending for s in self.streams.values()), "1F1B order deadlocked"
        return {idx: stream.out for idx, stream in self.streams.items()}

    def _choice(self, idx: int) -> tuple[float, Step] | None:
        """When stage `idx` can start its next compute, and which: the next of its order, or a pending W."""
        stream = self.streams[idx]
        held_w = (stream.clock, (WEIGHT_GRAD, stream.pending[0])) if stream.pending else None
        if stream.pos == len(stream.base):
            return held_w
        kind, micro_batch = stream.base[stream.pos]
        if kind is FORWARD and stream.held >= stream.limit and held_w is not None:
            return held_w
        ready = self._ready_ms(idx, kind, micro_batch)
        if ready is None or ready > stream.clock:  # the stage would wait: fill the bubble with a W
            return held_w if held_w is not None else (None if ready is None else (ready, (kind, micro_batch)))
        return stream.clock, (kind, micro_batch)

    def _run(self, idx: int, start: float, step: Step) -> None:
        stream = self.streams[idx]
        kind, micro_batch = step
        stream.clock = start + stream.times[kind]
        stream.held += kind.held_change
        stream.out.append(step)
        if kind is WEIGHT_GRAD:
            stream.pending.popleft()
            return
        stream.pos += 1
        if kind is INPUT_GRAD:
            stream.pending.append(micro_batch)
        self.finished[(kind is not FORWARD, idx, micro_batch)] = stream.clock

    def _ready_ms(self, idx: int, kind: ActionKind, micro_batch: int) -> float | None:
        """When every message the compute consumes has been produced (None: one has not been yet)."""
        key = (idx, kind, micro_batch)
        if key not in self.needs:
            self.needs[key] = _producers(self.plan, idx, kind, micro_batch)
        ready = 0.0
        for producer in self.needs[key]:
            end = self.finished.get(producer)
            if end is None:
                return None
            ready = max(ready, end)
        return ready


def _producers(plan: Plan, idx: int, kind: ActionKind, micro_batch: int) -> list[tuple[bool, int, int]]:
    """(gradient?, stage, micro-batch) of the computes whose messages `kind` `micro_batch` of `idx` consumes:
    its predecessors' forwards, or its successors' backwards (whole or I)."""
    if kind is FORWARD:
        return [(False, p, micro_batch_of(plan, p, n, p, idx))
                for p in plan.predecessors[idx] for n in messages_of(plan, idx, micro_batch, p, idx)]
    return [(True, q, micro_batch_of(plan, q, n, idx, q))
            for q in plan.successors[idx] for n in messages_of(plan, idx, micro_batch, idx, q)]


def _base_order(plan: Plan, idx: int, steps: list[Step]) -> list[Step]:
    """1F1B's order, each backward as its I where the stage splits (every stage but a recomputing one)."""
    if plan.stages[idx].recompute:
        return steps
    return [(INPUT_GRAD if kind is BACKWARD else kind, micro_batch) for kind, micro_batch in steps]


def _stage_times(plan: Plan, idx: int) -> dict[ActionKind, float]:
    stage = plan.stages[idx]
    samples = stage.micro_batch_size / stage.data_parallel_degree  # what one rank computes of a micro-batch
    fwd_ms, bwd_ms = (stage.fwd_ms, stage.bwd_ms) if stage.fwd_ms + stage.bwd_ms > 0 else (
        _UNIT_FWD_MS * samples, _UNIT_BWD_MS * samples)
    input_ms, weight_ms = split_backward_ms(bwd_ms, bool(plan.predecessors[idx]))
    return {FORWARD: fwd_ms, BACKWARD: bwd_ms, INPUT_GRAD: input_ms, WEIGHT_GRAD: weight_ms}

