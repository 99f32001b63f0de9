"""The JSON-serialisable attributes of an op that the analytic cost model reads."""

from __future__ import annotations

from typing import Any

import torch.fx
from torch import nn

_MODULE_FIELDS: tuple[tuple[type[nn.Module], tuple[str, ...]], ...] = (
    (nn.Linear, ("in_features", "out_features")),
    (nn.Bilinear, ("in1_features", "in2_features", "out_features")),
    (nn.modules.conv._ConvNd, ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
                               "groups", "transposed")),
    (nn.EmbeddingBag, ("num_embeddings", "embedding_dim", "mode")),
    (nn.Embedding, ("num_embeddings", "embedding_dim")),
    (nn.MultiheadAttention, ("embed_dim", "num_heads", "batch_first", "kdim", "vdim")),
    (nn.LayerNorm, ("normalized_shape", "elementwise_affine")),
    (nn.modules.batchnorm._BatchNorm, ("num_features", "affine")),
    (nn.GroupNorm, ("num_groups", "num_channels", "affine")),
    (nn.RNNBase, ("mode", "input_size", "hidden_size", "num_layers", "bidirectional")),
)


def module_attrs(module: nn.Module) -> dict[str, Any]:
    """Layer hyper-parameters (e.g. in/out features of a Linear); empty for layers that need none."""
    for module_type, fields in _MODULE_FIELDS:
        if isinstance(module, module_type):
            attrs = {field: _jsonable(getattr(module, field)) for field in fields}
            if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd, nn.Bilinear)):
                attrs["bias"] = module.bias is not None
            return attrs
    return {}


def call_attrs(node: torch.fx.Node) -> dict[str, Any]:
    """Constant arguments of a function or method call: positional ones in `args` (inputs as "%name"),
    and scalar keyword arguments under their own names (e.g. `dim` of cat)."""
    attrs: dict[str, Any] = {"args": [_jsonable(arg) for arg in node.args]}
    for key, value in node.kwargs.items():
        attrs[key] = _jsonable(value)
    return attrs


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, (tuple, list)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return repr(value)
