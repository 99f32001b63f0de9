"""GPipe: every forward, then every backward, in micro-batch order on each stage.

A chain of 3 stages with 3 micro-batches (compute only):

    stage | 0   1   2   3   4   5
    ------+-----------------------
    s0    | F0  F1  F2  B0  B1  B2
    s1    | F0  F1  F2  B0  B1  B2
    s2    | F0  F1  F2  B0  B1  B2

Every stage keeps all of its micro-batches in flight, so memory grows with their number.
"""

from __future__ import annotations

from graphpipe.schedule.action import Action, B, F
from graphpipe.stages.stage_graph import Plan


def gpipe_order(stage: int, num_micro_batches: int) -> tuple[Action, ...]:
    return tuple(F(stage, m) for m in range(num_micro_batches)) + tuple(
        B(stage, m) for m in range(num_micro_batches))


def gpipe_compute(plan: Plan) -> dict[int, tuple[Action, ...]]:
    """Each stage's computes in GPipe order (before `lower_comm`)."""
    return {s.idx: gpipe_order(s.idx, plan.num_micro_batches(s.idx)) for s in plan.stages}
