"""FLOPs, memory traffic and kernel counts of one op, from the shapes captured with it.

Everything is for the op's forward pass on the graph's example batch. The analytic cost
model scales the batch-dependent parts per sample; the parameter traffic is per call.

Backward rule: an op that multiplies two operands (weights or two activations: linear,
conv, matmul, attention) computes two gradients, so its backward costs 2x the forward
FLOPs; every other op (elementwise, norms, reductions, gathers) costs 1x. Backward moves
twice the forward's activation traffic (read the output gradient and the saved tensors,
write the input gradient) plus, for ops with weights, a read of the weights and a write
of their gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphpipe.graph.op_graph import OpNode
from graphpipe.graph.tensor_meta import DTYPE_BYTES

# Ops that only re-label memory (views, metadata, tuple access): no kernel, no traffic, no time.
FREE_OPS = frozenset({
    "getitem", "getattr", "view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "unsqueeze",
    "squeeze", "expand", "expand_as", "view_as", "size", "dim", "chunk", "split", "unbind", "narrow", "select",
    "Identity", "Flatten", "Unflatten", "detach", "type_as", "float", "to", "numel", "shape", "movedim",
})
# Ops that copy their inputs into a new tensor: one kernel, read + write, no arithmetic.
COPY_OPS = frozenset({"cat", "concat", "stack", "contiguous", "clone", "repeat", "pad", "roll", "index_select",
                      "gather", "masked_select", "tile"})
# Elementwise ops worth more than one FLOP per element (transcendentals, normalisations).
FLOPS_PER_ELEMENT: dict[str, float] = {
    "GELU": 8.0, "gelu": 8.0, "SiLU": 4.0, "silu": 4.0, "Tanh": 4.0, "tanh": 4.0, "Sigmoid": 4.0, "sigmoid": 4.0,
    "Softmax": 5.0, "softmax": 5.0, "LogSoftmax": 6.0, "log_softmax": 6.0, "exp": 4.0, "log": 4.0,
    "Mish": 8.0, "Softplus": 6.0, "ELU": 4.0, "LayerNorm": 8.0, "layer_norm": 8.0, "RMSNorm": 6.0,
    "BatchNorm1d": 8.0, "BatchNorm2d": 8.0, "BatchNorm3d": 8.0, "GroupNorm": 8.0, "InstanceNorm2d": 8.0,
    "batch_norm": 8.0, "group_norm": 8.0, "Dropout": 2.0, "dropout": 2.0, "cross_entropy": 6.0,
    "mse_loss": 3.0, "CrossEntropyLoss": 6.0, "MSELoss": 3.0,
}
# Ops whose backward keeps their output (not their input): activations computed from the output.
SAVES_OUTPUT = frozenset({"ReLU", "relu", "Sigmoid", "sigmoid", "Tanh", "tanh", "Softmax", "softmax",
                          "LogSoftmax", "log_softmax", "exp", "ReLU6", "relu6"})
# Ops whose backward needs no saved activation (linear in their inputs, index-free).
SAVES_NOTHING = frozenset({"add", "sub", "neg", "iadd", "isub", "sum", "mean", "cat", "concat", "stack",
                           "contiguous", "clone", "repeat", "pad", "tile", "Dropout", "dropout"})
SCALABLE = frozenset({"mul", "truediv", "div", "imul", "itruediv"})
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}  # GEMMs per step: one per gate
EMBEDDING_OPS = frozenset({"Embedding", "EmbeddingBag", "embedding", "embedding_bag"})
NORM_PREFIXES = ("LayerNorm", "BatchNorm", "GroupNorm", "InstanceNorm", "RMSNorm", "LocalResponseNorm")
INDEX_DTYPE_BYTES = 8  # embedding indices are int64


@dataclass(frozen=True, slots=True, kw_only=True)
class OpWork:
    """What one forward call of an op does on the example batch.

    `matmul_flops` run on the tensor cores (at `peak_tflops`, less for few `matmul_rows`);
    `other_flops` on the vector units. `act_traffic_bytes` and `saved_bytes` grow with the
    batch; `param_traffic_bytes` does not. `contracts` says the op multiplies two operands.
    """

    matmul_flops: float = 0.0
    other_flops: float = 0.0
    matmul_rows: float = 0.0  # rows (M) of the op's GEMMs on the example batch
    act_traffic_bytes: float = 0.0
    param_traffic_bytes: float = 0.0
    saved_bytes: float = 0.0  # activations kept for backward (see `saved_activation_bytes`)
    fwd_kernels: int = 0
    bwd_kernels: int = 0
    contracts: bool = False
    has_params: bool = False

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.other_flops

    @property
    def traffic_bytes(self) -> float:
        return self.act_traffic_bytes + self.param_traffic_bytes

    @property
    def bwd_flops_factor(self) -> float:
        return 2.0 if self.contracts or self.has_params else 1.0


def trainable_param_bytes(op: OpNode) -> int:
    """Bytes of the op's parameters that get gradients (buffers such as BatchNorm statistics excluded)."""
    return sum(param.num_bytes for param in op.params if not param.is_buffer)


def op_flops(op: OpNode) -> float:
    """Forward FLOPs of `op` on the graph's example batch (a multiply-add counts 2)."""
    return op_work(op).flops


def op_memory_traffic_bytes(op: OpNode) -> float:
    """Bytes the forward reads and writes on the example batch (activations plus weights)."""
    return op_work(op).traffic_bytes


def op_work(op: OpNode) -> OpWork:
    """FLOPs, traffic, saved bytes and kernel counts of `op`'s forward on the example batch."""
    kind = op.module_type or op.target.rsplit(".", 1)[-1]
    if op.kind in ("placeholder", "output", "get_attr") or kind in FREE_OPS:
        return OpWork()
    shapes = input_shapes(op)
    if not shapes and not op.outputs:  # arithmetic on Python numbers (sizes, scales)
        return OpWork()
    if kind in ("Linear", "linear"):
        return _linear(op, shapes)
    if kind.startswith("Conv") or kind.startswith("conv"):
        return _conv(op, shapes)
    if kind in ("matmul", "bmm", "mm", "baddbmm", "addmm", "einsum", "Bilinear"):
        return _matmul(op, shapes)
    if kind == "MultiheadAttention":
        return _multihead_attention(op, shapes)
    if kind == "scaled_dot_product_attention":
        return _sdpa(op, shapes)
    if kind in EMBEDDING_OPS:
        return _embedding(op, shapes)
    if kind in RNN_GATES:
        return _recurrent(op, shapes, RNN_GATES[kind])
    if kind in COPY_OPS:
        out = _output_bytes(op)
        return OpWork(act_traffic_bytes=2.0 * out, fwd_kernels=1, bwd_kernels=1)
    return _elementwise(op, shapes, kind)


def input_shapes(op: OpNode) -> tuple[tuple[int, ...], ...]:
    """The shapes of the op's tensor inputs, as capture recorded them in `attrs["input_shapes"]`."""
    raw = op.attrs.get("input_shapes", ()) or ()
    return tuple(tuple(int(dim) for dim in shape) for shape in raw if _is_shape(shape))


def _is_shape(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(dim, int) for dim in value)


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _elem_bytes(op: OpNode) -> int:
    for meta in op.outputs:
        if meta.dtype.startswith(("float", "bfloat")):
            return DTYPE_BYTES.get(meta.dtype, 4)
    return 4


def _output_bytes(op: OpNode) -> float:
    return float(sum(meta.num_bytes for meta in op.outputs))


def _output_numel(op: OpNode) -> int:
    return sum(meta.numel for meta in op.outputs)


def _inputs_bytes(op: OpNode, shapes: Sequence[Sequence[int]]) -> float:
    return float(sum(_numel(shape) for shape in shapes) * _elem_bytes(op))


def _linear(op: OpNode, shapes: Sequence[Sequence[int]]) -> OpWork:
    x_shape = shapes[0] if shapes else op.outputs[0].shape
    if op.kind == "call_module":
        in_f, out_f = int(op.attrs["in_features"]), int(op.attrs["out_features"])
    else:  # F.linear(x, weight[, bias]): weight is (out, in)
        out_f, in_f = shapes[1][0], shapes[1][1]
    rows = _numel(x_shape[:-1])
    ebytes = _elem_bytes(op)
    x_bytes = rows * in_f * ebytes
    return OpWork(matmul_flops=2.0 * rows * in_f * out_f, matmul_rows=rows,
                  act_traffic_bytes=float(x_bytes + rows * out_f * ebytes),
                  param_traffic_bytes=float(op.param_bytes or (in_f * out_f * ebytes)),
                  saved_bytes=float(x_bytes), fwd_kernels=1, bwd_kernels=3 if op.attrs.get("bias", True) else 2,
                  contracts=True, has_params=True)


def _conv(op: OpNode, shapes: Sequence[Sequence[int]]) -> OpWork:
    """Each output (input, for a transposed conv) element costs (in_channels / groups) x kernel MACs."""
    if op.kind == "call_module":
        in_c, out_c = int(op.attrs["in_channels"]), int(op.attrs["out_channels"])
        groups = max(int(op.attrs.get("groups", 1)), 1)
        kernel = op.attrs.get("kernel_size", (1,))
        kernel_numel = _numel(kernel) if isinstance(kernel, (list, tuple)) else int(kernel)
    else:  # F.conv*d(x, weight): weight is (out, in / groups, *kernel)
        out_c, in_c, groups, kernel_numel = shapes[1][0], shapes[1][1], 1, _numel(shapes[1][2:])
    out_numel = op.outputs[0].numel if op.outputs else 0
    if "transpose" in (op.module_type or op.target).lower():
        in_numel = _numel(shapes[0]) if shapes else out_numel
        flops = 2.0 * in_numel * (out_c // groups) * kernel_numel
    else:
        flops = 2.0 * out_numel * (in_c // groups if op.kind == "call_module" else in_c) * kernel_numel
    x_bytes = _inputs_bytes(op, shapes[:1])
    return OpWork(matmul_flops=flops, matmul_rows=out_numel / max(out_c, 1),
                  act_traffic_bytes=x_bytes + _output_bytes(op), param_traffic_bytes=float(op.param_bytes),
                  saved_bytes=x_bytes, fwd_kernels=2 if op.attrs.get("bias", True) else 1, bwd_kernels=3,
                  contracts=True, has_params=True)


def _matmul(op: OpNode, shapes: Sequence[Sequence[int]]) -> OpWork:
    kind = op.module_type or op.target
    operands = shapes[1:3] if kind in ("baddbmm", "addmm") else shapes[:2]
    out_numel = _output_numel(op)
    if len(operands) == 2 and operands[0] and operands[1]:
        inner = operands[0][-1]
        cols = operands[1][-1] if len(operands[1]) > 1 else 1
    else:  # einsum and friends: assume a square-ish contraction over the last output dimension
        inner = op.outputs[0].shape[-1] if op.outputs and op.outputs[0].shape else 1
        cols = inner
    in_bytes = _inputs_bytes(op, shapes)
    return OpWork(matmul_flops=2.0 * out_numel * inner, matmul_rows=out_numel / max(cols, 1),
                  act_traffic_bytes=in_bytes + _output_bytes(op), param_traffic_bytes=float(op.param_bytes),
                  saved_bytes=in_bytes, fwd_kernels=1, bwd_kernels=2, contracts=True,
                  has_params=trainable_param_bytes(op) > 0)


def _attention_dims(op: OpNode, shapes: Sequence[Sequence[int]]) -> tuple[int, int, int, int]:
    """(batch, query length, key length, embed dim) of a MultiheadAttention call."""
    embed = int(op.attrs["embed_dim"])
    query = shapes[0] if shapes else op.outputs[0].shape
    key = shapes[1] if len(shapes) > 1 and len(shapes[1]) == len(query) else query  # not a (N, S) mask
    if len(query) == 2:  # unbatched (L, E)
        return 1, query[0], key[0], embed
    if op.attrs.get("batch_first", False):
        return query[0], query[1], key[1], embed
    return query[1], query[0], key[0], embed


def _multihead_attention(op: OpNode, shapes: Sequence[Sequence[int]]) -> OpWork:
    batch, len_q, len_k, embed = _attention_dims(op, shapes)
    heads = int(op.attrs.get("num_heads", 1))
    ebytes = _elem_bytes(op)
    projections = 2.0 * batch * embed * embed * (2 * len_q + 2 * len_k)  # Q and out on L_q rows, K and V on L_k
    attention = 2.0 * 2.0 * batch * len_q * len_k * embed  # scores Q.K^T and probs.V
    scores_bytes = float(batch * heads * len_q * len_k * ebytes)
    io_bytes = float(batch * (2 * len_q + 2 * len_k) * embed * ebytes)  # q, k, v in; output
    qkv_bytes = float(batch * (len_q + 2 * len_k) * embed * ebytes)
    # Kept for backward: each distinct input (self-attention passes one tensor three times), the
    # projected q, k, v, the attention probabilities, and the heads' output before out_proj.
    distinct_inputs = _inputs_bytes(op, shapes[:3]) or float(batch * len_q * embed * ebytes)
    saved = distinct_inputs + qkv_bytes + scores_bytes + batch * len_q * embed * ebytes
    return OpWork(matmul_flops=projections + attention, other_flops=5.0 * batch * heads * len_q * len_k,
                  matmul_rows=batch * len_q, act_traffic_bytes=io_bytes + 2 * qkv_bytes + 4 * scores_bytes,
                  param_traffic_bytes=float(op.param_bytes),
                  saved_bytes=saved, fwd_kernels=9, bwd_kernels=14,
                  contracts=True, has_params=True)


def _sdpa(op: OpNode, shapes: Sequence[Sequence[int]]) -> OpWork:
    query = shapes[0] if shapes else op.outputs[0].shape
    key = shapes[1] if len(shapes) > 1 else query
    value = shapes[2] if len(shapes) > 2 else key
    batch = _numel(query[:-2])
    len_q, len_k, dim, dim_v = query[-2], key[-2], query[-1], value[-1]
    flops = 2.0 * batch * len_q * len_k * (dim + dim_v)
    io_bytes = _inputs_bytes(op, shapes[:3]) + _output_bytes(op)
    # Fused (flash) attention: the L_q x L_k matrix never reaches memory.
    return OpWork(matmul_flops=flops, other_flops=5.0 * batch * len_q * len_k, matmul_rows=batch * len_q,
                  act_traffic_bytes=io_bytes, saved_bytes=io_bytes, fwd_kernels=1, bwd_kernels=2, contracts=True)


def _embedding(op: OpNode, shapes: Sequence[Sequence[int]]) -> OpWork:
    """Gathers of rows: memory bound; an EmbeddingBag also sums each bag (one add per element).

    The indices are the module's (and `F.embedding`'s) first input, but the second of an exported
    `aten.embedding(weight, indices)`: read as the first, the table itself would count as indices."""
    dim = int(op.attrs.get("embedding_dim", op.outputs[0].shape[-1] if op.outputs else 1))
    indices = shapes[1] if op.target.startswith("aten.") and len(shapes) > 1 else (shapes[0] if shapes else None)
    num_indices = _numel(indices) if indices is not None else _output_numel(op) // max(dim, 1)
    ebytes = _elem_bytes(op)
    gathered = float(num_indices * dim * ebytes)
    index_bytes = float(num_indices * INDEX_DTYPE_BYTES)
    bag = "bag" in (op.module_type or op.target).lower()
    return OpWork(other_flops=float(num_indices * dim) if bag else 0.0,
                  act_traffic_bytes=gathered + index_bytes + _output_bytes(op),
                  saved_bytes=index_bytes, fwd_kernels=2 if bag else 1, bwd_kernels=2, has_params=True)


def _recurrent(op: OpNode, shapes: Sequence[Sequence[int]], gates: int) -> OpWork:
    """Per token and layer, each gate multiplies (input + hidden) by hidden; cuDNN-style fused kernels."""
    input_size, hidden = int(op.attrs["input_size"]), int(op.attrs["hidden_size"])
    layers, directions = int(op.attrs.get("num_layers", 1)), 2 if op.attrs.get("bidirectional") else 1
    tokens = _numel(shapes[0]) // max(input_size, 1) if shapes else 0
    flops = 0.0
    for layer in range(layers):
        layer_input = input_size if layer == 0 else hidden * directions
        flops += 2.0 * tokens * gates * hidden * (layer_input + hidden) * directions
    x_bytes = _inputs_bytes(op, shapes[:1])
    gate_bytes = float(tokens * gates * hidden * layers * directions * _elem_bytes(op))
    return OpWork(matmul_flops=flops, other_flops=float(tokens * gates * hidden * layers * directions * 4),
                  matmul_rows=float(tokens), act_traffic_bytes=x_bytes + _output_bytes(op) + 2 * gate_bytes,
                  param_traffic_bytes=float(op.param_bytes), saved_bytes=x_bytes + gate_bytes,
                  fwd_kernels=2 * layers * directions, bwd_kernels=4 * layers * directions,
                  contracts=True, has_params=True)


def _elementwise(op: OpNode, shapes: Sequence[Sequence[int]], kind: str) -> OpWork:
    """Activations, norms, arithmetic, reductions and anything unknown: memory bound, one kernel."""
    numel = max([_output_numel(op), *(_numel(shape) for shape in shapes)])
    out_bytes = _output_bytes(op)
    in_bytes = _inputs_bytes(op, shapes)
    norm = kind.startswith(NORM_PREFIXES) or kind.endswith("_norm")
    if kind in SAVES_NOTHING or (kind in SCALABLE and len(shapes) < 2):
        saved = 0.0  # also x * 2, x / 3: a constant factor needs no saved tensor
    elif kind in SAVES_OUTPUT:
        saved = out_bytes
    else:
        saved = in_bytes
    if kind in ("Dropout", "dropout"):
        saved = float(numel)  # a one-byte mask per element
    return OpWork(other_flops=FLOPS_PER_ELEMENT.get(kind, 1.0) * numel,
                  act_traffic_bytes=in_bytes + out_bytes, param_traffic_bytes=float(op.param_bytes),
                  saved_bytes=saved, fwd_kernels=1, bwd_kernels=2 if norm else 1,
                  has_params=trainable_param_bytes(op) > 0)
