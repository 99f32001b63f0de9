"""Data sharding: over an epoch of `--data`, the replicas of a data-parallel stage that reads the model's inputs
see every sample exactly once between them, each its own share, in the plan's sample order."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.data import MiniBatches
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import LR, SCENARIOS

NAME = "dp_stage3"  # stage 0 (the inputs) on ranks 0 and 1, micro-batches of 4, mini-batches of 8
SAMPLES = 24  # 3 mini-batches an epoch


def _numbered_samples() -> TensorDataset:
    """Sample i's features all equal i: a row seen by a stage names its sample."""
    ids = torch.arange(SAMPLES, dtype=torch.float32)
    return TensorDataset(ids[:, None].expand(SAMPLES, 8).clone(), torch.zeros(SAMPLES, 3))


def test_the_replicas_of_the_input_stage_see_every_sample_of_an_epoch_exactly_once() -> None:
    torch.set_num_threads(1)
    scenario = SCENARIOS[NAME]
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
                                loss_fn=scenario.loss_fn, transport=hub.transport(rank), rank=rank)
                for rank in range(plan.world_size)]
    data = MiniBatches(_numbered_samples(), plan.global_batch_size, seed=5)
    assert data.steps_per_epoch == 3
    seen: dict[int, list[int]] = {0: [], 1: []}

    def body(rank: int) -> None:
        trainer = trainers[rank]
        own = MiniBatches(_numbered_samples(), plan.global_batch_size, seed=5)  # each rank draws the same
        if rank in seen:
            trainer.stage.module.register_forward_pre_hook(
                lambda _module, args: seen[rank].extend(int(value) for value in args[0][:, 0].tolist()))
        for step in range(3):
            trainer.step(*own.at(step))

    run_threads(plan.world_size, body)
    assert sorted(seen[0] + seen[1]) == list(range(SAMPLES))
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) == len(seen[1]) == SAMPLES // 2
    order = [int(value) for step in range(3) for value in data.at(step)[0][:, 0].tolist()]
    assert seen[0] == [order[i] for i in range(SAMPLES) if (i // 2) % 2 == 0]  # shares of 2 of each micro-batch
