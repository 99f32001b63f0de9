"""Time models for communication and the optimizer step, on the placed ranks of a plan.

- A message between two stages is cut into rank-to-rank pieces: each stage spreads the
  samples of its micro-batch evenly and contiguously over its ranks
  (`graphpipe.cost.formulas.sample_split`, the runtime's split), and a piece is the overlap
  of a sender rank's samples with a receiver rank's. Every rank sends (and receives) its
  pieces one after another, each on the link between the two ranks
  (`graphpipe.cost.formulas.communication.piece_ms`); different ranks work in parallel, so
  the message takes as long as the busiest rank.
- The data-parallel all-reduce is a ring over the stage's ranks on their slowest link
  (`graphpipe.cost.formulas.communication.ring_all_reduce_ms`, the planner's formula).
- Adam's step streams weights, gradients and both moments (4 reads, 3 writes of the
  parameter bytes) through device memory, plus the device's fixed `step_overhead_us`
  (`graphpipe.cost.formulas.time_per_sample.optimizer_step_ms`, the planner's rule).
"""

from __future__ import annotations

from collections import defaultdict

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.formulas import time_per_sample
from graphpipe.cost.formulas.communication import piece_ms, ring_all_reduce_ms
from graphpipe.cost.formulas.sample_split import share_blocks
from graphpipe.stages.stage_cost import StageCost
from graphpipe.stages.stage_graph import Plan, Stage

ADAM_PASSES = time_per_sample.ADAM_PASSES  # where `benchmarks/runtime` reads it


def message_ms(cluster: Cluster, src: Stage, dst: Stage, start: int, stop: int, bytes_per_sample: float,
               num_tensors: int = 1) -> float:
    """Time to move samples [start, stop) of one edge's `num_tensors` tensors from the ranks of `src` to
    those of `dst`."""
    if bytes_per_sample <= 0 or stop <= start:
        return 0.0
    busy: dict[tuple[str, int], float] = defaultdict(float)
    for rank_a, a_start, a_stop in share_blocks(src.micro_batch_size, src.ranks, start, stop):
        for rank_b, b_start, b_stop in share_blocks(dst.micro_batch_size, dst.ranks, a_start, a_stop):
            piece = piece_ms(cluster.link(rank_a, rank_b), (b_stop - b_start) * bytes_per_sample, num_tensors)
            busy[("send", rank_a)] += piece
            busy[("recv", rank_b)] += piece
    return max(busy.values(), default=0.0)


def all_reduce_ms(cluster: Cluster, ranks: tuple[int, ...], grad_bytes: int) -> float:
    """A ring all-reduce over `ranks`, on the slowest link among them."""
    return ring_all_reduce_ms(cluster.group_link(ranks), grad_bytes, len(ranks))


def stage_all_reduce_ms(cluster: Cluster, plan_ranks: tuple[int, ...], stage_ranks: tuple[int, ...],
                        local_bytes: int, shared_bytes: int) -> float:
    """A stage's gradient all-reduce: its own parameters over its data-parallel ranks, then the plan's
    shared parameters over every rank of the plan (`graphpipe.runtime.shared_grads`)."""
    shared = all_reduce_ms(cluster, plan_ranks, shared_bytes) if shared_bytes else 0.0
    return all_reduce_ms(cluster, stage_ranks, local_bytes) + shared


def plan_stage_all_reduce_ms(cluster: Cluster, plan: Plan, stage: int, cost: StageCost) -> float:
    """`stage_all_reduce_ms` of stage `stage` of `plan`, as the engine runs it and the lower bound counts it."""
    return stage_all_reduce_ms(cluster, tuple(range(plan.world_size)), plan.stages[stage].ranks,
                               cost.data_parallel_bytes, cost.shared_reduce_bytes)


def optimizer_step_ms(cluster: Cluster, param_bytes: int) -> float:
    """One optimizer step of a stage holding `param_bytes` of weights on the cluster's device."""
    return time_per_sample.optimizer_step_ms(cluster.device, param_bytes)
