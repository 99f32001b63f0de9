"""Training data as a user brings it (`graphpipe train --data tests/runtime/data_factories.py:NAME`), for
`toy_chain` (inputs [8], targets [8])."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import TensorDataset

SAMPLES = 20


def dataset(seed: int = 0) -> TensorDataset:
    """20 samples: with a mini-batch of 8, two mini-batches an epoch (the last 4 samples dropped)."""
    generator = torch.Generator().manual_seed(100 + seed)
    return TensorDataset(torch.randn(SAMPLES, 8, generator=generator), torch.randn(SAMPLES, 8, generator=generator))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three mini-batches of 8, used in order, epoch after epoch."""
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(8, 8, generator=generator), torch.randn(8, 8, generator=generator)) for _ in range(3)]


def one_pass() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A generator: one pass only."""
    yield from batches()
