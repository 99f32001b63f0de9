"""A weight tied across stages: each stage holds a copy, the gradients are summed over the plan, and
training equals single-device training (the issue's tied towers: one embedding, two towers, and an output
layer tied to it, on three stages; and a data-parallel stage among them). A checkpoint stores the tied weight once."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from graphpipe.graph.tracer import trace_module
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.stage_module import split_stages
from graphpipe.runtime.trainer import PipelineTrainer
from tests.corpus.models import TiedTowers
from tests.runtime.helpers import max_relative_error, plan_from, run_threads
from tests.runtime.scenarios import tied_stage


def _batches(num_steps: int) -> list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    return [((torch.randint(0, 50, (8, 5), generator=gen), torch.randint(0, 50, (8, 7), generator=gen)),
             torch.randn(8, 50, generator=gen, dtype=torch.float64)) for _ in range(num_steps)]


@pytest.mark.parametrize("ranks", [[(0,), (1,), (2,)], [(0,), (1, 2), (3,)]], ids=["three_stages", "dp_stage"])
def test_tied_weights_on_three_stages_train_like_one_device(ranks: list[tuple[int, ...]]) -> None:
    torch.manual_seed(0)
    model = TiedTowers().double()
    plan = plan_from(model, tied_stage, ranks, micro_batch_size=[2, 2 * len(ranks[1]), 2], global_batch_size=8)
    holders = [stage.spec.stage_idx for stage in split_stages(trace_module(model), plan)
               if "embed.weight" in stage.spec.shared_params]
    assert holders == [0, 1, 2]
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
                                loss_fn=nn.functional.mse_loss, transport=hub.transport(rank), rank=rank)
                for rank in range(plan.world_size)]
    batches = _batches(3)
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in batches])

    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    expected = []
    for (a, b), y in batches:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(reference(a, b), y)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    assert losses[0] == pytest.approx(expected, rel=1e-10)
    want = dict(reference.named_parameters())
    for trainer in trainers:  # every copy of the tied weight equals the reference, and so does the rest
        for name, param in trainer.named_parameters():
            assert max_relative_error(param.detach(), want[name].detach()) < 1e-10, (trainer.rank, name)


def test_a_checkpoint_stores_a_tied_weight_once_and_resumes_like_uninterrupted(tmp_path: Path) -> None:
    from tests.runtime.scenarios import SCENARIOS, in_memory_trainers, reference

    batches = SCENARIOS["tied_towers3"].make_batches(4)

    def steps(trainers: list[PipelineTrainer], some: list, save: bool = False) -> list[float]:
        def body(rank: int) -> list[float]:
            losses = [trainers[rank].step(x, y) for x, y in some]
            if save:
                trainers[rank].save(str(tmp_path))
            return losses

        return run_threads(len(trainers), body)[0]

    first = steps(in_memory_trainers("tied_towers3"), batches[:2], save=True)
    files = [torch.load(tmp_path / f"stage_{idx}.pt", weights_only=True) for idx in range(3)]
    assert ["embed.weight" in state["model"] for state in files] == [True, False, False]
    assert [state["shared_from"] for state in files] == [{}, {"embed.weight": 0}, {"embed.weight": 0}]
    fresh = in_memory_trainers("tied_towers3")
    for trainer in fresh:
        trainer.load(str(tmp_path))
    second = steps(fresh, batches[2:])
    expected, _ = reference(SCENARIOS["tied_towers3"], 4)
    assert first + second == pytest.approx(expected, rel=1e-5)  # float32 model: summation order


def test_a_tied_head_is_reduced_over_its_holders_alone_in_its_own_dtype() -> None:
    """An embedding tied to the head two stages later: one bucket over ranks 0 and 2 in float32 (the middle
    rank takes no part, and nothing is widened to float64); training equals one device in float64."""
    from graphpipe.runtime.shared_grads import SharedGrads
    from tests.runtime.helpers import by_target
    from tests.runtime.test_accumulate_and_gather import TiedHead

    torch.manual_seed(0)
    plan = plan_from(TiedHead(), by_target([("embed", 0), ("body", 1), ("head", 2)]), [(0,), (1,), (2,)],
                     micro_batch_size=2, global_batch_size=8)
    shared = SharedGrads.of(split_stages(trace_module(TiedHead()), plan), plan)
    assert [(bucket.ranks, bucket.dtype, list(bucket.shapes)) for bucket in shared.buckets] == [
        ((0, 2), torch.float32, ["embed.weight"])]
    model = TiedHead().double()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                loss_fn=nn.functional.mse_loss, transport=hub.transport(rank), rank=rank)
                for rank in range(plan.world_size)]
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 30, (8, 4), generator=gen), torch.randn(8, 30, generator=gen, dtype=torch.float64))
               for _ in range(2)]
    run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in batches])
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.mse_loss(reference(x), y).backward()
        optimizer.step()
    for rank in (0, 2):
        got = dict(trainers[rank].named_parameters())["embed.weight"]
        assert max_relative_error(got.detach(), reference.embed.weight.detach()) < 1e-10
