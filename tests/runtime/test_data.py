"""`--data`: mini-batches from a dataset (a permutation per epoch from the seed) or from an iterable, by step,
so a resumed run continues with the next unseen mini-batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphpipe.errors import UsageError
from graphpipe.runtime.data import MiniBatches, load_data

FACTORIES = Path(__file__).with_name("data_factories.py")


def test_a_dataset_gives_each_epoch_a_permutation_from_the_seed() -> None:
    data = MiniBatches(load_data(f"{FACTORIES}:dataset", 0), 8, seed=3)
    assert data.steps_per_epoch == 2
    first, second = data.at(0), data.at(1)
    assert first[0].shape == (8, 8) and first[1].shape == (8, 8)
    rows = {tuple(row.tolist()) for batch in (first, second) for row in batch[0]}
    assert len(rows) == 16  # no sample twice in an epoch
    again = MiniBatches(load_data(f"{FACTORIES}:dataset", 0), 8, seed=3)
    assert torch.equal(again.at(1)[0], second[0])  # by step alone: a resumed run draws the same
    assert not torch.equal(data.at(2)[0], first[0])  # the next epoch, another order


def test_an_iterable_is_used_in_order_epoch_after_epoch() -> None:
    batches = load_data(f"{FACTORIES}:batches", 0)
    data = MiniBatches(batches, 8, seed=0)
    assert torch.equal(data.at(4)[0], batches[1][0]) and torch.equal(data.at(0)[0], batches[0][0])


def test_data_that_cannot_give_a_mini_batch_is_one_line() -> None:
    with pytest.raises(UsageError, match="fewer than one mini-batch of 32"):
        MiniBatches(load_data(f"{FACTORIES}:dataset", 0), 32, seed=0)
    generator = MiniBatches(load_data(f"{FACTORIES}:one_pass", 0), 8, seed=0)
    with pytest.raises(UsageError, match="ran out after 3 mini-batches and cannot be iterated again"):
        generator.at(5)


def test_accumulating_steps_take_k_mini_batches_of_a_dataset_or_k_items_of_an_iterable() -> None:
    from graphpipe.runtime.data import join_batches

    data = MiniBatches(load_data(f"{FACTORIES}:dataset", 0), 4, seed=3, accumulate=2)
    assert data.at(0)[0].shape == (8, 8) and data.steps_per_epoch == 2  # 20 samples, 8 a step
    batches = load_data(f"{FACTORIES}:batches", 0)
    stream = MiniBatches(batches, 8, seed=0, accumulate=2)
    inputs, targets = stream.at(1)  # items 2 and 0 (the next epoch)
    expected = join_batches([batches[2], batches[0]])
    assert torch.equal(inputs, expected[0]) and torch.equal(targets, expected[1])


def test_evaluation_takes_every_whole_mini_batch_in_order_and_counts_what_it_leaves_out() -> None:
    from graphpipe.runtime.data import eval_batches

    dataset = load_data(f"{FACTORIES}:dataset", 0)
    batches, left_out = eval_batches(dataset, 8, "--eval-data")
    assert len(batches) == 2 and left_out == 4
    assert torch.equal(batches[1][0], dataset[8:16][0])  # consecutive samples, not shuffled
    ragged = [(torch.zeros(8, 8), torch.zeros(8, 8)), (torch.zeros(3, 8), torch.zeros(3, 8))]
    assert [len(b[1]) for b in eval_batches(ragged, 8, "--eval-data")[0]] == [8]
    assert eval_batches(ragged, 8, "--eval-data")[1] == 3
    with pytest.raises(UsageError, match="return a dataset"):
        eval_batches(42, 8, "--eval-data")
