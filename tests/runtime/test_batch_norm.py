"""Train-mode BatchNorm in the pipeline: "micro" (torch's, per share), "deferred" and "sync".

Ranks run as threads of one process joined by an InMemoryHub. Each mode is compared with a
single-device float64 reference that runs plain BatchNorm on chunks of the mini-batch (the
share each call normalises: a rank's share for "micro" and "deferred", the whole micro-batch for
"sync") with gradient accumulation and the runtime's loss scaling (each chunk's mean loss times
its share of the mini-batch); the deferred running statistics are those of one nn.BatchNorm
forward over all the module's inputs of the mini-batch. SGD, not Adam: Adam would magnify rounding noise in
near-zero gradients, and the comparisons here are at 1e-10.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import nn

from graphpipe.errors import TrainingError
from graphpipe.graph.capture import capture_module
from graphpipe.graph.tracer import trace_module
from graphpipe.runtime.batch_norm import PipelineBatchNorm, _SyncBatchNormFn, prepare_batch_norm
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.stage_module import StageModule, StageSpec, split_stages
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.stages.stage_graph import Plan
from tests.runtime.helpers import by_target, plan_from, run_threads

LR = 0.1
BATCH = 12
MICRO = 4
TOL = 1e-10
Batches = list[tuple[torch.Tensor, torch.Tensor]]


class BnNet(nn.Module):
    """BatchNorm on a 2-D input (stage 0); on a 3-D input with momentum None (the cumulative average) and one
    without running statistics or affine parameters (stage 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc0 = nn.Linear(8, 16, bias=False)
        self.bn0 = nn.BatchNorm1d(16)
        self.fc1 = nn.Linear(16, 16)
        self.bn1 = nn.BatchNorm1d(4, momentum=None)
        self.bn2 = nn.BatchNorm1d(16, affine=False, track_running_stats=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.bn0(self.fc0(x)))
        h = self.bn1(self.fc1(h).view(-1, 4, 4)).flatten(1)
        return self.head(torch.relu(self.bn2(h)))


def make_model() -> BnNet:
    """Float64, with affine parameters and running statistics away from their initial values."""
    torch.manual_seed(3)
    model = BnNet().double()
    with torch.no_grad():
        for bn in (model.bn0, model.bn1):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0.0, 0.2)
            bn.running_mean.normal_(0.0, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model


def make_plan(model: nn.Module, ranks: Sequence[Sequence[int]]) -> Plan:
    """fc0, bn0, tanh on stage 0; the rest on stage 1; micro-batches of MICRO samples."""
    return plan_from(model, by_target([("fc0", 0), ("fc1", 1)]), ranks, micro_batch_size=MICRO,
                     global_batch_size=BATCH)


def make_batches(num_steps: int) -> Batches:
    gen = torch.Generator().manual_seed(11)
    return [(torch.randn(BATCH, 8, generator=gen, dtype=torch.float64) * 2 + 0.5,
             torch.randn(BATCH, 3, generator=gen, dtype=torch.float64)) for _ in range(num_steps)]


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def reference(model: nn.Module, batches: Batches, chunk: int, *,
              per_chunk_stats: bool = False) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Single-device SGD: plain BatchNorm on each `chunk` of the mini-batch, gradients accumulated.

    Running statistics: each BatchNorm makes one plain forward over everything it saw in the step (its
    inputs of every chunk, concatenated: the whole mini-batch); or, `per_chunk_stats`, torch's update per
    chunk, in order. (For bn0 that is one forward of the model over the mini-batch; bn1's inputs come from
    the chunk-normalised bn0, as in the pipeline.)"""
    model = copy.deepcopy(model).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    norms = {name: module for name, module in model.named_modules() if isinstance(module, nn.BatchNorm1d)}
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in norms}
    for name, module in norms.items():
        module.register_forward_pre_hook(lambda _, args, name=name: seen[name].append(args[0].detach()))
    losses = []
    for x, y in batches:
        kept = {name: buffer.clone() for name, buffer in model.named_buffers()}
        optimizer.zero_grad()
        total = 0.0
        for start in range(0, len(x), chunk):
            loss = mse(model(x[start:start + chunk]), y[start:start + chunk]) * (chunk / len(x))
            loss.backward()
            total += loss.item()
        if not per_chunk_stats:
            with torch.no_grad():
                for name, buffer in model.named_buffers():
                    buffer.copy_(kept[name])
                for name, module in norms.items():
                    nn.BatchNorm1d.forward(module, torch.cat(seen[name]))  # no hook: one plain call
        for inputs in seen.values():
            inputs.clear()
        optimizer.step()
        losses.append(total)
    return (losses, {name: p.detach().clone() for name, p in model.named_parameters()},
            {name: b.clone() for name, b in model.named_buffers()})


def train_threads(model: nn.Module, plan: Plan, mode: str, batches: Batches) -> tuple[list[float], list[Any]]:
    """Every rank of `plan` as a thread; the losses (rank 0's) and every rank's trainer."""
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    trainers = [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
                                loss_fn=mse, transport=hub.transport(rank), rank=rank, batch_norm=mode)
                for rank in range(plan.world_size)]
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in batches])
    return losses[0], trainers


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-12))


def mismatches(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tol: float = TOL) -> list[str]:
    """Names whose tensor differs from `expected` by more than `tol` (relative)."""
    return [f"{name}: {relative_error(value, expected[name]):.3g}" for name, value in state.items()
            if relative_error(value, expected[name]) > tol]


def rank_states(trainers: Sequence[Any]) -> list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """(parameters, buffers) of every rank, by original name."""
    out = []
    for trainer in trainers:
        params = {name: p.detach() for name, p in trainer.named_parameters()}
        buffers = {name: b for name, b in trainer.state_dict().items() if name not in params}
        out.append((params, buffers))
    return out


PLANS = {"two_stages": [(0,), (1,)], "dp_stages": [(0, 1), (2, 3)]}


@pytest.mark.parametrize(("mode", "plan_name", "chunk"), [
    ("deferred", "two_stages", MICRO), ("sync", "two_stages", MICRO),
    ("deferred", "dp_stages", MICRO // 2),  # each rank normalises its share; the running stats see the mini-batch
    ("sync", "dp_stages", MICRO),  # each micro-batch is normalised whole, across the stage's two ranks
])
def test_mode_trains_like_the_chunked_reference_with_mini_batch_running_stats(mode: str, plan_name: str,
                                                                              chunk: int) -> None:
    model = make_model()
    plan = make_plan(model, PLANS[plan_name])
    batches = make_batches(2)
    losses, trainers = train_threads(model, plan, mode, batches)
    want_losses, want_params, want_buffers = reference(model, batches, chunk)
    assert losses == pytest.approx(want_losses, rel=TOL)
    for rank, (params, buffers) in enumerate(rank_states(trainers)):
        assert not mismatches(params, want_params), (rank, mismatches(params, want_params))
        assert not mismatches(buffers, want_buffers), (rank, mismatches(buffers, want_buffers))
        assert all(int(buffers[f"{bn}.num_batches_tracked"]) == len(batches) for bn in ("bn0", "bn1")
                   if f"{bn}.num_batches_tracked" in buffers)
    assert {name for _, buffers in rank_states(trainers) for name in buffers} == set(want_buffers)


def test_micro_moves_running_stats_per_micro_batch_and_so_differs_from_deferred() -> None:
    model = make_model()
    plan = make_plan(model, PLANS["two_stages"])
    batches = make_batches(2)
    _, trainers = train_threads(model, plan, "micro", batches)
    _, want_params, per_chunk = reference(model, batches, MICRO, per_chunk_stats=True)
    _, _, whole = reference(model, batches, MICRO)
    buffers = {name: b for _, state in rank_states(trainers) for name, b in state.items()}
    params = {name: p for state, _ in rank_states(trainers) for name, p in state.items()}
    assert not mismatches(params, want_params)  # same training numbers as "deferred"
    assert not mismatches(buffers, per_chunk)
    assert int(buffers["bn0.num_batches_tracked"]) == len(batches) * BATCH // MICRO
    assert relative_error(buffers["bn0.running_var"], whole["bn0.running_var"]) > 1e-3
    assert relative_error(buffers["bn1.running_var"], whole["bn1.running_var"]) > 1e-3  # momentum None: the means agree


def test_the_references_tell_the_modes_apart() -> None:
    """Normalising shares of 2 and micro-batches of 4 give different parameters: the dp_stages cases test
    something."""
    model = make_model()
    batches = make_batches(2)
    _, shares, _ = reference(model, batches, MICRO // 2)
    _, whole, _ = reference(model, batches, MICRO)
    assert max(relative_error(shares[name], whole[name]) for name in whole) > 1e-3


def test_sync_function_equals_batch_norm_over_the_concatenated_shares() -> None:
    """Outputs and every gradient of two ranks' shares (3 and 5 samples) equal one F.batch_norm call on all 8."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(8, 3, 5, generator=gen, dtype=torch.float64) * 3 + 1
    grad = torch.randn(8, 3, 5, generator=gen, dtype=torch.float64)
    weight = torch.rand(3, generator=gen, dtype=torch.float64) + 0.5
    bias = torch.randn(3, generator=gen, dtype=torch.float64)

    def expected() -> tuple[Any, ...]:
        xs, w, b = (t.clone().requires_grad_(True) for t in (x, weight, bias))
        out = nn.functional.batch_norm(xs, None, None, w, b, True, 0.0, 1e-5)
        out.backward(grad)
        return out.detach(), xs.grad, w.grad, b.grad

    hub = InMemoryHub(2, timeout_s=15)
    rows = [(0, 3), (3, 8)]

    def rank_body(rank: int) -> tuple[Any, ...]:
        start, stop = rows[rank]
        xs = x[start:stop].clone().requires_grad_(True)
        w, b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
        out, totals = _SyncBatchNormFn.apply(xs, w, b, 1e-5, hub.transport(rank), (0, 1))
        out.backward(grad[start:stop])
        assert float(totals[-1]) == 8 * 5
        return out.detach(), xs.grad, w.grad, b.grad

    got = run_threads(2, rank_body)
    want_out, want_x, want_w, want_b = expected()
    assert relative_error(torch.cat([got[0][0], got[1][0]]), want_out) < TOL
    assert relative_error(torch.cat([got[0][1], got[1][1]]), want_x) < TOL
    assert relative_error(got[0][2] + got[1][2], want_w) < TOL  # the data-parallel all-reduce sums these
    assert relative_error(got[0][3] + got[1][3], want_b) < TOL


def _split(model: nn.Module, ranks: Sequence[Sequence[int]] = ((0,), (1,))) -> tuple[StageModule, ...]:
    return split_stages(trace_module(model), make_plan(model, ranks))


@pytest.mark.parametrize("mode", ["deferred", "sync"])
def test_swap_keeps_the_models_tensors_and_names_and_eval_is_plain_batch_norm(mode: str) -> None:
    model = make_model()
    stages = _split(model)
    before = [(stage.named_parameters(), stage.named_buffers()) for stage in stages]
    hub = InMemoryHub(1)
    for stage in stages:
        prepare_batch_norm(stage, mode, transport=hub.transport(0), dp_ranks=(0,))
    assert isinstance(stages[0].module.get_submodule("bn0"), PipelineBatchNorm)
    assert isinstance(stages[1].module.get_submodule("bn2"), PipelineBatchNorm)
    assert type(model.bn0) is nn.BatchNorm1d  # the model's own tree is untouched
    for stage, (params, buffers) in zip(stages, before):
        assert [(n, id(p)) for n, p in stage.named_parameters()] == [(n, id(p)) for n, p in params]
        assert [(n, id(b)) for n, b in stage.named_buffers()] == [(n, id(b)) for n, b in buffers]
    x = make_batches(1)[0][0]
    model.eval()
    for stage in stages:
        stage.module.eval()
    with torch.no_grad():
        hidden = stages[0]({"x": x}, {})
        out = stages[1]({}, hidden)
        assert relative_error(next(iter(out.values())), model(x)) < TOL


def test_deferred_leaves_running_stats_until_commit() -> None:
    model = make_model()
    stage = _split(model)[0]
    rule = prepare_batch_norm(stage, "deferred", transport=InMemoryHub(1).transport(0), dp_ranks=(0,))
    x = make_batches(1)[0][0]
    before = model.bn0.running_mean.clone()
    stage.module.train()
    stage({"x": x[:6]}, {})
    stage({"x": x[6:]}, {})
    assert torch.equal(model.bn0.running_mean, before) and int(model.bn0.num_batches_tracked) == 0
    rule.commit()
    plain = copy.deepcopy(make_model().bn0).train()
    plain(model.fc0(x))
    assert relative_error(model.bn0.running_mean, plain.running_mean) < TOL
    assert relative_error(model.bn0.running_var, plain.running_var) < TOL
    rule.commit()  # a step without train-mode forwards moves nothing
    assert relative_error(model.bn0.running_var, plain.running_var) < TOL and int(model.bn0.num_batches_tracked) == 1


def test_unknown_mode_is_refused_with_the_modes() -> None:
    stage = _split(make_model())[0]
    with pytest.raises(TrainingError, match=r"micro, deferred, sync.*'global'"):
        prepare_batch_norm(stage, "global", transport=InMemoryHub(1).transport(0), dp_ranks=(0,))


class FunctionalBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.batch_norm(self.fc(x), self.mean, self.var, training=True)


def _whole_stage(gm: torch.fx.GraphModule) -> StageModule:
    nodes = tuple(node.name for node in gm.graph.nodes if node.op not in ("placeholder", "get_attr"))
    return StageModule(spec=StageSpec(stage_idx=0, nodes=nodes, data_inputs=(), inputs=(), outputs=()), module=gm)


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_function_form_batch_norm_is_refused_outside_micro(capture: str) -> None:
    """fx keeps F.batch_norm a function; torch.export turns every BatchNorm into aten.batch_norm."""
    model: nn.Module = FunctionalBn() if capture == "fx" else nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    gm = capture_module(model, (torch.randn(6, 4),), method=capture, with_graph=False).module
    transport = InMemoryHub(1).transport(0)
    prepare_batch_norm(_whole_stage(gm), "micro", transport=transport, dp_ranks=(0,))
    for mode in ("deferred", "sync"):
        with pytest.raises(TrainingError, match=r"batch norm as a function \(.*batch_norm.*capture='fx'"):
            prepare_batch_norm(_whole_stage(gm), mode, transport=transport, dp_ranks=(0,))
