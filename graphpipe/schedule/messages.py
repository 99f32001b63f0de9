"""Message numbering on stage edges: which samples a send or receive carries.

A message on edge src -> dst holds g = min(b_src, b_dst) samples; message n holds samples
[n*g, (n+1)*g) of the mini-batch. Stage micro-batch m (size b) holds [m*b, (m+1)*b), so it
covers messages m*b/g .. (m+1)*b/g - 1. See `graphpipe.schedule.action` for the contract.
"""

from __future__ import annotations

from graphpipe.errors import ScheduleError
from graphpipe.stages.stage_graph import Plan


def message_samples(plan: Plan, src: int, dst: int) -> int:
    """Samples per message on edge src -> dst (the smaller of the two micro-batch sizes)."""
    b_src = plan.stages[src].micro_batch_size
    b_dst = plan.stages[dst].micro_batch_size
    small, large = sorted((b_src, b_dst))
    if large % small:
        raise ScheduleError(f"stage edge s{src}->s{dst}: micro-batch sizes {b_src} and {b_dst} do not divide "
                            "each other; use sizes that are multiples of one another (e.g. powers of two)")
    return small


def num_messages(plan: Plan, src: int, dst: int) -> int:
    return plan.global_batch_size // message_samples(plan, src, dst)


def messages_of(plan: Plan, stage_idx: int, micro_batch: int, src: int, dst: int) -> range:
    """Message numbers on edge src -> dst that micro-batch `micro_batch` of `stage_idx` covers."""
    per_message = message_samples(plan, src, dst)
    per_micro = plan.stages[stage_idx].micro_batch_size // per_message
    return range(micro_batch * per_micro, (micro_batch + 1) * per_micro)


def micro_batch_of(plan: Plan, stage_idx: int, message: int, src: int, dst: int) -> int:
    """The micro-batch of `stage_idx` (one end of src -> dst) that holds message `message`."""
    return message * message_samples(plan, src, dst) // plan.stages[stage_idx].micro_batch_size
