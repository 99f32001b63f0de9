"""Training data for `graphpipe train --data FILE.py:factory`: the same mini-batch on every rank, step by step.

The factory (called with no arguments, or with `seed=`) returns either
- a map-style dataset (a `torch.utils.data.Dataset`, or any object with `__len__` and `__getitem__`
  but a list or a tuple), each item an `(inputs, target)` pair: mini-batch k of an epoch is the samples
  at positions k*B .. (k+1)*B of a permutation drawn from (seed, epoch), collated with
  `default_collate`, the last partial one dropped; or
- an iterable (a list, a tuple, a generator, a `DataLoader`) of `(inputs, targets)` mini-batches of B
  samples each, used in order (epoch after epoch when it can be iterated again).
Every rank builds the same data and passes the whole mini-batch to `PipelineTrainer.step`, which cuts each
stage's and replica's samples from it, so each gets exactly its own. The mini-batch of step s depends on
(seed, s) alone: a run resumed at step s (`--resume`) continues with the next unseen mini-batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from graphpipe.errors import UsageError
from graphpipe.models.user_factory import load_factory

__all__ = ["MiniBatches", "load_data"]


def load_data(spec: str, seed: int) -> Any:
    """The object `FILE.py:factory` returns (the factory gets `seed=` when it takes one)."""
    factory = load_factory(spec)
    takes_seed = "seed" in inspect.signature(factory).parameters
    return factory(seed=seed) if takes_seed else factory()


class MiniBatches:
    """Mini-batch `at(step)` of `batch_size` samples from a dataset or an iterable of mini-batches."""

    def __init__(self, source: Any, batch_size: int, seed: int, label: str = "the data") -> None:
        self.source, self.batch_size, self.seed, self.label = source, batch_size, seed, label
        self.is_dataset = isinstance(source, Dataset) or (
            hasattr(source, "__len__") and hasattr(source, "__getitem__") and not isinstance(source, (list, tuple)))
        if self.is_dataset and len(source) < batch_size:
            raise UsageError(f"{label} holds {len(source)} samples, fewer than one mini-batch of {batch_size}: "
                             "give more data or plan a smaller --mini-batch")
        if not self.is_dataset and not hasattr(source, "__iter__"):
            raise UsageError(f"{label} is a {type(source).__name__}: return a dataset (__len__ and __getitem__) "
                             "or an iterable of (inputs, targets) mini-batches")
        self._stream: Iterator[Any] | None = None
        self._order: tuple[int, torch.Tensor] | None = None  # (epoch, its permutation)
        self._next_step = 0

    @property
    def steps_per_epoch(self) -> int | None:
        return len(self.source) // self.batch_size if self.is_dataset else None

    def at(self, step: int) -> tuple[Any, Any]:
        """The (inputs, targets) of `step` (0-based); a stream is read forward, skipping to `step`."""
        return self._from_dataset(step) if self.is_dataset else self._from_stream(step)

    def _from_dataset(self, step: int) -> tuple[Any, Any]:
        per_epoch = len(self.source) // self.batch_size
        epoch, index = divmod(step, per_epoch)
        if self._order is None or self._order[0] != epoch:  # drawn once an epoch, not once a step
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(len(self.source), generator=generator))
        order = self._order[1]
        picked = order[index * self.batch_size:(index + 1) * self.batch_size].tolist()
        return _pair(default_collate([self.source[i] for i in picked]), self.label)

    def _from_stream(self, step: int) -> tuple[Any, Any]:
        if self._stream is None or step < self._next_step:
            self._stream, self._next_step = iter(self.source), 0
        fresh = False
        while True:
            try:
                batch = next(self._stream)
            except StopIteration:
                if fresh or self._next_step == 0:
                    raise UsageError(f"{self.label} ran out after {self._next_step} mini-batches and cannot be "
                                     "iterated again (a generator): return a list or a class with __iter__, or "
                                     "train fewer --steps") from None
                self._stream, fresh = iter(self.source), True  # the next epoch
                continue
            fresh = False
            self._next_step += 1
            if self._next_step > step:
                return _pair(batch, self.label)


def _pair(batch: Any, label: str) -> tuple[Any, Any]:
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise UsageError(f"{label} must give (inputs, targets) pairs, got {type(batch).__name__}")
    inputs, targets = batch
    return (tuple(inputs) if isinstance(inputs, list) else inputs), targets
