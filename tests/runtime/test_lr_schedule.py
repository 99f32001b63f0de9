"""Learning-rate schedules: the named ones' factors, a split run that follows a scheduler as one device does,
and a checkpoint that carries the scheduler's position."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.lr_schedule import lr_factor
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.scenarios import LR, SCENARIOS, compare, float64_scenario, reference
from tests.runtime.test_checkpoint import _steps

NAME, STEPS = "tied_towers3", 5
SCENARIO = float64_scenario(SCENARIOS[NAME])  # equal to one device within 1e-10
FACTOR = lr_factor("cosine", 1, STEPS)


def _scheduler(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, FACTOR)


def test_warm_up_then_decay_to_zero_at_the_last_step() -> None:
    assert [lr_factor("constant", 2, 6)(step) for step in range(4)] == [1 / 3, 2 / 3, 1.0, 1.0]
    linear = lr_factor("linear", 2, 6)
    assert [linear(step) for step in (2, 4, 6)] == [1.0, 0.5, 0.0]
    cosine = lr_factor("cosine", 0, 4)
    assert cosine(0) == 1.0 and cosine(2) == pytest.approx(0.5) and cosine(4) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        lr_factor("step", 0, 4)


def _trainers(factory: Callable[[torch.optim.Optimizer], Any]) -> list[PipelineTrainer]:
    scenario = SCENARIO
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    return [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                            loss_fn=scenario.loss_fn, transport=hub.transport(rank), rank=rank, lr_scheduler=factory)
            for rank in range(plan.world_size)]


def test_a_split_run_follows_the_scheduler_as_one_device_does_across_a_checkpoint(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    batches = SCENARIO.make_batches(STEPS)
    first = _steps(_trainers(_scheduler), batches[:2], save_to=tmp_path / "step_2")
    resumed = _trainers(_scheduler)
    for trainer in resumed:
        trainer.load(str(tmp_path / "step_2"))
    rates = [trainer.learning_rate for trainer in resumed if trainer.learning_rate is not None]
    assert rates and rates == pytest.approx([LR * FACTOR(2)] * len(rates))
    second = _steps(resumed, batches[2:])
    expected_losses, expected_params = reference(SCENARIO, STEPS, lr_scheduler=_scheduler)
    params = {key: value.detach().clone() for trainer in resumed for key, value in trainer.named_parameters()}
    problems = compare(first + second, params, expected_losses, expected_params, rtol=1e-10)
    assert not problems, "\n".join(problems)
    assert not math.isclose(FACTOR(1), FACTOR(3))  # the schedule changes the rate over the run
