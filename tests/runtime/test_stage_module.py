"""Stage split equivalence: the stage modules run in order compute the whole model, gradients included."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphpipe.errors import TrainingError
from graphpipe.graph.tracer import trace_module
from graphpipe.runtime.stage_module import MODEL_OUTPUT, split_stages
from tests.runtime.helpers import Branches, Chain, TwoInputs, by_target, plan_from


def _cases() -> list[tuple[str, nn.Module, object, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    tokens = torch.randint(0, 11, (6, 5))
    return [
        ("chain", Chain(), plan_from(Chain(), by_target([("layers.0", 0), ("layers.2", 1), ("head", 2)]),
                                     [(0,), (1,), (2,)], micro_batch_size=2, global_batch_size=6), (x,)),
        ("branches", Branches(), plan_from(Branches(), by_target([("stem", 0), ("towers.0", 1), ("towers.1", 2),
                                                                  ("towers.2", 2), ("cat", 3)]),
                                           [(0,), (1,), (2,), (3,)], micro_batch_size=2, global_batch_size=6), (x,)),
        ("two_inputs", TwoInputs(), plan_from(TwoInputs(), by_target([("emb", 0), ("a", 1), ("add", 2)]),
                                              [(0,), (1,), (2,)], micro_batch_size=2, global_batch_size=6),
         (tokens, x)),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_stages_in_order_equal_the_whole_model(case: tuple) -> None:
    _, model, plan, inputs = case
    gm = trace_module(model)
    stages = split_stages(gm, plan)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    data = dict(zip(names, inputs))
    values: dict[str, torch.Tensor] = {}
    output = None
    for stage in stages:
        received = {name: values[name] for name in stage.spec.inputs}
        result = stage(data, received)
        values.update({k: v for k, v in result.items() if k != MODEL_OUTPUT})
        if stage.spec.is_sink:
            output = result[MODEL_OUTPUT]
    expected = model(*inputs)
    assert output is not None
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    output.square().sum().backward()
    split_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model(*inputs).square().sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(split_grads[name], param.grad, msg=f"gradient of {name}")


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_every_parameter_lives_in_exactly_one_stage(case: tuple) -> None:
    _, model, plan, _ = case
    stages = split_stages(trace_module(model), plan)
    owned = [name for stage in stages for name, _ in stage.named_parameters()]
    assert sorted(owned) == sorted(name for name, _ in model.named_parameters())
    assert len(owned) == len(set(owned))


def test_values_crossing_to_several_stages_are_sent_to_each() -> None:
    _, model, plan, _ = _cases()[1]
    specs = [stage.spec for stage in split_stages(trace_module(model), plan)]
    assert specs[0].sends == {1: ("relu",), 2: ("relu",)}
    assert specs[3].recvs.keys() == {1, 2}
    assert specs[3].is_sink and not specs[0].is_sink
    assert all(name.startswith("towers_") for name in specs[3].inputs)


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(torch.relu(self.layer(x)))


def test_a_module_called_by_two_stages_is_held_by_both() -> None:
    model = Shared()
    plan = plan_from(model, lambda n: 0 if n.name in ("layer",) else 1, [(0,), (1,)], micro_batch_size=2,
                     global_batch_size=4)
    specs = [stage.spec for stage in split_stages(trace_module(model), plan)]
    assert [spec.shared_params for spec in specs] == [("layer.weight", "layer.bias")] * 2


def test_a_plan_missing_ops_is_refused() -> None:
    model = Chain()
    plan = plan_from(Chain(depth=2), lambda n: 0, [(0,)], micro_batch_size=2, global_batch_size=4)
    with pytest.raises(TrainingError, match="in no stage"):
        split_stages(trace_module(model), plan)


def test_a_mask_filled_in_place_is_filled_in_every_stage_that_reads_it() -> None:
    """The fill has no reader, so nothing but its write says that the second stage needs it."""
    from graphpipe.graph.capture import capture_module
    from graphpipe.stages.stage_graph import Plan, Stage, StageEdge
    from tests.graph.test_mutation import FilledMask

    torch.manual_seed(0)
    model, x = FilledMask(), torch.randn(6, 4)
    captured = capture_module(model, (x,))
    graph = captured.graph
    assert graph is not None
    second = {"b_weight", "b_bias", "linear_1", "mul_1", "output"}  # b and what follows it
    stages = tuple(Stage(idx=idx, ops=tuple(op.name for op in graph.ops if (op.name in second) == bool(idx)),
                         ranks=(idx,), micro_batch_size=6, in_flight_samples=6) for idx in range(2))
    plan = Plan(graph_name="FilledMask", stages=stages, global_batch_size=6, num_devices=2, planner="manual",
                edges=(StageEdge(src=0, dst=1, tensors=("mul",), bytes_per_sample=16.0),),
                replicated=tuple(op.name for op in graph.ops if op.replicated))
    first, last = split_stages(captured, plan)
    sent = first({"x": x}, {})
    output = last({"x": x}, {"mul": sent["mul"]})[MODEL_OUTPUT]
    torch.testing.assert_close(output, model(x), rtol=0, atol=0)
