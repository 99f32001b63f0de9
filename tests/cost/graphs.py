"""Hand-built op graphs for the cost tests (no tracing needed)."""

from __future__ import annotations

from typing import Any

from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef
from graphpipe.graph.tensor_meta import TensorMeta


def meta(*shape: int, dtype: str = "float32") -> TensorMeta:
    return TensorMeta(shape=tuple(shape), dtype=dtype)


def linear_op(name: str, src: str, rows: int, in_f: int, out_f: int, *, lead: tuple[int, ...] = ()) -> OpNode:
    shape_in = (rows, *lead, in_f)
    return OpNode(name=name, kind="call_module", target=name, inputs=(src,), module_path=name, module_type="Linear",
                  outputs=(meta(rows, *lead, out_f),),
                  params=(ParamRef(name=f"{name}.weight", num_bytes=4 * in_f * out_f, shape=(out_f, in_f)),
                          ParamRef(name=f"{name}.bias", num_bytes=4 * out_f, shape=(out_f,))),
                  attrs={"in_features": in_f, "out_features": out_f, "bias": True, "input_shapes": [list(shape_in)]})


def unary_op(name: str, src: str, module_type: str, shape: tuple[int, ...], *, kind: str = "call_function",
             params: tuple[ParamRef, ...] = (), attrs: dict[str, Any] | None = None) -> OpNode:
    return OpNode(name=name, kind=kind, target=module_type, inputs=(src,), module_type=module_type,
                  outputs=(meta(*shape),), params=params, attrs={"input_shapes": [list(shape)], **(attrs or {})})


def mlp_graph(batch: int = 8, width: int = 64, hidden: int = 256) -> OpGraph:
    """x -> fc1 -> gelu -> fc2 -> add(x) -> layer norm -> output: a residual MLP block."""
    ops = (
        OpNode(name="x", kind="placeholder", target="x", outputs=(meta(batch, width),)),
        linear_op("fc1", "x", batch, width, hidden),
        unary_op("gelu", "fc1", "GELU", (batch, hidden), kind="call_module"),
        linear_op("fc2", "gelu", batch, hidden, width),
        OpNode(name="add", kind="call_function", target="add", inputs=("fc2", "x"), module_type="add",
               outputs=(meta(batch, width),), attrs={"input_shapes": [[batch, width], [batch, width]]}),
        unary_op("norm", "add", "LayerNorm", (batch, width), kind="call_module",
                 params=(ParamRef(name="norm.weight", num_bytes=4 * width),
                         ParamRef(name="norm.bias", num_bytes=4 * width)),
                 attrs={"normalized_shape": [width]}),
        OpNode(name="output", kind="output", target="output", inputs=("norm",), outputs=(meta(batch, width),)),
    )
    return OpGraph(name="mlp", ops=ops, example_batch_size=batch)


def mixed_graph(batch: int = 4, seq: int = 32, embed: int = 64, heads: int = 4) -> OpGraph:
    """Attention, an embedding bag, a matmul, a concat and a view: one of each cost rule."""
    bag, rows, dim = 10, 1000, embed
    ops = (
        OpNode(name="tokens", kind="placeholder", target="tokens", outputs=(meta(batch, seq, embed),)),
        OpNode(name="ids", kind="placeholder", target="ids", outputs=(meta(batch, bag, dtype="int64"),)),
        OpNode(name="attn", kind="call_module", target="attn", inputs=("tokens", "tokens", "tokens"),
               module_type="MultiheadAttention",
               outputs=(meta(batch, seq, embed), meta(batch, seq, seq)),
               params=(ParamRef(name="attn.in_proj_weight", num_bytes=4 * 3 * embed * embed),
                       ParamRef(name="attn.out_proj.weight", num_bytes=4 * embed * embed)),
               attrs={"embed_dim": embed, "num_heads": heads, "batch_first": True,
                      "input_shapes": [[batch, seq, embed]] * 3}),
        OpNode(name="getitem", kind="call_function", target="getitem", inputs=("attn",), module_type="getitem",
               outputs=(meta(batch, seq, embed),), attrs={"input_shapes": []}),
        OpNode(name="scores", kind="call_function", target="matmul", inputs=("getitem", "getitem"),
               module_type="matmul", outputs=(meta(batch, seq, seq),),
               attrs={"input_shapes": [[batch, seq, embed], [batch, embed, seq]]}),
        OpNode(name="pool", kind="call_method", target="mean", inputs=("scores",), module_type="mean",
               outputs=(meta(batch, seq),), attrs={"input_shapes": [[batch, seq, seq]]}),
        OpNode(name="bag", kind="call_module", target="bag", inputs=("ids",), module_type="EmbeddingBag",
               outputs=(meta(batch, dim),), params=(ParamRef(name="bag.weight", num_bytes=4 * rows * dim),),
               attrs={"num_embeddings": rows, "embedding_dim": dim, "mode": "sum", "input_shapes": [[batch, bag]]}),
        OpNode(name="cat", kind="call_function", target="cat", inputs=("pool", "bag"), module_type="cat",
               outputs=(meta(batch, seq + dim),), attrs={"input_shapes": [[batch, seq], [batch, dim]]}),
        OpNode(name="flat", kind="call_method", target="view", inputs=("cat",), module_type="view",
               outputs=(meta(batch, seq + dim),), attrs={"input_shapes": [[batch, seq + dim]]}),
        linear_op("head", "flat", batch, seq + dim, 8),
        OpNode(name="output", kind="output", target="output", inputs=("head",), outputs=(meta(batch, 8),)),
    )
    return OpGraph(name="mixed", ops=ops, example_batch_size=batch)
