"""The in-flight rule (PAPER.md §3): how many samples' activations a stage keeps alive.

    sink stage:   n_i = b_i
    other stages: n_i = max over successors j of (n_j + max(b_i, b_j))

With b_i <= b_j this is the paper's n_j + b_j (a kFkB stage runs b_j / b_i forwards per
successor micro-batch). The paper does not cover b_i > b_j; here the upstream micro-batch
is split and the stage holds one more of its own micro-batches: n_j + b_i.

    chain of 3, b = 4, 4, 4  ->  n = 12, 8, 4
    chain of 3, b = 1, 2, 4  ->  n = 10, 8, 4
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def in_flight_samples(successors: Mapping[int, Sequence[int]], micro_batch: Mapping[int, int]) -> dict[int, int]:
    """In-flight samples per stage of a stage DAG (any numbering)."""
    counts: dict[int, int] = {}
    for root in micro_batch:
        stack = [(root, False)]
        while stack:
            idx, ready = stack.pop()
            if idx in counts:
                continue
            succ = successors.get(idx, ())
            if not ready:
                stack.append((idx, True))
                stack.extend((j, False) for j in succ if j not in counts)
                continue
            own = micro_batch[idx]
            counts[idx] = max((counts[j] + max(own, micro_batch[j]) for j in succ), default=own)
    return counts


def chain_in_flight(micro_batches: Sequence[int]) -> tuple[int, ...]:
    """In-flight samples of a chain of stages, first to last."""
    num = len(micro_batches)
    succ = {idx: (idx + 1,) for idx in range(num - 1)}
    counts = in_flight_samples(succ, dict(enumerate(micro_batches)))
    return tuple(counts[idx] for idx in range(num))
