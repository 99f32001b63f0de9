"""Data-parallel gradients summed in buckets launched during the last backward: the same training as one
device (float64, within 1e-10) on plans with data-parallel stages, buckets launched before the backward ends,
and every replica launching them in the same order (the recorded programs pass the NCCL checker)."""

from __future__ import annotations

import pytest
import torch

import graphpipe.runtime.grad_buckets as grad_buckets
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.p2p_check import Post, check
from graphpipe.runtime.p2p_record import RecordingTransport
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import LR, SCENARIOS, compare, float64_scenario, reference

STEPS = 3


@pytest.mark.parametrize("name", ["dp_stage3", "dp_sink4", "kfkb3"])
def test_buckets_launched_during_the_backward_train_like_one_device(name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setattr(grad_buckets, "BUCKET_BYTES", 200)  # a few parameters a bucket: several buckets
    scenario = float64_scenario(SCENARIOS[name])
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    transports = [RecordingTransport(hub.transport(rank)) for rank in range(plan.world_size)]
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, schedule=scenario.schedules[0], transport=transports[rank],
                                rank=rank) for rank in range(plan.world_size)]
    batches = scenario.make_batches(STEPS)
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(*batch) for batch in batches])
    expected_losses, expected_params = reference(scenario, STEPS)
    params = {key: value.detach().clone() for trainer in trainers for key, value in trainer.named_parameters()}
    problems = compare(losses[0], params, expected_losses, expected_params, rtol=1e-10)
    assert not problems, "\n".join(problems)
    replicas = [trainer for trainer in trainers if trainer.executor.buckets is not None]
    assert replicas and all(len(trainer.executor.buckets.buckets) > 1 for trainer in replicas)
    assert all(trainer.executor.buckets.launched_early > 0 for trainer in replicas)
    programs = {rank: transport.steps for rank, transport in enumerate(transports)}
    assert check(programs) == []
    groups = {rank: [step.ops[0].group for step in steps if isinstance(step, Post) and step.ops[0].group]
              for rank, steps in programs.items()}
    for stage in plan.stages:  # the replicas of a stage run the same collectives in the same order
        assert len({tuple(groups[rank]) for rank in stage.ranks}) == 1
