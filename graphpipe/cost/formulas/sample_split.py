"""Which samples each rank of a data-parallel stage computes: the simulator times it, the runtime runs it.

A stage spreads each micro-batch of b samples evenly and contiguously over its d ranks, so the
mini-batch is a sequence of *share blocks* of b / d samples: block k belongs to micro-batch
k // d and to the stage's (k % d)-th rank. (b is a multiple of d: `Stage` checks it.)
"""

from __future__ import annotations

from collections.abc import Sequence


def share_size(micro_batch_size: int, degree: int) -> int:
    """Samples of one micro-batch each of `degree` ranks computes."""
    return micro_batch_size // degree


def rank_share(micro_batch_size: int, ranks: Sequence[int], rank: int, micro_batch: int) -> tuple[int, int]:
    """The samples [start, stop) of the mini-batch that `rank` (one of `ranks`) computes of `micro_batch`."""
    per_rank = share_size(micro_batch_size, len(ranks))
    start = micro_batch * micro_batch_size + ranks.index(rank) * per_rank
    return start, start + per_rank


def share_blocks(micro_batch_size: int, ranks: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """The share blocks cut to samples [start, stop), in order, each as (owning rank, start, stop)."""
    per_rank = share_size(micro_batch_size, len(ranks))
    out, pos = [], start
    while pos < stop:
        block = pos // per_rank
        end = min(stop, (block + 1) * per_rank)
        out.append((ranks[block % len(ranks)], pos, end))
        pos = end
    return out
