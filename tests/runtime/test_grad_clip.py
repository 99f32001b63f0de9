"""Clipping by the global gradient norm across stages equals `torch.nn.utils.clip_grad_norm_` on one device in
float64 within 1e-10 (the norm, the losses and the updated weights): a weight two stages share counted once, a
data-parallel stage's replicas once, a fork and a join."""

from __future__ import annotations

import pytest
import torch

from graphpipe.errors import TrainingError
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.schedule.generate import make_schedule
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import LR, SCENARIOS, compare, float64_scenario, reference

NUM_STEPS = 3
CLIP_SHARE = 0.3  # the clip, as a share of the first step's norm: every step is clipped
TOLERANCE = 1e-10


def _one_device(name: str, max_norm: float) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    norms: list[float] = []
    losses, params = reference(float64_scenario(SCENARIOS[name]), NUM_STEPS, clip=max_norm, norms=norms)
    return losses, norms, params


def _first_norm(name: str) -> float:
    return _one_device(name, float("inf"))[1][0]


@pytest.mark.parametrize("name", ["tied_towers3", "dp_sink4", "branches4"])
def test_clipping_by_the_global_norm_equals_clip_grad_norm_on_one_device(name: str) -> None:
    torch.set_num_threads(1)
    scenario = float64_scenario(SCENARIOS[name])
    max_norm = CLIP_SHARE * _first_norm(name)
    expected_losses, expected_norms, expected_params = _one_device(name, max_norm)
    assert all(norm > max_norm for norm in expected_norms)
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    batches = scenario.make_batches(NUM_STEPS)
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, schedule=make_schedule(plan, "1f1b"),
                                transport=hub.transport(rank), rank=rank, example_inputs=batches[0][0],
                                clip_grad_norm=max_norm)
                for rank in range(plan.world_size)]

    def body(rank: int) -> tuple[list[float], list[float]]:
        losses, norms = [], []
        for inputs, targets in batches:
            losses.append(trainers[rank].step(inputs, targets))
            norms.append(trainers[rank].last_grad_norm)
        return losses, norms

    results = run_threads(plan.world_size, body)
    params = {key: value.detach().clone() for trainer in trainers for key, value in trainer.named_parameters()}
    for _, norms in results:
        assert norms == pytest.approx(expected_norms, rel=TOLERANCE)
    problems = compare(results[0][0], params, expected_losses, expected_params, rtol=TOLERANCE)
    assert not problems, "\n".join(problems)


def test_a_clip_that_is_not_positive_is_refused() -> None:
    scenario = SCENARIOS["chain2"]
    with pytest.raises(TrainingError, match="clip_grad_norm must be above 0"):
        PipelineTrainer(scenario.model(), scenario.plan(), optimizer=lambda ps: torch.optim.Adam(ps), loss_fn=None,
                        transport=InMemoryHub(2).transport(0), rank=0, clip_grad_norm=0.0)
