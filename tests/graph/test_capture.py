"""Capture: torch.fx tracing plus shape propagation into an OpGraph."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from graphpipe.errors import GraphCaptureError
from graphpipe.graph.capture import capture, trace_module
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.prune import prune_graph
from graphpipe.graph.tensor_meta import TensorMeta


class TwoInTwoOut(nn.Module):
    """Two inputs, two outputs, a BatchNorm (buffers) and an attention leaf with a tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.norm = nn.BatchNorm1d(8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.proj = nn.Linear(8, 3, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.norm(self.fc(x)))
        seq = h.unsqueeze(1)
        attended, _ = self.attn(seq, seq, seq)
        return torch.cat([self.proj(attended.squeeze(1)), y], dim=1), h


class Tied(nn.Module):
    """One Linear called twice and a second module sharing its weight tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)
        self.second.weight = self.first.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(self.first(x)))


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


class WithGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = DataDependent()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.fc(x))


def example() -> tuple[TwoInTwoOut, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return TwoInTwoOut(), (torch.randn(5, 4), torch.randn(5, 2))


def test_ops_follow_the_fx_nodes_in_topological_order() -> None:
    model, inputs = example()
    graph = capture(model, inputs)
    assert graph.names == tuple(node.name for node in prune_graph(trace_module(model)).graph.nodes)
    assert graph.inputs == ("x", "y")
    assert graph.example_batch_size == 5
    assert graph.op("fc").kind == "call_module" and graph.op("fc").module_path == "fc"
    assert graph.op("fc").module_type == "Linear"
    assert graph.op("relu").kind == "call_function" and graph.op("relu").module_type == "relu"
    assert graph.op("unsqueeze").kind == "call_method" and graph.op("unsqueeze").module_type == "unsqueeze"
    assert graph.op("cat").inputs == ("proj", "y")


def test_outputs_are_shapes_of_the_example_batch() -> None:
    model, inputs = example()
    graph = capture(model, inputs)
    assert graph.op("fc").outputs == (TensorMeta(shape=(5, 8)),)
    assert graph.op("attn").outputs[0] == TensorMeta(shape=(5, 1, 8))  # the tuple flattens
    assert len(graph.op("attn").outputs) == 2  # (output, averaged attention weights)
    assert graph.op("cat").outputs == (TensorMeta(shape=(5, 5)),)
    assert graph.op("x").outputs == (TensorMeta(shape=(5, 4)),)


def test_multi_output_model_feeds_every_output_tensor_to_the_output_op() -> None:
    model, inputs = example()
    graph = capture(model, inputs)
    output = graph.op(graph.output)
    assert output.kind == "output" and graph.ops[-1] is output
    assert output.inputs == ("cat", "relu")
    assert [meta.shape for meta in output.outputs] == [(5, 5), (5, 8)]


def test_attrs_feed_the_cost_model_and_are_json() -> None:
    model, inputs = example()
    graph = capture(model, inputs)
    assert graph.op("fc").attrs["in_features"] == 4 and graph.op("fc").attrs["out_features"] == 8
    assert graph.op("fc").attrs["bias"] is True and graph.op("proj").attrs["bias"] is False
    assert graph.op("attn").attrs["num_heads"] == 2 and graph.op("attn").attrs["embed_dim"] == 8
    assert graph.op("norm").attrs["num_features"] == 8
    assert graph.op("cat").attrs["dim"] == 1
    assert graph.op("cat").attrs["input_shapes"] == [[5, 3], [5, 2]]
    assert graph.op("fc").attrs["input_shapes"] == [[5, 4]]
    json.dumps(graph.to_dict())


def test_every_parameter_and_buffer_is_owned_once_under_its_model_name() -> None:
    model, inputs = example()
    graph = capture(model, inputs)
    expected = dict(model.named_parameters()) | dict(model.named_buffers())
    assert sorted(graph.param_names) == sorted(expected)
    assert graph.param_bytes == sum(t.numel() * t.element_size() for t in expected.values())
    owners = {param.name: op.name for op in graph for param in op.params}
    assert owners["norm.running_mean"] == "norm" and owners["attn.out_proj.weight"] == "attn"
    buffers = {param.name for op in graph for param in op.params if param.is_buffer}
    assert buffers == set(dict(model.named_buffers()))


def test_shared_parameter_is_owned_by_its_first_user_and_listed_as_shared() -> None:
    model = Tied()
    graph = capture(model, (torch.randn(3, 6),))
    assert graph.names[1:4] == ("first", "first_1", "second")
    refs = {param.name: (op.name, param) for op in graph for param in op.params}
    assert set(refs) == {"first.weight", "first.bias", "second.bias"}
    owner, weight = refs["first.weight"]
    assert owner == "first" and weight.shared_with == ("first_1", "second")
    assert refs["first.bias"][1].shared_with == ("first_1",)
    assert graph.param_bytes == sum(p.numel() * 4 for p in model.parameters())


class Spare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(3, 3)
        self.spare = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_unused_parameters_are_still_covered() -> None:
    graph = capture(Spare(), (torch.randn(2, 3),))
    output = graph.op(graph.output)
    assert {param.name for param in output.params} == {"spare.weight", "spare.bias"}


def test_json_round_trip_is_equal() -> None:
    model, inputs = example()
    graph = capture(model, inputs)
    again = OpGraph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert again.to_dict() == graph.to_dict()
    assert again.ops == graph.ops


def test_meta_model_captures_the_same_graph_without_data() -> None:
    model, inputs = example()
    on_cpu = capture(model, inputs)
    on_meta = capture(model.to("meta"), inputs)
    assert on_meta.to_dict() == on_cpu.to_dict()


def test_capture_does_not_touch_buffers() -> None:
    model, inputs = example()
    before = {name: buf.clone() for name, buf in model.named_buffers()}
    capture(model, inputs)
    for name, buf in model.named_buffers():
        assert torch.equal(buf, before[name]), name


def test_untraceable_module_is_named_with_the_line_and_the_leaf_hint() -> None:
    with pytest.raises(GraphCaptureError) as info:
        capture(WithGate(), (torch.randn(2, 4),))
    message = str(info.value)
    assert "'gate' (DataDependent)" in message
    assert "if x.sum() > 0:" in message and "test_capture.py" in message
    assert "leaf_modules=['gate']" in message


def test_untraceable_module_passes_as_a_leaf_by_name_or_type() -> None:
    inputs = (torch.randn(2, 4),)
    by_name = capture(WithGate(), inputs, leaf_modules=["gate"])
    by_type = capture(WithGate(), inputs, leaf_modules=[DataDependent])
    assert by_name.op("gate").module_type == "DataDependent"
    assert by_name.to_dict() == by_type.to_dict()


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TwoInTwoOut()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        first, second = self.inner(x, y)
        return first.sum(1) + second.sum(1)


def test_extra_leaf_by_class_name_keeps_a_block_whole() -> None:
    _, inputs = example()
    model = Outer()
    graph = capture(model, inputs, leaf_modules=["TwoInTwoOut"])
    assert [op.module_type for op in graph if op.kind == "call_module"] == ["TwoInTwoOut"]
    assert graph.op("inner").outputs == (TensorMeta(shape=(5, 5)), TensorMeta(shape=(5, 8)))
    assert graph.param_bytes == sum(
        t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def test_unknown_leaf_name_is_a_capture_error() -> None:
    model, inputs = example()
    with pytest.raises(GraphCaptureError, match="'encoder'"):
        capture(model, inputs, leaf_modules=["encoder"])


class VarArgs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.stack(inputs).sum(0))


def test_varargs_forward_gets_one_placeholder_per_input() -> None:
    inputs = (torch.randn(3, 2), torch.randn(3, 2), torch.randn(3, 2))
    graph = capture(VarArgs(), inputs)
    assert graph.inputs == ("input_0", "input_1", "input_2")
    with pytest.raises(GraphCaptureError, match="num_inputs"):
        trace_module(VarArgs())
    model = VarArgs()
    model.num_inputs = 3
    gm = trace_module(model)
    assert torch.allclose(gm(*inputs), model(*inputs))


def test_first_input_must_be_batched() -> None:
    with pytest.raises(GraphCaptureError, match="batch"):
        capture(nn.Linear(2, 2), (torch.tensor(1.0),))
