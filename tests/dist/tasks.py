"""Work run inside the spawned ranks: train a scenario, return losses and this rank's parameters."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from graphpipe.errors import TrainingError
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.scenarios import LR, SCENARIOS


def _trainer(name: str, schedule: str) -> tuple[PipelineTrainer, Any]:
    scenario = SCENARIOS[name]
    plan = scenario.plan()
    example = scenario.make_batches(1)[0][0]
    trainer = PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                              loss_fn=scenario.loss_fn, schedule=schedule, example_inputs=example)
    return trainer, scenario


def train(rank: int, name: str, schedule: str, num_steps: int) -> dict[str, Any]:
    """Losses of `num_steps` steps and this rank's parameters (numpy, by original name)."""
    del rank
    trainer, scenario = _trainer(name, schedule)
    losses = [trainer.step(inputs, targets) for inputs, targets in scenario.make_batches(num_steps)]
    return {"losses": losses, "params": {k: v.detach().numpy().copy() for k, v in trainer.named_parameters()}}


def train_and_save(rank: int, name: str, directory: str, num_steps: int) -> list[float]:
    del rank
    trainer, scenario = _trainer(name, "1f1b")
    losses = [trainer.step(inputs, targets) for inputs, targets in scenario.make_batches(num_steps)]
    trainer.save(directory)
    return losses


def load_and_train(rank: int, name: str, directory: str, first_step: int, num_steps: int) -> list[float]:
    del rank
    trainer, scenario = _trainer(name, "1f1b")
    trainer.load(directory)
    batches = scenario.make_batches(first_step + num_steps)[first_step:]
    return [trainer.step(inputs, targets) for inputs, targets in batches]


def wrong_world_size(rank: int, name: str) -> str:
    """The error message when a plan for another world size is used (empty if none was raised)."""
    del rank
    try:
        _trainer(name, "1f1b")
    except TrainingError as err:
        return str(err)
    return ""


def world_size(rank: int) -> int:
    del rank
    return dist.get_world_size()
