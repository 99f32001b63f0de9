"""Rank-level lowering: the pieces both ends of a stage edge compute agree, and cover every sample once."""

from __future__ import annotations

import itertools

import pytest

from graphpipe.runtime.lowering import blocks, message_pieces, share
from graphpipe.schedule.messages import num_messages
from graphpipe.stages.stage_graph import Plan, Stage, StageEdge


def _plan(src_ranks: int, src_b: int, dst_ranks: int, dst_b: int, batch: int = 8) -> Plan:
    src = Stage(idx=0, ops=("a",), ranks=tuple(range(src_ranks)), micro_batch_size=src_b, in_flight_samples=src_b)
    dst = Stage(idx=1, ops=("b",), ranks=tuple(range(src_ranks, src_ranks + dst_ranks)), micro_batch_size=dst_b,
                in_flight_samples=dst_b)
    return Plan(graph_name="g", stages=(src, dst), edges=(StageEdge(src=0, dst=1, tensors=("a",), bytes_per_sample=4),),
                global_batch_size=batch, num_devices=src_ranks + dst_ranks, planner="manual")


def test_share_splits_a_micro_batch_evenly_and_contiguously() -> None:
    stage = Stage(idx=0, ops=("a",), ranks=(3, 5), micro_batch_size=4, in_flight_samples=4)
    assert [share(stage, 3, 1), share(stage, 5, 1)] == [(4, 6), (6, 8)]
    assert [(p.start, p.stop, p.peer_rank) for p in blocks(stage, 1, 7)] == [(1, 2, 3), (2, 4, 5), (4, 6, 3),
                                                                             (6, 7, 5)]


@pytest.mark.parametrize(("src_ranks", "src_b", "dst_ranks", "dst_b"),
                         [(1, 2, 1, 2), (2, 4, 1, 4), (1, 4, 2, 4), (2, 2, 2, 4), (2, 8, 4, 4), (1, 2, 2, 8)])
def test_both_ends_list_the_same_pieces_per_rank_pair(src_ranks: int, src_b: int, dst_ranks: int,
                                                      dst_b: int) -> None:
    plan = _plan(src_ranks, src_b, dst_ranks, dst_b)
    sent: dict[tuple[int, int], list[tuple[int, int]]] = {}
    received: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for message in range(num_messages(plan, 0, 1)):
        for rank in plan.stages[0].ranks:
            for piece in message_pieces(plan, rank, 0, 1, message):
                sent.setdefault((rank, piece.peer_rank), []).append((piece.start, piece.stop))
        for rank in plan.stages[1].ranks:
            for piece in message_pieces(plan, rank, 1, 0, message):
                received.setdefault((piece.peer_rank, rank), []).append((piece.start, piece.stop))
    assert sent == received
    samples = sorted(itertools.chain.from_iterable(range(a, b) for pieces in sent.values() for a, b in pieces))
    assert samples == list(range(plan.global_batch_size))
