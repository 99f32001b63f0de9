"""A model built without weights trains like one device: each rank gives values to its own stage only,
by the per-name seeds or from a weights file, and the run equals single-device training of the same
weights (fp64, Adam: 1e-10)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from graphpipe.meta_weights import empty_weights
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.materialize import materialize
from graphpipe.runtime.trainer import PipelineTrainer
from tests.corpus.models import TiedTowers
from tests.runtime.helpers import max_relative_error, plan_from, reference_training, run_threads
from tests.runtime.scenarios import tied_stage

RANKS = [(0,), (1, 2), (3,)]  # three stages, the middle one data parallel


def _empty_model() -> nn.Module:
    with empty_weights():
        return TiedTowers().double()


def _batches() -> list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [((torch.randint(0, 50, (8, 5), generator=gen), torch.randint(0, 50, (8, 7), generator=gen)),
             torch.randn(8, 50, generator=gen, dtype=torch.float64)) for _ in range(3)]


@pytest.mark.parametrize("source", ["seed", "safetensors"])
def test_a_meta_model_trains_like_one_device_and_no_rank_holds_it_all(source: str, tmp_path: Path) -> None:
    plan = plan_from(TiedTowers(), tied_stage, RANKS, micro_batch_size=[2, 4, 2], global_batch_size=8)
    start = _empty_model()
    materialize(start, seed=11)  # the whole model on one device: the reference's weights
    weights = None
    if source == "safetensors":
        weights = tmp_path / "start.safetensors"
        save_file({name: t.detach().contiguous() for name, t in start.state_dict().items()}, str(weights))
    models = [_empty_model() for _ in range(plan.world_size)]
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(models[rank], plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
                                loss_fn=nn.functional.mse_loss, transport=hub.transport(rank), rank=rank,
                                init_seed=11, weights=weights)
                for rank in range(plan.world_size)]
    for trainer, model in zip(trainers, models):  # each rank holds its stage's weights, the rest stay meta
        held = {name for name, _ in trainer.named_parameters()}
        real = {name for name, param in model.named_parameters() if not param.is_meta}
        assert real == held and held != {name for name, _ in model.named_parameters()}
    batches = _batches()
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in batches])
    expected, trained = reference_training(start, batches, nn.functional.mse_loss)
    want = {name: param.detach() for name, param in trained.named_parameters()}
    assert losses[0] == pytest.approx(expected, rel=1e-10)
    for trainer in trainers:
        for name, param in trainer.named_parameters():
            assert max_relative_error(param.detach(), want[name]) < 1e-10, (trainer.rank, name)
