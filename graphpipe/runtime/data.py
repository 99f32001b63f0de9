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

__all__ = ["MiniBatches", "eval_batches", "join_batches", "load_data", "num_samples"]


def load_data(spec: str, seed: int) -> Any:
    """The object `FILE.py:factory` returns (the factory gets `seed=` when it takes one)."""
    factory = load_factory(spec)
    takes_seed = "seed" in inspect.signature(factory).parameters
    return factory(seed=seed) if takes_seed else factory()


def is_dataset(source: Any) -> bool:
    """A map-style dataset (samples by index), not a list or tuple of mini-batches."""
    return isinstance(source, Dataset) or (
        hasattr(source, "__len__") and hasattr(source, "__getitem__") and not isinstance(source, (list, tuple)))


class MiniBatches:
    """Mini-batch `at(step)` of `batch_size` samples from a dataset or an iterable of mini-batches; with
    `accumulate` k, each step takes k of them (k * batch_size samples of a dataset, k items of an iterable)."""

    def __init__(self, source: Any, batch_size: int, seed: int, label: str = "the data", accumulate: int = 1) -> None:
        self.accumulate = accumulate
        self.source, self.seed, self.label = source, seed, label
        self.is_dataset = is_dataset(source)
        self.batch_size = batch_size * accumulate if self.is_dataset else batch_size
        if self.is_dataset and len(source) < self.batch_size:
            step = f"one mini-batch of {batch_size}" + (f" times --accumulate {accumulate}" if accumulate > 1 else "")
            raise UsageError(f"{label} holds {len(source)} samples, fewer than {step}: give more data, plan a "
                             "smaller --mini-batch" + (" or accumulate fewer" if accumulate > 1 else ""))
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
        if self.is_dataset:
            return self._from_dataset(step)
        if self.accumulate == 1:
            return self._from_stream(step)
        return join_batches([self._from_stream(step * self.accumulate + k) for k in range(self.accumulate)])

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


def eval_batches(source: Any, batch_size: int, label: str) -> tuple[list[tuple[Any, Any]], int]:
    """Every whole mini-batch of `batch_size` samples of evaluation data, in order (a dataset: consecutive
    samples; an iterable: its items, once), and how many samples were left out (a last partial mini-batch:
    the plan computes mini-batches of its size only)."""
    if is_dataset(source):
        whole = len(source) // batch_size
        batches = [_pair(default_collate([source[i] for i in range(k * batch_size, (k + 1) * batch_size)]), label)
                   for k in range(whole)]
        return batches, len(source) - whole * batch_size
    if not hasattr(source, "__iter__"):
        raise UsageError(f"{label} is a {type(source).__name__}: return a dataset (__len__ and __getitem__) "
                         "or an iterable of (inputs, targets) mini-batches")
    batches, left_out = [], 0
    for item in source:
        inputs, targets = _pair(item, label)
        size = num_samples(targets)
        if size % batch_size:
            left_out += size
            continue
        batches.append((inputs, targets))
    return batches, left_out


def join_batches(batches: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """Mini-batches as one batch, sample after sample (tensors joined along their first dimension)."""
    return _joined([inputs for inputs, _ in batches]), _joined([targets for _, targets in batches])


def _joined(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(values) if first.dim() > 0 else first
    if isinstance(first, (tuple, list)):
        return type(first)(_joined([value[i] for value in values]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: _joined([value[key] for value in values]) for key in first}
    return first


def num_samples(targets: Any) -> int:
    """The samples of a mini-batch, from its targets' first dimension."""
    if isinstance(targets, torch.Tensor) and targets.dim() > 0:
        return int(targets.shape[0])
    if isinstance(targets, (tuple, list)) and targets:
        return num_samples(targets[0])
    if isinstance(targets, dict) and targets:
        return num_samples(next(iter(targets.values())))
    raise UsageError(f"cannot tell the samples of a mini-batch from its targets ({type(targets).__name__}): give "
                     "targets as a tensor (batch first), or a tuple or dict of them")
