"""Activation recomputation per stage (`Stage.recompute`, `graphpipe.runtime.recompute`): a recomputing stage keeps
only its inputs and runs its forward again in its backward, and training stays equal to one device.

The equivalence runs a fork/join plan (a stem, two branches, a join) whose join reads the stem's embedding
(a weight tied across stages) and whose second branch is data parallel over two ranks, ranks as threads joined
by an InMemoryHub, in float64 against plain Adam on one device (1e-10), for several choices of recomputing
stages, both schedules, two mini-batches accumulated into one step, and evaluation. Dropout must draw the same
mask in the recompute, and BatchNorm's running statistics must move once per sample in every batch-norm mode.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from graphpipe.errors import PlanValidationError
from graphpipe.graph.tracer import trace_module
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.recompute import BufferGuard, recomputing, run_recomputed
from graphpipe.runtime.stage_module import split_stages
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.stages.stage_graph import Plan, Stage, parse_recompute
from tests.runtime.helpers import by_target, max_relative_error, plan_from, run_threads

LR = 1e-2
TOL = 1e-10
BATCH = 16
RANKS = [(0,), (1,), (2, 3), (4,)]  # stem, left branch, right branch (data parallel), join


class ForkJoinTied(nn.Module):
    """An embedding and a stem, two branches, a join whose output layer is tied to the embedding."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 12)
        self.stem = nn.Linear(12, 12)
        self.left = nn.Sequential(nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 12))
        self.right = nn.Sequential(nn.Linear(12, 12), nn.Dropout(dropout), nn.Tanh(), nn.Linear(12, 12))
        self.join = nn.Linear(12, 12)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.stem(self.embed(tokens).mean(1)))
        return self.join(self.left(h) * torch.sigmoid(self.right(h))) @ self.embed.weight.t()


def fork_join_plan(model: nn.Module, recompute: str = "none") -> Plan:
    plan = plan_from(model, by_target([("embed", 0), ("stem", 0), ("tanh", 0), ("left", 1), ("right", 2),
                                       ("mul", 3), ("sigmoid", 3), ("join", 3), ("t", 3)]),
                     RANKS, micro_batch_size=4, global_batch_size=BATCH)
    return plan.with_recompute(recompute)


def batches(num_steps: int, size: int = BATCH) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(17)
    return [(torch.randint(0, 40, (size, 5), generator=gen), torch.randn(size, 40, generator=gen, dtype=torch.float64))
            for _ in range(num_steps)]


def make_model(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(5)
    return ForkJoinTied(dropout).double()


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def trainers_for(model: nn.Module, plan: Plan, schedule: str = "1f1b", batch_norm: str = "micro",
                 optimizer: type[torch.optim.Optimizer] = torch.optim.Adam) -> list[PipelineTrainer]:
    hub = InMemoryHub(plan.world_size, timeout_s=30)
    return [PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: optimizer(ps, lr=LR), loss_fn=mse,
                            schedule=schedule, transport=hub.transport(rank), rank=rank, batch_norm=batch_norm)
            for rank in range(plan.world_size)]


def one_device(model: nn.Module, data: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], nn.Module]:
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(reference.parameters(), lr=LR)
    losses = []
    for x, y in data:
        optimizer.zero_grad()
        loss = mse(reference(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, reference


def worst_error(trainers: Sequence[PipelineTrainer], reference: nn.Module) -> float:
    want = dict(reference.named_parameters())
    return max(max_relative_error(param.detach(), want[name].detach())
               for trainer in trainers for name, param in trainer.named_parameters())


# ---- equal to one device --------------------------------------------------------------------------
@pytest.mark.parametrize(("recompute", "schedule"), [("s1,s2", "1f1b"), ("all", "1f1b"), ("s0,s3", "gpipe")])
def test_recomputing_stages_train_like_one_device(recompute: str, schedule: str) -> None:
    model = make_model()
    plan = fork_join_plan(model, recompute)
    assert plan.recompute_stages == tuple(sorted(parse_recompute(recompute, 4)))
    stages = {stage.spec.stage_idx: stage for stage in split_stages(trace_module(model), plan)}
    assert [stages[idx].recompute for idx in range(4)] == [stage.recompute for stage in plan.stages]
    assert [stage.spec.stage_idx for stage in stages.values() if "embed.weight" in stage.spec.shared_params] == [0, 3]
    trainers = trainers_for(model, plan, schedule)
    data = batches(3)
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in data])
    expected, reference = one_device(model, data)
    assert losses[0] == pytest.approx(expected, rel=TOL)
    assert worst_error(trainers, reference) < TOL


def test_recompute_with_accumulated_mini_batches_and_evaluation_is_one_device() -> None:
    """Two mini-batches accumulated into one step (the batch is twice the plan's), then evaluation: forward only,
    nothing recomputed (no gradients), the loss of the model one device trained."""
    model = make_model()
    plan = fork_join_plan(model, "all")
    trainers = trainers_for(model, plan)
    data = batches(2, 2 * BATCH)
    held_out = batches(1)[0]

    def body(rank: int) -> tuple[list[float], float]:
        losses = [trainers[rank].step(x, y) for x, y in data]
        return losses, trainers[rank].evaluate(*held_out)

    results = run_threads(plan.world_size, body)
    expected, reference = one_device(model, data)
    assert results[0][0] == pytest.approx(expected, rel=TOL)
    assert worst_error(trainers, reference) < TOL
    with torch.no_grad():
        want = mse(reference.eval()(held_out[0]), held_out[1]).item()
    assert results[0][1] == pytest.approx(want, rel=TOL)


# ---- what a recomputing stage keeps ----------------------------------------------------------------
def _saved_by_autograd(stage_call: object) -> list[torch.Tensor]:
    """The tensors autograd saves for the backward outside a checkpoint while `stage_call()` runs."""
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        stage_call()  # type: ignore[operator]
    return saved


def test_a_recomputing_stage_saves_nothing_but_its_inputs_and_recomputes_in_backward() -> None:
    model = make_model()
    keep, again = (split_stages(trace_module(model), fork_join_plan(model, choice))[1] for choice in ("none", "s1"))
    received = {name: torch.randn(4, 12, dtype=torch.float64, requires_grad=True) for name in keep.spec.inputs}
    assert len(_saved_by_autograd(lambda: keep({}, received))) > len(received)
    kept = _saved_by_autograd(lambda: again({}, received))  # the checkpoint holds the inputs alone
    assert sorted(map(id, kept)) == sorted(map(id, received.values()))
    out_keep, out_again = keep({}, received), again({}, received)
    grads = []
    for out in (out_keep, out_again):
        value = out[keep.spec.outputs[0]]
        grads.append(torch.autograd.grad(value.square().sum(), list(received.values())))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    with torch.no_grad():  # evaluation: no checkpoint at all
        assert not _saved_by_autograd(lambda: again({}, received))


def test_dropout_draws_the_same_mask_in_the_recompute() -> None:
    """The right branch with dropout 0.5: recomputed, its gradients equal those of the stage that kept its
    activations, from the same RNG state (checkpoint's preserve_rng_state); with the RNG moved on between the
    forward and the backward (other micro-batches' forwards in between), still."""
    model = make_model(dropout=0.5).train()
    keep, again = (split_stages(trace_module(model), fork_join_plan(model, choice))[2] for choice in ("none", "s2"))
    received = {name: torch.randn(4, 12, dtype=torch.float64, requires_grad=True) for name in keep.spec.inputs}
    grads = []
    for stage in (keep, again):
        torch.manual_seed(21)
        out = stage({}, received)[keep.spec.outputs[0]]
        torch.rand(100)  # the generator moves on before the backward
        grads.append(torch.autograd.grad(out.square().sum(), list(received.values())))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_recomputing_is_true_only_inside_the_recompute() -> None:
    seen: list[bool] = []
    guard = BufferGuard(nn.Module())

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(recomputing())
        return torch.sin(x)

    x = torch.randn(3, requires_grad=True)
    run_recomputed(fn, (x,), guard).sum().backward()
    assert seen == [False, True] and not recomputing()


def test_the_buffer_guard_puts_back_what_the_recompute_writes() -> None:
    """A module that counts its calls in a buffer: the recompute's write is undone, so the count is the forward's."""

    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))
            self.register_buffer("scale", torch.ones(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return torch.sin(x) * self.scale

    module = Counting()
    guard = BufferGuard(module)
    for _ in range(3):
        x = torch.randn(3, requires_grad=True)
        run_recomputed(module, (x,), guard).sum().backward()
    assert float(module.calls) == 3.0
    assert guard.written == ("calls",)  # found once, then only that one is copied


# ---- BatchNorm ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["micro", "deferred", "sync"])
@pytest.mark.parametrize("ranks", [[(0,), (1,)], [(0, 1), (2, 3)]], ids=["two_stages", "dp_stages"])
def test_batch_norm_moves_its_running_stats_once_when_recomputed(mode: str, ranks: list[tuple[int, ...]]) -> None:
    """Every stage recomputing trains exactly as no stage recomputing, running statistics and their counts
    included, in every batch-norm mode (a second update would move them on)."""
    from tests.runtime.test_batch_norm import BnNet, make_batches, make_model

    model: BnNet = make_model()
    data = make_batches(2)
    results = []
    for choice in ("none", "all"):
        plan = plan_from(model, by_target([("fc0", 0), ("fc1", 1)]), ranks, micro_batch_size=4,
                         global_batch_size=12).with_recompute(choice)
        trainers = trainers_for(model, plan, batch_norm=mode, optimizer=torch.optim.SGD)
        losses = run_threads(plan.world_size, lambda rank, ranks=trainers: [ranks[rank].step(x, y) for x, y in data])
        results.append((losses[0], [trainer.state_dict() for trainer in trainers]))
    (losses_keep, states_keep), (losses_again, states_again) = results
    assert losses_again == pytest.approx(losses_keep, rel=1e-12)
    for keep, again in zip(states_keep, states_again):
        assert keep.keys() == again.keys()
        for name in keep:
            assert max_relative_error(again[name].double(), keep[name].double()) < 1e-12, (mode, name)


# ---- the plan -----------------------------------------------------------------------------------------
def test_the_recompute_choice_round_trips_and_old_plans_read_unchanged() -> None:
    plan = fork_join_plan(make_model())
    assert all("recompute" not in stage for stage in plan.to_dict()["stages"])  # old files: byte for byte
    chosen = plan.with_recompute([1, 3])
    data = chosen.to_dict()
    assert [stage.get("recompute", False) for stage in data["stages"]] == [False, True, False, True]
    assert Plan.from_dict(data) == chosen
    assert Plan.from_dict(plan.to_dict()).recompute_stages == ()
    assert chosen.with_recompute("none") == plan
    assert "recompute" in str(chosen.stages[1])


@pytest.mark.parametrize(("text", "want"), [("all", {0, 1, 2, 3}), ("none", set()), ("", set()),
                                            ("s1,s3", {1, 3}), ("2, s0", {0, 2}), ("S1", {1})])
def test_parse_recompute(text: str, want: set[int]) -> None:
    assert parse_recompute(text, 4) == want


@pytest.mark.parametrize("text", ["s4", "x1", "s1,,all", "-1"])
def test_parse_recompute_refuses_what_is_no_stage(text: str) -> None:
    with pytest.raises(PlanValidationError):
        parse_recompute(text, 4)


def test_recompute_must_be_a_bool_and_name_existing_stages() -> None:
    with pytest.raises(PlanValidationError, match="true or false"):
        Stage(idx=0, ops=("a",), ranks=(0,), micro_batch_size=1, in_flight_samples=1,
              recompute=1)  # type: ignore[arg-type]
    with pytest.raises(PlanValidationError, match=r"s0\.\.s3"):
        fork_join_plan(make_model()).with_recompute([5])


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_batch_norm_as_a_function_is_put_back_after_the_recompute(capture: str) -> None:
    """torch.export turns BatchNorm into `aten.batch_norm` on the graph's buffers, fx keeps `F.batch_norm` a
    function: the guard finds their buffers in the graph and the recompute leaves them as the forward did."""
    from graphpipe.graph.capture import capture_module
    from tests.runtime.test_batch_norm import FunctionalBn

    torch.manual_seed(0)
    model: nn.Module = FunctionalBn() if capture == "fx" else nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    gm = capture_module(model, (torch.randn(6, 4),), method=capture, with_graph=False).module.train()
    guard = BufferGuard(gm)
    assert guard.always and all(name in dict(gm.named_buffers()) for name in guard.always)
    x = torch.randn(6, 4)
    plain = copy.deepcopy(gm)
    out = plain(x)
    (out if isinstance(out, torch.Tensor) else out[0]).sum().backward()
    for _ in range(2):
        out = run_recomputed(gm, (x,), guard)
        (out if isinstance(out, torch.Tensor) else out[0]).sum().backward()
    plain(x)  # the second step of the plain module
    for name, buffer in gm.named_buffers():
        assert torch.equal(buffer, dict(plain.named_buffers())[name]), name
