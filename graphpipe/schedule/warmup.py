"""Warm-up counts: how many forwards a stage runs before its first backward (docs/method.md §3, §5).

The in-flight rule is the planner's (`graphpipe.stages.in_flight`), walked from the sink
back to the sources: the sink keeps one micro-batch (n = b); any other stage keeps
n_i = max over successors j of (n_j + max(b_i, b_j)), rounded up to whole micro-batches
and at most the mini-batch. The warm-up is n_i / b_i forwards (rounded up, for plans
recorded under an older rule), and never more than the stage's micro-batch count; a plan
that records its in-flight samples is followed as recorded.
"""

from __future__ import annotations

from graphpipe.stages.in_flight import in_flight_samples
from graphpipe.stages.stage_graph import Plan


def in_flight_rule(plan: Plan) -> dict[int, int]:
    """In-flight samples per stage under the planner's rule (stages walked last to first)."""
    sizes = {stage.idx: stage.micro_batch_size for stage in plan.stages}
    return in_flight_samples(plan.successors, sizes, plan.global_batch_size)


def warmup_counts(plan: Plan) -> dict[int, int]:
    """Forwards before the first backward, per stage: the plan's in-flight count (or the rule's) / b."""
    rule = in_flight_rule(plan)
    counts: dict[int, int] = {}
    for stage in plan.stages:
        samples = stage.in_flight_samples if stage.in_flight_samples > 0 else rule[stage.idx]
        warmup = -(-samples // stage.micro_batch_size)
        counts[stage.idx] = max(1, min(warmup, plan.num_micro_batches(stage.idx)))
    return counts
