"""FLOPs, traffic and saved bytes from shapes, one rule per op family."""

from __future__ import annotations

import pytest

from graphpipe.cost.flops import op_flops, op_memory_traffic_bytes, op_work
from graphpipe.graph.op_graph import OpNode, ParamRef
from tests.cost.graphs import linear_op, meta, mixed_graph, unary_op


def test_linear_forward_is_two_batch_in_out_exactly() -> None:
    assert op_flops(linear_op("fc", "x", 8, 64, 256)) == 2 * 8 * 64 * 256
    # leading dims (batch, sequence) multiply into the GEMM rows
    assert op_flops(linear_op("fc", "x", 8, 64, 256, lead=(16,))) == 2 * 8 * 16 * 64 * 256


def test_linear_traffic_is_input_output_and_weights() -> None:
    op = linear_op("fc", "x", 8, 64, 256)
    assert op_memory_traffic_bytes(op) == 4 * (8 * 64 + 8 * 256) + op.param_bytes
    work = op_work(op)
    assert work.saved_bytes == 4 * 8 * 64 and work.bwd_flops_factor == 2.0


def test_functional_linear_reads_sizes_from_the_weight_shape() -> None:
    op = OpNode(name="lin", kind="call_function", target="torch._C._nn.linear", inputs=("x", "w"),
                module_type="linear", outputs=(meta(4, 10),), attrs={"input_shapes": [[4, 6], [10, 6]]})
    assert op_flops(op) == 2 * 4 * 6 * 10


def test_conv2d_counts_each_output_element() -> None:
    op = OpNode(name="conv", kind="call_module", target="conv", inputs=("x",), module_type="Conv2d",
                outputs=(meta(2, 16, 8, 8),),
                params=(ParamRef(name="conv.weight", num_bytes=4 * 16 * 3 * 9),),
                attrs={"in_channels": 3, "out_channels": 16, "kernel_size": [3, 3], "groups": 1, "bias": False,
                       "input_shapes": [[2, 3, 8, 8]]})
    assert op_flops(op) == 2 * (2 * 16 * 8 * 8) * 3 * 9


def test_attention_matmul_and_embedding_bag() -> None:
    graph = mixed_graph(batch=4, seq=32, embed=64, heads=4)
    b, s, e = 4, 32, 64
    attn = op_work(graph.op("attn"))
    assert attn.matmul_flops == 2 * b * s * e * e * 4 + 2 * 2 * b * s * s * e  # Q, K, V, out projections + core
    assert op_flops(graph.op("scores")) == 2 * b * s * s * e
    bag = op_work(graph.op("bag"))
    assert bag.matmul_flops == 0 and bag.other_flops == 4 * 10 * 64  # one add per gathered element
    assert bag.param_traffic_bytes == 0  # only the gathered rows are read, not the whole table
    assert bag.act_traffic_bytes >= 4 * 10 * 64 * 4


def test_scaled_dot_product_attention_is_fused() -> None:
    op = OpNode(name="sdpa", kind="call_function", target="scaled_dot_product_attention", inputs=("q", "k", "v"),
                module_type="scaled_dot_product_attention", outputs=(meta(2, 4, 16, 8),),
                attrs={"input_shapes": [[2, 4, 16, 8]] * 3})
    work = op_work(op)
    assert work.matmul_flops == 2 * (2 * 4) * 16 * 16 * (8 + 8)
    assert work.act_traffic_bytes == 4 * 4 * (2 * 4 * 16 * 8)  # q, k, v, out: no L x L matrix in memory


def test_views_and_structural_ops_are_free_copies_are_not() -> None:
    graph = mixed_graph()
    for name in ("tokens", "getitem", "flat", "output"):
        work = op_work(graph.op(name))
        assert work.flops == 0 and work.traffic_bytes == 0 and work.fwd_kernels == 0
    cat = op_work(graph.op("cat"))
    assert cat.flops == 0 and cat.traffic_bytes == 2 * graph.op("cat").output_bytes and cat.fwd_kernels == 1


@pytest.mark.parametrize(("kind", "flops_per_element", "saves"), [
    ("relu", 1.0, "output"), ("GELU", 8.0, "input"), ("add", 1.0, "nothing"), ("LayerNorm", 8.0, "input")])
def test_elementwise_rules(kind: str, flops_per_element: float, saves: str) -> None:
    op = unary_op("u", "x", kind, (4, 32))
    work = op_work(op)
    assert work.flops == flops_per_element * 4 * 32
    assert work.traffic_bytes == 2 * 4 * 4 * 32 and work.bwd_flops_factor == 1.0
    assert work.saved_bytes == {"output": 4 * 4 * 32, "input": 4 * 4 * 32, "nothing": 0}[saves]


def test_scaling_by_a_constant_saves_nothing_but_a_product_saves_both() -> None:
    scale = unary_op("m", "x", "mul", (4, 8))
    assert op_work(scale).saved_bytes == 0
    product = OpNode(name="p", kind="call_function", target="mul", inputs=("x", "y"), module_type="mul",
                     outputs=(meta(4, 8),), attrs={"input_shapes": [[4, 8], [4, 8]]})
    assert op_work(product).saved_bytes == 2 * 4 * 4 * 8


def test_lstm_counts_four_gate_gemms_per_token_and_layer() -> None:
    op = OpNode(name="rnn", kind="call_module", target="rnn", inputs=("x",), module_type="LSTM",
                outputs=(meta(4, 5, 16), meta(2, 4, 16), meta(2, 4, 16)),
                attrs={"mode": "LSTM", "input_size": 8, "hidden_size": 16, "num_layers": 2, "bidirectional": False,
                       "input_shapes": [[4, 5, 8]]})
    tokens = 4 * 5
    assert op_work(op).matmul_flops == 2 * tokens * 4 * 16 * ((8 + 16) + (16 + 16))


def test_an_exported_embedding_costs_its_indices_not_its_table() -> None:
    """torch.export records `aten.embedding(weight, indices)`, weight first: the work is the same gather as the
    module's, not a gather of the whole table per element."""
    import torch
    from torch import nn

    from graphpipe.graph.capture import capture

    class Lookup(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table, self.bag = nn.Embedding(1000, 16), nn.EmbeddingBag(1000, 16, mode="sum")

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.table(x).sum(1) + self.bag(y)

    inputs = (torch.randint(0, 1000, (8, 5)), torch.randint(0, 1000, (8, 3)))
    work = {}
    for method in ("fx", "export"):
        graph = capture(Lookup(), inputs, capture=method)
        work[method] = sorted(op_work(op).act_traffic_bytes for op in graph.ops
                              if "mbed" in (op.module_type or op.target))
    assert len(work["export"]) == 2 and work["export"] == pytest.approx(work["fx"], rel=0.1)
