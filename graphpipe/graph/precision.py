"""The op graph as mixed precision runs it, so that costs follow the dtype training uses.

Under `torch.autocast(dtype=torch.bfloat16)` the activations that stages keep and send are
half the size of the float32 ones capture recorded, while the weights, their gradients and the
optimizer state stay float32. The graph is rewritten accordingly: every float32 value an op
produces becomes `dtype`, except parameter reads. (Autocast keeps a few ops, such as softmax
and norms, in float32; counting them at the lower precision makes the estimate slightly low.)
"""

from __future__ import annotations

from dataclasses import replace

from graphpipe.errors import GraphValidationError
from graphpipe.graph.op_graph import OpGraph, OpNode

__all__ = ["LOW_PRECISION", "with_activation_dtype"]

LOW_PRECISION = ("bfloat16", "float16")


def with_activation_dtype(graph: OpGraph, dtype: str) -> OpGraph:
    """`graph` with its float32 activations in `dtype` ("float32" returns it unchanged)."""
    if dtype == "float32":
        return graph
    if dtype not in LOW_PRECISION:
        raise GraphValidationError(f"activation dtype {dtype!r} is not one of float32, {', '.join(LOW_PRECISION)}")
    ops = tuple(op if op.kind == "get_attr" else _lowered(op, dtype) for op in graph.ops)
    return replace(graph, ops=ops)


def _lowered(op: OpNode, dtype: str) -> OpNode:
    if not any(meta.dtype == "float32" for meta in op.outputs):
        return op
    outputs = tuple(replace(meta, dtype=dtype) if meta.dtype == "float32" else meta for meta in op.outputs)
    return replace(op, outputs=outputs)

