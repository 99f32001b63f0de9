"""Library models and awkward models of our own: capture, plan at 4 devices, and the split model equals
the whole one (forward and backward; relative error <= 1e-10 in fp64, <= 1e-6 in fp32)."""

from __future__ import annotations

import copy

import pytest
import torch

import graphpipe as gp
from graphpipe.graph.capture import capture_module
from graphpipe.model_inputs import as_model_inputs
from graphpipe.stages.validate import check_runtime_rules, validate_plan
from tests.corpus.models import BATCH, CORPUS, CorpusModel
from tests.corpus.split_run import split_forward_backward

pytest.importorskip("transformers")
TOLERANCE = 1e-10
TOLERANCES = {torch.float64: TOLERANCE, torch.float32: 1e-6}


def _built(entry: CorpusModel, dtype: torch.dtype) -> tuple:
    torch.manual_seed(0)
    model, inputs, loss_fn = entry.build()
    model = model.to(dtype)
    inputs = as_model_inputs(inputs).map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t)
    return model, inputs, loss_fn


def _rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: e.name)
def test_capture_plan_and_split_equal_the_whole_model(entry: CorpusModel, dtype: torch.dtype) -> None:
    model, inputs, loss_fn = _built(entry, dtype)
    tolerance = TOLERANCES[dtype]
    reference = copy.deepcopy(model)
    captured = capture_module(model, inputs)
    graph = captured.graph
    cluster = gp.Cluster.preset("summit", num_devices=4)
    plan = gp.plan(graph, gp.analytic_costs(graph, device="v100-16gb"), cluster, global_batch_size=BATCH)
    validate_plan(plan, graph, cluster)
    check_runtime_rules(plan, graph)

    loss = split_forward_backward(captured, plan, inputs, loss_fn)
    expected = loss_fn(reference(*inputs.args, **inputs.kwargs))
    expected.backward()
    assert _rel(loss, expected.detach()) <= tolerance
    grads = dict(model.named_parameters())
    largest = max(float(param.grad.norm()) for param in reference.parameters() if param.grad is not None)
    noise = 1e3 * torch.finfo(dtype).eps * largest  # rounding: what a gradient zero in exact arithmetic shows
    checked = 0
    for name, param in reference.named_parameters():
        if param.grad is None:
            continue
        got = grads[name].grad
        assert got is not None, f"{entry.name}: no gradient for {name}"
        if float(param.grad.norm()) <= noise:  # a key's bias under softmax: rounding noise on both sides
            assert float(got.norm()) <= noise, f"{entry.name}: gradient of {name} should be zero"
            continue
        assert _rel(got, param.grad) <= tolerance, f"{entry.name}: gradient of {name}"
        checked += 1
    assert checked > 0


class _LinearReluInplace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.act = torch.nn.ReLU(inplace=True)
        self.second = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.act(self.first(x)))


def test_an_in_place_op_at_a_stage_entry_leaves_the_received_tensor_alone() -> None:
    """Linear -> ReLU(inplace=True) -> Linear cut after the first Linear: the second stage starts in place."""
    torch.manual_seed(0)
    model = _LinearReluInplace().double()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(4, 6, dtype=torch.float64),)
    captured = capture_module(model, inputs)
    first = ("x", "first")
    stages = (gp.Stage(idx=0, ops=first, ranks=(0,), micro_batch_size=4, in_flight_samples=4),
              gp.Stage(idx=1, ops=tuple(n for n in captured.graph.names if n not in first), ranks=(1,),
                       micro_batch_size=4, in_flight_samples=4))
    plan = gp.Plan(graph_name="g", stages=stages, global_batch_size=4, num_devices=2, planner="manual",
                   edges=(gp.StageEdge(src=0, dst=1, tensors=("first",), bytes_per_sample=48.0),))
    validate_plan(plan, captured.graph)
    loss = split_forward_backward(captured, plan, inputs, lambda out: out.square().sum())
    expected = reference(*inputs).square().sum()
    expected.backward()
    assert _rel(loss, expected.detach()) <= TOLERANCE
    for name, param in reference.named_parameters():
        assert _rel(dict(model.named_parameters())[name].grad, param.grad) <= TOLERANCE


@pytest.mark.parametrize("entry", [e for e in CORPUS if e.two_towers], ids=lambda e: e.name)
def test_two_towers_run_side_by_side_where_that_is_faster(entry: CorpusModel) -> None:
    """The graph pipeline fires on a real network: the towers get parallel stages, and it beats the chain."""
    model, inputs, _ = _built(entry, torch.float32)
    graph = gp.capture(model, inputs)
    cluster = gp.Cluster.preset("summit", num_devices=4)
    costs = gp.analytic_costs(graph, device="v100-16gb")
    graph_plan = gp.plan(graph, costs, cluster, global_batch_size=BATCH)
    chain_plan = gp.plan(graph, costs, cluster, global_batch_size=BATCH, planner="sequential")
    assert graph_plan.depth < graph_plan.num_stages
    assert graph_plan.predicted_samples_per_s > chain_plan.predicted_samples_per_s
