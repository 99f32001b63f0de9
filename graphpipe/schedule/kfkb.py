"""kFkB for per-stage micro-batch sizes: a stage feeding a k-times larger micro-batch works k at a time.

A stage with micro-batch b_i whose successors use b_j = k * b_i needs k of its forwards
before the successor can start one, and gets k backwards' worth of gradient at once. So
after the warm-up (in-flight samples / b_i forwards) it runs k backwards, then k
forwards. Stage 0 (b=1) feeding stage 1 (b=2), mini-batch 8 (compute only):

    stage | 0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15
    ------+----------------------------------------------------------------
    s0    | F0  F1  F2  F3  B0  B1  F4  F5  B2  B3  F6  F7  B4  B5  B6  B7
    s1    | F0  B0  F1  B1  F2  B2  F3  B3

Stage 0 keeps n = n_1 + b_1 = 4 samples in flight, stage 1 keeps n_1 = b_1 = 2. With equal
sizes everywhere kFkB is 1F1B.
"""

from __future__ import annotations

from graphpipe.schedule.action import Step
from graphpipe.schedule.one_f_one_b import order_steps
from graphpipe.schedule.warmup import warmup_counts
from graphpipe.stages.stage_graph import Plan


def group_size(plan: Plan, stage_idx: int) -> int:
    """k = the successors' micro-batch over this stage's when every successor has the same k (1 for the sink or
    larger own sizes). Where they differ, 1: a successor of a smaller k runs its backwards between forwards
    it needs from this stage, so a group of k backwards here could wait on a forward this stage has not
    run yet (a deadlock: stages 0 -> 1 -> 2 -> 3 and 0 -> 3 with sizes 1, 1, 1, 4). The 1F1B order runs
    every such plan; the warm-up, and so the in-flight count, is the same either way."""
    own = plan.stages[stage_idx].micro_batch_size
    ratios = {max(1, plan.stages[j].micro_batch_size // own) for j in plan.successors[stage_idx]}
    return ratios.pop() if len(ratios) == 1 else 1


def kfkb_compute(plan: Plan) -> dict[int, list[Step]]:
    """Each stage's computes in kFkB order (before `lower_comm`)."""
    warmups = warmup_counts(plan)
    return {s.idx: order_steps(plan.num_micro_batches(s.idx), warmups[s.idx], group_size(plan, s.idx))
            for s in plan.stages}
