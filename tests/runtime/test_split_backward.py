"""Split backward (`graphpipe.runtime.split_backward`) under the zero-bubble schedule: training stays equal to one
device, and the two halves together do the work of one backward, not more.

The equivalence runs the fork/join plan of `test_recompute` (a stem holding an embedding, two branches, the
second data parallel over two ranks, a join whose output layer is tied to the embedding), ranks as threads
joined by an InMemoryHub, in float64 against plain Adam on one device (1e-10).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphpipe.errors import ScheduleError, TrainingError
from graphpipe.graph.tracer import trace_module
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.p2p_check import check
from graphpipe.runtime.split_backward import backward_input
from graphpipe.runtime.stage_module import StageModule, split_stages
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.schedule.action import ActionKind
from graphpipe.schedule.generate import make_schedule
from graphpipe.schedule.schedule import Schedule
from graphpipe.schedule.validate import validate_schedule
from graphpipe.stages.stage_graph import Plan
from tests.runtime.helpers import by_target, max_relative_error, plan_from, run_threads
from tests.runtime.scenarios import LR, SCENARIOS, compare, float64_scenario, reference
from tests.runtime.test_p2p_check import _recorded as recorded_launches
from tests.runtime.test_recompute import (
    BATCH,
    batches,
    fork_join_plan,
    make_model,
    mse,
    one_device,
    trainers_for,
    worst_error,
)

TOL = 1e-10
SCHEDULE = "zero-bubble"


def _train(recompute: str, data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[PipelineTrainer], list[float]]:
    model = make_model()
    plan = fork_join_plan(model, recompute)
    trainers = trainers_for(model, plan, SCHEDULE)
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in data])
    return trainers, losses[0]


@pytest.mark.parametrize("recompute", ["none", "s1,s2"])
def test_zero_bubble_trains_like_one_device(recompute: str) -> None:
    """Every stage splits its backward, except recomputing ones (whole backwards); the tied embedding's two
    copies and the data-parallel branch's buckets are reduced after the last W."""
    data = batches(3)
    trainers, losses = _train(recompute, data)
    plan = trainers[0].plan
    for stage in plan.stages:
        kinds = {action.kind for action in make_schedule(plan, SCHEDULE).actions[stage.idx]}
        split = {ActionKind.INPUT_GRAD, ActionKind.WEIGHT_GRAD}
        assert (kinds & split == split, ActionKind.BACKWARD in kinds) == (not stage.recompute, stage.recompute)
    expected, reference = one_device(make_model(), data)
    assert losses == pytest.approx(expected, rel=TOL)
    assert worst_error(trainers, reference) < TOL
    assert any(t.executor.buckets is not None and t.executor.buckets.launched_early for t in trainers)


def test_zero_bubble_with_accumulated_mini_batches_is_one_device() -> None:
    data = batches(2, 2 * BATCH)
    trainers, losses = _train("none", data)
    expected, reference = one_device(make_model(), data)
    assert losses == pytest.approx(expected, rel=TOL)
    assert worst_error(trainers, reference) < TOL


@pytest.mark.parametrize("name", ["tied_towers3", "dp_sink4", "split3", "inplace_cnn3"])
def test_zero_bubble_scenarios_equal_one_device(name: str) -> None:
    """A weight shared by three stages, a data-parallel sink, per-stage micro-batch sizes, in-place entry ops."""
    scenario = float64_scenario(SCENARIOS[name])
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=30)
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, schedule=SCHEDULE, transport=hub.transport(rank), rank=rank)
                for rank in range(plan.world_size)]
    data = scenario.make_batches(3)
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in data])
    expected, expected_params = reference(scenario, 3)
    params = {key: param.detach() for trainer in trainers for key, param in trainer.named_parameters()}
    problems = compare(losses[0], params, expected, expected_params, rtol=TOL)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", ["diamond3", "tied_towers3", "dp_sink4", "split3"])
def test_zero_bubble_completes_under_nccl_semantics(name: str) -> None:
    """The point-to-point program of a real run, replayed under NCCL's blocking rules (`test_p2p_check`)."""
    problems = check(recorded_launches(name, SCHEDULE))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mode", ["micro", "deferred", "sync"])
def test_batch_norm_modes_train_alike_split_or_whole(mode: str) -> None:
    """Two data-parallel stages with batch norms: the split schedule trains as 1F1B does, running statistics
    included. In `sync` mode the batch norm is a custom autograd Function, which computes all of its gradients
    (and all-reduces the input's terms) in each pass that runs it: in I and again in W, same on every rank."""
    from tests.runtime.test_batch_norm import make_batches
    from tests.runtime.test_batch_norm import make_model as make_bn_model

    model = make_bn_model()
    data = make_batches(2)
    plan = plan_from(model, by_target([("fc0", 0), ("fc1", 1)]), [(0, 1), (2, 3)], micro_batch_size=4,
                     global_batch_size=12)
    results = []
    for schedule in ("1f1b", SCHEDULE):
        trainers = trainers_for(model, plan, schedule, batch_norm=mode, optimizer=torch.optim.SGD)
        losses = run_threads(plan.world_size, lambda rank, ranks=trainers: [ranks[rank].step(x, y) for x, y in data])
        results.append((losses[0], [trainer.state_dict() for trainer in trainers]))
    (losses_whole, states_whole), (losses_split, states_split) = results
    assert losses_split == pytest.approx(losses_whole, rel=1e-12)
    for whole, split in zip(states_whole, states_split):
        for name in whole:
            assert max_relative_error(split[name].double(), whole[name].double()) < 1e-12, (mode, name)


# ---- the halves do one backward's work ----------------------------------------------------------------
def _stage_outputs(idx: int) -> tuple[StageModule, dict[str, torch.Tensor], torch.Tensor]:
    """Stage `idx` of the fork/join plan run on random received values, and a scalar of its outputs."""
    model = make_model()
    stage = split_stages(trace_module(model), fork_join_plan(model))[idx]
    gen = torch.Generator().manual_seed(idx)
    received = {name: torch.randn(4, 12, dtype=torch.float64, generator=gen, requires_grad=True)
                for name in stage.spec.inputs}
    tokens = {name: torch.randint(0, 40, (4, 5), generator=gen) for name in stage.spec.data_inputs}
    outputs = stage(tokens, received)
    return stage, received, sum(value.square().sum() for value in outputs.values())


def _flops(run: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("idx", [1, 2, 3])
def test_input_and_weight_halves_do_one_backward_of_work(idx: int) -> None:
    """Counted in matmul FLOPs (no clock): I + W equals one whole backward, each half does part of it, and the
    gradients are the whole backward's."""
    stage, received, total = _stage_outputs(idx)
    whole_flops = _flops(lambda: total.backward())
    whole = [value.grad for value in received.values()] + [p.grad for _, p in stage.named_parameters()]
    stage, received, total = _stage_outputs(idx)
    params = [param for _, param in stage.named_parameters()]
    works = []
    input_flops = _flops(lambda: works.append(backward_input([total], [None], list(received.values()), params)))
    assert all(p.grad is None for p in params)  # I leaves the parameters alone
    weight_flops = _flops(works[0].run)
    split = [value.grad for value in received.values()] + [p.grad for p in params]
    assert 0 < input_flops < whole_flops and 0 < weight_flops < whole_flops
    assert input_flops + weight_flops == whole_flops
    for got, want in zip(split, whole):
        assert got is not None and want is not None
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("use", ["nested", "twice_in_one_op"])
def test_a_weight_reached_twice_is_not_counted_twice(use: str) -> None:
    """`(x * w) * w`: w is a child of both products, one on the other's input path (the micro-batch runs whole in
    I, its W is empty); `addcmul(x, w, w) * x`: one node reaches w by two edges (W asks for w's gradient once)."""
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    w = nn.Parameter(torch.randn(5, dtype=torch.float64))

    def output() -> torch.Tensor:
        return ((x * w) * w).sum() if use == "nested" else (torch.addcmul(x, w, w) * x).sum()

    output().backward()
    want_x, want_w = x.grad, w.grad
    x.grad = w.grad = None
    work = backward_input([output()], [None], [x], [w])
    work.run()
    assert x.grad is not None and w.grad is not None and want_x is not None and want_w is not None
    assert torch.allclose(x.grad, want_x, rtol=1e-14) and torch.allclose(w.grad, want_w, rtol=1e-14)


# ---- recomputation keeps whole backwards --------------------------------------------------------------
def _split_everywhere(plan: Plan) -> Schedule:
    """The zero-bubble schedule with every backward split, recomputing stages included."""
    schedule = make_schedule(plan.with_recompute("none"), SCHEDULE)
    return dataclasses.replace(schedule, kind="hand-made")


def test_a_recomputing_stage_refuses_a_split_backward() -> None:
    model = make_model()
    plan = fork_join_plan(model, "s1")
    schedule = _split_everywhere(plan)
    with pytest.raises(ScheduleError, match="stage 1 recomputes its forward, so it cannot split its backward"):
        validate_schedule(schedule, plan)
    hub = InMemoryHub(plan.world_size, timeout_s=5)
    trainer = PipelineTrainer(copy.deepcopy(model), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
                              loss_fn=mse, schedule=schedule, transport=hub.transport(1), rank=1)
    x, y = batches(1)[0]
    with pytest.raises(TrainingError, match="stage 1 recomputes its forward, so it cannot split its backward"):
        trainer.step(x, y)
