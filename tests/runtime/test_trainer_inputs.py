"""The trainer takes the inputs the model was captured with: keyword inputs, and optional arguments left at
their defaults (timm's `forward(x, attn_mask=None, is_causal=False)` called with `x` alone)."""

from __future__ import annotations

import copy

import torch
from torch import nn

import graphpipe as gp
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.trainer import PipelineTrainer
from tests.corpus.models import OptionalArgs
from tests.runtime.helpers import max_relative_error, run_threads


def _train(inputs: object, targets: torch.Tensor, model: nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    graph = gp.capture(model, inputs)
    cluster = gp.Cluster.preset("summit", num_devices=3)
    plan = gp.plan(graph, gp.analytic_costs(graph, device="v100-16gb"), cluster, 8, micro_batch_sizes=(2,))
    assert plan.num_stages > 1
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                loss_fn=nn.functional.mse_loss, transport=hub.transport(rank), rank=rank,
                                example_inputs=inputs) for rank in range(plan.world_size)]
    losses = run_threads(plan.world_size, lambda rank: trainers[rank].step(inputs, targets))
    assert len(set(losses)) == 1
    return losses[0], {name: p.detach() for trainer in trainers for name, p in trainer.named_parameters()}


def test_optional_and_keyword_arguments_train_like_the_whole_model() -> None:
    torch.manual_seed(0)
    x, targets = torch.randn(8, 12), torch.randn(8, 3)
    bias = torch.randn(3)  # no batch dimension: every stage that reads it gets it whole
    for inputs in ((x,), {"x": x, "bias": bias}):
        model = OptionalArgs()
        reference = copy.deepcopy(model)
        loss, trained = _train(inputs, targets, model)
        given = gp.ModelInputs(args=inputs) if isinstance(inputs, tuple) else gp.ModelInputs(kwargs=inputs)
        expected = nn.functional.mse_loss(reference(*given.args, **given.kwargs), targets)
        expected.backward()
        torch.optim.SGD(reference.parameters(), lr=0.1).step()
        assert abs(loss - expected.item()) < 1e-6
        assert sorted(trained) == sorted(name for name, _ in reference.named_parameters())
        for name, want in reference.named_parameters():
            assert max_relative_error(trained[name], want.detach()) < 1e-6, name


def test_a_loss_that_couples_samples_fails_with_the_fix() -> None:
    """A contrastive loss whose targets index the whole batch cannot run on a micro-batch share."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8))
    inputs, targets = (torch.randn(8, 6),), torch.arange(8)
    graph = gp.capture(model, inputs)
    cluster = gp.Cluster.preset("summit", num_devices=2)
    plan = gp.plan(graph, gp.analytic_costs(graph, device="v100-16gb"), cluster, 8, micro_batch_sizes=(2,))
    hub = InMemoryHub(plan.world_size, timeout_s=5)

    def contrastive(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out @ out.t(), target)

    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                loss_fn=contrastive, transport=hub.transport(rank), rank=rank, example_inputs=inputs)
                for rank in range(plan.world_size)]
    try:  # the sink fails at its first loss, before its peers' receives time out
        run_threads(plan.world_size, lambda rank: trainers[rank].step(inputs, targets))
    except gp.GraphPipeError as err:
        message = str(err)
    else:
        raise AssertionError("the coupled loss should fail on micro-batches of 2")
    assert "couples samples" in message and "micro_batch_sizes=[mini-batch]" in message


def test_autocast_bf16_trains_like_the_whole_model_under_autocast() -> None:
    """bfloat16 keeps 8 bits of mantissa, and a matmul on a share of the batch may round its rows
    differently from one on the whole batch: losses and weights within 2e-2 of the reference run
    under the same autocast (fp32 weights, SGD)."""
    torch.manual_seed(0)
    x, targets = torch.randn(8, 12), torch.randn(8, 3)
    model = OptionalArgs()
    reference = copy.deepcopy(model)
    graph = gp.capture(model, (x,))
    cluster = gp.Cluster.preset("summit", num_devices=3)
    plan = gp.plan(graph, gp.analytic_costs(graph, device="v100-16gb"), cluster, 8, micro_batch_sizes=(2,))
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                loss_fn=nn.functional.mse_loss, transport=hub.transport(rank), rank=rank,
                                example_inputs=(x,), autocast=torch.bfloat16) for rank in range(plan.world_size)]
    losses = run_threads(plan.world_size, lambda rank: trainers[rank].step((x,), targets))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        expected = nn.functional.mse_loss(reference(x), targets)
    expected.float().backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    assert abs(losses[0] - expected.item()) <= 2e-2 * abs(expected.item())
    trained = {name: p.detach() for trainer in trainers for name, p in trainer.named_parameters()}
    for name, want in reference.named_parameters():
        assert trained[name].dtype == torch.float32
        assert max_relative_error(trained[name], want.detach()) < 2e-2, name


def test_costs_follow_the_activation_dtype() -> None:
    from graphpipe.graph.precision import with_activation_dtype

    graph = gp.capture(OptionalArgs(), (torch.randn(8, 12),))
    low = with_activation_dtype(graph, "bfloat16")
    full_costs = gp.analytic_costs(graph, device="v100-16gb")
    low_costs = gp.analytic_costs(low, device="v100-16gb")
    linear = next(op.name for op in graph.ops if op.module_type == "Linear")
    assert low_costs.at(linear, 8).output_bytes * 2 == full_costs.at(linear, 8).output_bytes
    assert low_costs.at(linear, 8).param_bytes == full_costs.at(linear, 8).param_bytes
