"""The in-flight rule (docs/method.md §3): how many samples' activations a stage keeps alive.

    sink stage:   n_i = b_i
    other stages: n_i = max over successors j of (n_j + max(b_i, b_j))
    then:         n_i rounded up to whole micro-batches of b_i, and at most the mini-batch B

With b_i <= b_j this is the paper's n_j + b_j (a kFkB stage runs b_j / b_i forwards per
successor micro-batch). The paper does not cover b_i > b_j; here the upstream micro-batch
is split and the stage needs one more of its own micro-batches than its successor holds
samples: n_j + b_i. A stage can only hold whole micro-batches, so that count is rounded up
(chain b = 4, 2: 2 + 4 = 6 samples is one and a half micro-batches, the schedule holds 8).
A stage can never hold more samples than one mini-batch has, however deep the pipeline
behind it (mini-batch 16, micro-batch 16: one micro-batch, not two).

    chain of 3, b = 4, 4, 4  ->  n = 12, 8, 4
    chain of 3, b = 1, 2, 4  ->  n = 10, 8, 4
    chain of 2, b = 4, 2     ->  n = 8, 2
    chain of 3, b = 4, 4, 4, mini-batch 8  ->  n = 8, 8, 4
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def held_samples(samples: int, micro_batch_size: int, global_batch_size: int | None = None) -> int:
    """`samples` rounded up to whole micro-batches, and at most the mini-batch (when given)."""
    whole = -(-samples // micro_batch_size) * micro_batch_size
    return whole if global_batch_size is None else min(whole, global_batch_size)


def in_flight_samples(successors: Mapping[int, Sequence[int]], micro_batch: Mapping[int, int],
                      global_batch_size: int | None = None) -> dict[int, int]:
    """In-flight samples per stage of a stage DAG (any numbering); capped by `global_batch_size` if given."""
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
            raw = max((counts[j] + max(own, micro_batch[j]) for j in succ), default=own)
            counts[idx] = held_samples(raw, own, global_batch_size)
    return counts


def chain_in_flight(micro_batches: Sequence[int], global_batch_size: int | None = None) -> tuple[int, ...]:
    """In-flight samples of a chain of stages, first to last."""
    num = len(micro_batches)
    succ = {idx: (idx + 1,) for idx in range(num - 1)}
    counts = in_flight_samples(succ, dict(enumerate(micro_batches)), global_batch_size)
    return tuple(counts[idx] for idx in range(num))
