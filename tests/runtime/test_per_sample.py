"""A model whose forward fixes the batch size is captured at one sample (`export-static`) and each stage runs its
share sample by sample: training equals one device, at micro-batches of any size; a rank whose model is not
the plan's graph refuses, naming the op."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import graphpipe as gp
from graphpipe.errors import TrainingError
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.per_sample import run_per_sample
from graphpipe.runtime.trainer import PipelineTrainer
from tests.corpus.training import train_both

BATCH = 8


class RowLoop(nn.Module):
    """Two branches, one of which loops over the rows of its batch: export fixes the batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 6)
        self.rows = nn.Linear(6, 6)
        self.side = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        looped = torch.stack([self.rows(row) for row in h])
        return self.head(looped + self.side(h))


def _plan(model: nn.Module, inputs: torch.Tensor, devices: int, micro_batch: int) -> gp.Plan:
    graph = gp.capture(model, (inputs,))
    cluster = gp.Cluster.preset("local-cpu", num_devices=devices)
    return gp.plan(graph, gp.analytic_costs(graph, device="cpu"), cluster, global_batch_size=BATCH,
                   micro_batch_sizes=[micro_batch])


def test_a_forward_that_fixes_the_batch_is_captured_at_one_sample() -> None:
    model = RowLoop().double()
    graph = gp.capture(model, (torch.randn(4, 6, dtype=torch.float64),))
    assert graph.capture == "export-static" and graph.example_batch_size == 1


@pytest.mark.parametrize("micro_batch", [2, 4])
def test_training_sample_by_sample_equals_one_device(micro_batch: int) -> None:
    torch.manual_seed(0)
    model = RowLoop().double()
    batches = [(torch.randn(BATCH, 6, dtype=torch.float64), torch.randn(BATCH, 3, dtype=torch.float64))
               for _ in range(2)]
    plan = _plan(model, batches[0][0][:4], devices=2, micro_batch=micro_batch)
    assert plan.capture == "export-static" and any("fixes the batch size" in note for note in plan.notes)
    losses, expected, worst = train_both(model, plan, batches, nn.functional.mse_loss)
    assert losses == pytest.approx(expected, rel=1e-12)
    assert worst < 1e-12


def test_outputs_join_along_the_batch_and_constants_stay() -> None:
    def call(data: dict[str, torch.Tensor], received: dict[str, torch.Tensor]) -> dict[str, object]:
        return {"y": data["x"] * 2 + received["r"], "size": (7,)}

    out = run_per_sample(call, {"x": torch.arange(3.0).reshape(3, 1), "mask": torch.ones(2)},
                         {"x": 0, "mask": None}, {"r": torch.ones(3, 1)}, samples=3)
    assert torch.equal(out["y"], torch.tensor([[1.0], [3.0], [5.0]])) and out["size"] == (7,)


def test_a_rank_refuses_a_model_that_is_not_the_plans_graph() -> None:
    zoo = gp.load_model("toy_diamond", "tiny", batch_size=BATCH)
    wide = gp.load_model("toy_diamond", "tiny", batch_size=BATCH, width=16)
    graph = gp.capture(zoo.model, zoo.inputs)
    plan = gp.plan(graph, gp.analytic_costs(graph, device="cpu"), gp.Cluster.preset("local-cpu", num_devices=2),
                   global_batch_size=BATCH)
    hub = InMemoryHub(plan.world_size, timeout_s=10)
    with pytest.raises(TrainingError, match=r"not the one the plan was made for: op 2 of \d+ differs.*16x16"):
        PipelineTrainer(copy.deepcopy(wide.model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                        loss_fn=wide.loss_fn, example_inputs=wide.inputs, transport=hub.transport(0), rank=0)
