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

from graphpipe.schedule.action import ActionKind, Step
from graphpipe.stages.stage_graph import Plan


def gpipe_steps(num_micro_batches: int) -> list[Step]:
    """Every forward, then every backward, in micro-batch order."""
    return [(ActionKind.FORWARD, m) for m in range(num_micro_batches)] + [
        (ActionKind.BACKWARD, m) for m in range(num_micro_batches)]


def gpipe_compute(plan: Plan) -> dict[int, list[Step]]:
    """Each stage's computes in GPipe order (before `lower_comm`)."""
    return {s.idx: gpipe_steps(plan.num_micro_batches(s.idx)) for s in plan.stages}
