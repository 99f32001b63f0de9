"""Graph-aware 1F1B (docs/method.md §5): warm-up from the in-flight count, then one forward, one backward.

Stages are handled from the last to the first (`warmup.in_flight_rule`): a stage's
warm-up is its in-flight samples / micro-batch size, so on a chain stage i of p runs
p - i forwards first. After the warm-up each forward is followed by the oldest pending
backward, i.e. every backward sits as early as the in-flight limit allows; forwards wait
for all predecessor stages and backwards for all successor stages (the receives that
`lower_comm` inserts). A chain of 3 stages with 4 micro-batches (compute only):

    stage | 0   1   2   3   4   5   6   7
    ------+-------------------------------
    s0    | F0  F1  F2  B0  F3  B1  B2  B3
    s1    | F0  F1  B0  F2  B1  F3  B2  B3
    s2    | F0  B0  F1  B1  F2  B2  F3  B3

With per-stage micro-batch sizes the same order runs on each stage in its own numbering;
`kfkb` groups the backwards and forwards k at a time instead.
"""

from __future__ import annotations

from graphpipe.schedule.action import ActionKind, Step
from graphpipe.schedule.warmup import warmup_counts
from graphpipe.stages.stage_graph import Plan

FORWARD, BACKWARD = ActionKind.FORWARD, ActionKind.BACKWARD


def order_steps(num_micro_batches: int, warmup: int, group: int = 1) -> list[Step]:
    """`warmup` forwards, then `group` backwards and `group` forwards at a time, then the remaining backwards."""
    steps: list[Step] = [(FORWARD, m) for m in range(warmup)]
    next_fwd, next_bwd = warmup, 0
    while next_bwd < num_micro_batches:
        for _ in range(group):
            if next_bwd < next_fwd:
                steps.append((BACKWARD, next_bwd))
                next_bwd += 1
        for _ in range(group):
            if next_fwd < num_micro_batches:
                steps.append((FORWARD, next_fwd))
                next_fwd += 1
    return steps


def one_f_one_b_compute(plan: Plan) -> dict[int, list[Step]]:
    """Each stage's computes in 1F1B order (before `lower_comm`)."""
    warmups = warmup_counts(plan)
    return {s.idx: order_steps(plan.num_micro_batches(s.idx), warmups[s.idx]) for s in plan.stages}
