"""Gradient accumulation and the whole model back from a running plan, against one device in float64:
- `step` on k of the plan's mini-batches at once accumulates their gradients into one optimizer step, equal to
  one device's step on the k-times larger mini-batch (mean loss);
- `consolidated_state_dict()` gives every rank of the plan the model's own `state_dict` (a weight shared across
  stages once, a tied head under both names), which `load_state_dict` takes on one device: identical outputs."""

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
from tests.runtime.scenarios import LR, SCENARIOS, Scenario, compare, in_float64

STEPS = 2


class TiedHead(nn.Module):
    """A language-model head tied to the embedding: `state_dict` names the one tensor twice."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 30, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.embed(tokens).mean(1))))


def _tied_head() -> Scenario:
    def batches(num_steps: int) -> list[tuple[Any, torch.Tensor]]:
        gen = torch.Generator().manual_seed(11)
        return [(torch.randint(0, 30, (8, 4), generator=gen), torch.randn(8, 30, generator=gen))
                for _ in range(num_steps)]

    return Scenario(name="tied_head2", make_model=TiedHead, make_batches=batches,
                    make_plan=lambda m: plan_from(m, by_target([("embed", 0), ("body", 1)]), [(0,), (1, 2)],
                                                  micro_batch_size=4, global_batch_size=8))


CASES = {"dp_sink4": SCENARIOS["dp_sink4"], "tied_towers3": SCENARIOS["tied_towers3"], "tied_head2": _tied_head()}


def _joined(batches: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """Several mini-batches as one batch, sample after sample."""
    inputs = [as_model_inputs(batch[0]).args for batch in batches]
    args = tuple(torch.cat([group[i] for group in inputs]) for i in range(len(inputs[0])))
    return (args if len(args) > 1 else args[0]), torch.cat([batch[1] for batch in batches])


def _trainers(scenario: Scenario, model: nn.Module, example: Any) -> list[PipelineTrainer]:
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    return [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                            loss_fn=scenario.loss_fn, schedule=make_schedule(plan, "1f1b"),
                            transport=hub.transport(rank), rank=rank, example_inputs=example)
            for rank in range(plan.world_size)]


def _one_device(scenario: Scenario, model: nn.Module, batches: list[tuple[Any, Any]]) -> tuple[list[float], nn.Module]:
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        given = as_model_inputs(inputs)
        loss = scenario.loss_fn(model(*given.args, **given.kwargs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("name", sorted(CASES))
def test_accumulating_k_mini_batches_equals_one_step_on_their_union(name: str) -> None:
    torch.set_num_threads(1)
    scenario = CASES[name]
    plain = [(in_float64(inputs), in_float64(targets)) for inputs, targets in scenario.make_batches(3 * STEPS)]
    steps = [_joined(plain[3 * step:3 * step + 3]) for step in range(STEPS)]  # 3 mini-batches a step
    model = scenario.model().double()
    expected_losses, expected_model = _one_device(scenario, model, steps)
    trainers = _trainers(scenario, model, plain[0][0])
    results = run_threads(len(trainers), lambda rank: [trainers[rank].step(*batch) for batch in steps])
    params = {key: value.detach() for trainer in trainers for key, value in trainer.named_parameters()}
    expected_params = {key: value.detach() for key, value in expected_model.named_parameters()}
    problems = compare(results[0], params, expected_losses, expected_params, rtol=1e-10)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_consolidated_state_dict_loads_into_the_model_on_one_device(name: str) -> None:
    torch.set_num_threads(1)
    scenario = CASES[name]
    batches = [(in_float64(inputs), in_float64(targets)) for inputs, targets in scenario.make_batches(STEPS + 1)]
    model = scenario.model().double()
    _, expected_model = _one_device(scenario, model, batches[:STEPS])
    trainers = _trainers(scenario, model, batches[0][0])

    def body(rank: int) -> dict[str, torch.Tensor]:
        for batch in batches[:STEPS]:
            trainers[rank].step(*batch)
        return trainers[rank].consolidated_state_dict()

    states = run_threads(len(trainers), body)
    expected = expected_model.state_dict()
    for state in states:
        assert list(state) == list(expected), "the model's keys, in its order"
        for key, value in state.items():
            assert torch.allclose(value, expected[key], rtol=1e-10, atol=1e-12), key
    fresh = scenario.model().double()
    fresh.load_state_dict(states[0])
    given = as_model_inputs(batches[-1][0])
    with torch.no_grad():
        assert torch.equal(fresh(*given.args, **given.kwargs),
                           _loaded(scenario, states[-1])(*given.args, **given.kwargs))
        assert torch.allclose(fresh(*given.args, **given.kwargs), expected_model(*given.args, **given.kwargs),
                              rtol=1e-10, atol=1e-12)


def _loaded(scenario: Scenario, state: dict[str, torch.Tensor]) -> nn.Module:
    model = scenario.model().double()
    model.load_state_dict(state)
    return model


def test_a_step_without_the_loss_sum_trains_the_same_and_returns_none() -> None:
    scenario = CASES["dp_sink4"]
    batches = [(in_float64(inputs), in_float64(targets)) for inputs, targets in scenario.make_batches(STEPS)]
    model = scenario.model().double()
    _, expected_model = _one_device(scenario, model, batches)
    trainers = _trainers(scenario, model, batches[0][0])
    results = run_threads(len(trainers), lambda rank: [trainers[rank].step(*batch, reduce_loss=False)
                                                       for batch in batches])
    assert all(loss is None for losses in results for loss in losses)
    expected = dict(expected_model.named_parameters())
    for trainer in trainers:
        for name, param in trainer.named_parameters():
            assert torch.allclose(param, expected[name], rtol=1e-10, atol=1e-12), name
