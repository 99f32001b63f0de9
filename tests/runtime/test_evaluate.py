"""`PipelineTrainer.evaluate` equals the single-device eval loss and outputs, in float64: forward only, modules in
eval mode (dropout off, BatchNorm's running statistics), on a fork/join plan with a data-parallel sink, a weight
shared across stages, and a model with dropout and BatchNorm; parameters untouched, and training goes on."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from graphpipe.model_inputs import as_model_inputs
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.schedule.generate import make_schedule
from tests.runtime.helpers import by_target, plan_from, run_threads
from tests.runtime.scenarios import LR, SCENARIOS, Scenario, in_float64

TOLERANCE = 1e-10


class DropoutNormTowers(nn.Module):
    """Two towers with dropout and BatchNorm: eval mode changes both."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.left = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Tanh())
        self.right = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.Tanh())
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return self.head(torch.cat([self.left(h), self.right(h)], dim=1))


def _norm_towers() -> Scenario:
    def batches(num_steps: int) -> list[tuple[Any, torch.Tensor]]:
        gen = torch.Generator().manual_seed(3)
        return [(torch.randn(12, 6, generator=gen, dtype=torch.float64),
                 torch.randn(12, 2, generator=gen, dtype=torch.float64)) for _ in range(num_steps)]

    return Scenario(name="norm_towers4", make_model=lambda: DropoutNormTowers().double(), make_batches=batches,
                    make_plan=lambda m: plan_from(m, by_target([("stem", 0), ("left", 1), ("right", 0), ("cat", 2)]),
                                                  [(0,), (1,), (2, 3)], micro_batch_size=6, global_batch_size=12))


CASES = {"dp_sink4": SCENARIOS["dp_sink4"], "tied_towers3": SCENARIOS["tied_towers3"], "norm_towers4": _norm_towers()}


def _one_device(scenario: Scenario, train: list[Any], held_out: Any) -> tuple[float, torch.Tensor]:
    """Train on `train` (dropout on), then the eval-mode loss and outputs of `held_out`."""
    model = scenario.model().double()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for step, (inputs, targets) in enumerate(train):
        torch.manual_seed(step)
        optimizer.zero_grad()
        given = as_model_inputs(inputs)
        scenario.loss_fn(model(*given.args, **given.kwargs), targets).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        given = as_model_inputs(held_out[0])
        outputs = model(*given.args, **given.kwargs)
        return float(scenario.loss_fn(outputs, held_out[1])), outputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_evaluate_equals_the_single_device_eval_loss_and_outputs(name: str) -> None:
    torch.set_num_threads(1)
    scenario = CASES[name]
    batches = [(in_float64(inputs), in_float64(targets)) for inputs, targets in scenario.make_batches(3)]
    train, held_out = batches[:2], batches[2]
    plan = scenario.plan()
    model = scenario.model().double()
    if name == "norm_towers4":  # dropout draws differ between devices: train the reference without it
        train = []
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, schedule=make_schedule(plan, "1f1b"),
                                transport=hub.transport(rank), rank=rank, example_inputs=batches[0][0])
                for rank in range(plan.world_size)]
    expected_loss, expected_outputs = _one_device(scenario, train, held_out)

    def body(rank: int) -> tuple[float, Any, dict[str, torch.Tensor], float]:
        trainer = trainers[rank]
        for inputs, targets in train:
            trainer.step(inputs, targets)
        before = {key: value.clone() for key, value in trainer.state_dict().items()}
        loss, outputs = trainer.evaluate(*held_out, return_outputs=True)
        assert trainer.stage.module.training, "evaluate leaves the stage in training mode"
        changed = [key for key, value in trainer.state_dict().items() if not torch.equal(value, before[key])]
        assert not changed, f"evaluate changed {changed}"
        return loss, outputs, before, trainer.step(*held_out)

    results = run_threads(plan.world_size, body)
    for loss, _, _, after in results:
        assert loss == pytest.approx(expected_loss, rel=TOLERANCE)
        assert after == pytest.approx(expected_loss, rel=1e-6) or name == "norm_towers4"  # train mode differs
    sink_ranks = plan.stages[-1].ranks
    for rank, (_, outputs, _, _) in enumerate(results):
        if rank in sink_ranks:
            assert torch.allclose(outputs, expected_outputs, rtol=TOLERANCE, atol=TOLERANCE)
        else:
            assert outputs is None
