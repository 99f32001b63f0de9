"""Rank-level lowering: which samples each rank sends to or receives from which peer rank.

The samples of a stage's micro-batch are split evenly and contiguously over its ranks,
so the mini-batch is a sequence of *share blocks* of b / d samples: block k belongs to
micro-batch k // d and to the stage's (k % d)-th rank (`graphpipe.cost.formulas.sample_split`,
the split the simulator times). A stage-level message (samples
[n*g, (n+1)*g), see `graphpipe.schedule.messages`) is lowered into *pieces*: the
intersections of this rank's blocks with the peer stage's blocks, in increasing sample
order. Both ends compute the same pieces in the same order, so per rank pair the sends
and receives match one to one.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphpipe.cost.formulas.sample_split import rank_share, share_blocks
from graphpipe.schedule.messages import message_samples
from graphpipe.stages.stage_graph import Plan, Stage


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """Samples [start, stop) of the mini-batch exchanged with `peer_rank`."""

    start: int
    stop: int
    peer_rank: int


def share(stage: Stage, rank: int, micro_batch: int) -> tuple[int, int]:
    """The samples [start, stop) of `micro_batch` that `rank` of `stage` computes."""
    return rank_share(stage.micro_batch_size, stage.ranks, rank, micro_batch)


def blocks(stage: Stage, start: int, stop: int) -> list[Piece]:
    """The stage's share blocks cut to [start, stop), each with the rank that owns it."""
    return [Piece(start=a, stop=b, peer_rank=owner)
            for owner, a, b in share_blocks(stage.micro_batch_size, stage.ranks, start, stop)]


def message_pieces(plan: Plan, rank: int, stage_idx: int, peer_idx: int, message: int) -> list[Piece]:
    """Pieces of message `message` on the edge between `stage_idx` and `peer_idx`, seen from `rank`."""
    src, dst = sorted((stage_idx, peer_idx))
    per_message = message_samples(plan, src, dst)
    stage, peer = plan.stages[stage_idx], plan.stages[peer_idx]
    msg_start, msg_stop = message * per_message, (message + 1) * per_message
    pieces: list[Piece] = []
    for mine in blocks(stage, msg_start, msg_stop):
        if mine.peer_rank == rank:
            pieces += blocks(peer, mine.start, mine.stop)
    return pieces
