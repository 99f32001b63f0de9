"""The executor over the in-memory transport (ranks as threads) equals single-process training."""

from __future__ import annotations

import pytest
import torch

from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.schedule.generate import make_schedule
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import LR, SCENARIOS, compare, reference

NUM_STEPS = 3


def _train_in_threads(name: str, schedule: str, num_steps: int) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    scenario = SCENARIOS[name]
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    batches = scenario.make_batches(num_steps)
    sched = make_schedule(plan, schedule)
    # built here, not in the threads: the global RNG and fx tracing are not thread safe
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, schedule=sched, transport=hub.transport(rank), rank=rank,
                                example_inputs=batches[0][0])
                for rank in range(plan.world_size)]

    def body(rank: int) -> tuple[list[float], dict[str, torch.Tensor]]:
        trainer = trainers[rank]
        losses = [trainer.step(inputs, targets) for inputs, targets in batches]
        return losses, {k: v.detach().clone() for k, v in trainer.named_parameters()}

    results = run_threads(plan.world_size, body)
    params: dict[str, torch.Tensor] = {}
    for _, rank_params in results:
        params.update(rank_params)
    return [losses for losses, _ in results], params


@pytest.mark.parametrize(("name", "schedule"), [(n, k) for n in sorted(SCENARIOS) for k in SCENARIOS[n].schedules])
def test_in_memory_pipeline_equals_single_process_training(name: str, schedule: str) -> None:
    torch.set_num_threads(1)
    rank_losses, params = _train_in_threads(name, schedule, NUM_STEPS)
    expected_losses, expected_params = reference(SCENARIOS[name], NUM_STEPS)
    assert sorted(params) == sorted(expected_params)
    for losses in rank_losses:  # every rank reports the same mini-batch loss
        assert losses == rank_losses[0]
    problems = compare(rank_losses[0], params, expected_losses, expected_params)
    assert not problems, "\n".join(problems)


def test_the_same_seed_gives_the_same_losses_bit_for_bit() -> None:
    first, _ = _train_in_threads("branches4", "1f1b", 2)
    second, _ = _train_in_threads("branches4", "1f1b", 2)
    assert first == second
