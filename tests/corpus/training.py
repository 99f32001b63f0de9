"""Train a plan with the in-memory runtime (one thread per rank) and the whole model on one device, side by
side: Adam, fp64, the same batches. The corpus's training tests compare the two."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from graphpipe.model_inputs import as_model_inputs
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.stages.stage_graph import Plan
from tests.runtime.helpers import run_threads

Batch = tuple[Any, torch.Tensor]  # (model inputs, targets)
LR = 1e-2


def train_both(model: nn.Module, plan: Plan, batches: Sequence[Batch],
               loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]) -> tuple[list[float], list[float], float]:
    """(the plan's losses, one device's losses, the largest error of any rank's parameter against one device's)
    after a step per batch from copies of `model`. The error is relative to the parameter's norm, or absolute
    where that is below 1: a parameter whose gradient is zero in exact arithmetic (attention's key bias, whose
    term softmax cancels) gets Adam steps of rounding noise, different in each summation order, and stays at a
    few 1e-14, where a relative error means nothing."""
    example = as_model_inputs(batches[0][0])
    hub = InMemoryHub(plan.world_size, timeout_s=60)
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=loss_fn, example_inputs=example, transport=hub.transport(rank), rank=rank)
                for rank in range(plan.world_size)]
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in batches])

    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(reference.parameters(), lr=LR)
    expected = []
    for x, y in batches:
        optimizer.zero_grad()
        inputs = as_model_inputs(x)
        loss = loss_fn(reference(*inputs.args, **inputs.kwargs), y)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    want = dict(reference.named_parameters())
    worst = max(_error(param.detach(), want[name].detach())
                for trainer in trainers for name, param in trainer.named_parameters())
    return losses[0], expected, worst


def _error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm()) / max(float(expected.norm()), 1.0)
