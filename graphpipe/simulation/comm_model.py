"""Time models for communication and the optimizer step (plain arithmetic on the cluster's links).

- A message between two stages is cut into rank-to-rank pieces: each stage spreads the
  samples of its micro-batch evenly and contiguously over its ranks, and a piece is the
  overlap of a sender rank's samples with a receiver rank's. Every rank sends (and
  receives) its pieces one after another, each on the link between the two ranks
  (latency + bytes / bandwidth, and one more latency for every further tensor of the
  edge: the runtime sends each crossing tensor as its own message); different ranks work
  in parallel, so the message takes as long as the busiest rank.
- The data-parallel all-reduce is a ring over the stage's ranks on their slowest link:
  2 (d - 1) / d × gradient bytes / bandwidth + 2 (d - 1) × latency; free when d = 1.
- Adam's step streams weights, gradients and both moments (4 reads, 3 writes of the
  parameter bytes) through device memory, plus the device's fixed `step_overhead_us`.
"""

from __future__ import annotations

from collections import defaultdict

from graphpipe.cost.cluster import Cluster
from graphpipe.stages.stage_graph import Stage

ADAM_PASSES = 7  # bytes moved per parameter byte by one Adam step


def _owners(stage: Stage, start: int, stop: int) -> list[tuple[int, int, int]]:
    """(rank, start, stop) blocks of `stage` covering samples [start, stop)."""
    per_rank = stage.micro_batch_size // stage.data_parallel_degree
    out, pos = [], start
    while pos < stop:
        block = pos // per_rank
        end = min(stop, (block + 1) * per_rank)
        out.append((stage.ranks[block % stage.data_parallel_degree], pos, end))
        pos = end
    return out


def message_ms(cluster: Cluster, src: Stage, dst: Stage, start: int, stop: int, bytes_per_sample: float,
               num_tensors: int = 1) -> float:
    """Time to move samples [start, stop) of one edge's `num_tensors` tensors from the ranks of `src` to
    those of `dst`."""
    if bytes_per_sample <= 0 or stop <= start:
        return 0.0
    busy: dict[tuple[str, int], float] = defaultdict(float)
    for rank_a, a_start, a_stop in _owners(src, start, stop):
        for rank_b, b_start, b_stop in _owners(dst, a_start, a_stop):
            link = cluster.link(rank_a, rank_b)
            piece_ms = (link.transfer_ms((b_stop - b_start) * bytes_per_sample)
                        + (max(1, num_tensors) - 1) * link.latency_us / 1e3)
            busy[("send", rank_a)] += piece_ms
            busy[("recv", rank_b)] += piece_ms
    return max(busy.values(), default=0.0)


def all_reduce_ms(cluster: Cluster, ranks: tuple[int, ...], grad_bytes: int) -> float:
    num_ranks = len(ranks)
    if num_ranks <= 1 or grad_bytes <= 0:
        return 0.0
    link = cluster.group_link(ranks)
    steps = 2 * (num_ranks - 1)
    return steps / num_ranks * grad_bytes / (link.bandwidth_gb_per_s * 1e9) * 1e3 + steps * link.latency_us / 1e3


def stage_all_reduce_ms(cluster: Cluster, plan_ranks: tuple[int, ...], stage_ranks: tuple[int, ...],
                        local_bytes: int, shared_bytes: int) -> float:
    """A stage's gradient all-reduce: its own parameters over its data-parallel ranks, then the plan's
    shared parameters over every rank of the plan (`graphpipe.runtime.shared_grads`)."""
    shared = all_reduce_ms(cluster, plan_ranks, shared_bytes) if shared_bytes else 0.0
    return all_reduce_ms(cluster, stage_ranks, local_bytes) + shared


def optimizer_step_ms(cluster: Cluster, param_bytes: int) -> float:
    device = cluster.device
    return ADAM_PASSES * param_bytes / (device.mem_bandwidth_gb_per_s * 1e9) * 1e3 + device.step_overhead_us / 1e3
