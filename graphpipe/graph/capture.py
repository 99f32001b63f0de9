"""Capture an nn.Module into an `OpGraph`: torch.fx tracing plus shape propagation.

A model whose weights live on the `meta` device is shape-propagated with meta tensors,
so the paper-sized models are captured without allocating their weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn

from graphpipe.errors import GraphCaptureError
from graphpipe.graph.op_attrs import call_attrs, module_attrs
from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef
from graphpipe.graph.param_owners import assign_params
from graphpipe.graph.shape_record import record_metas
from graphpipe.graph.tensor_meta import TensorMeta
from graphpipe.graph.tracer import DEFAULT_LEAF_TYPES, trace_module

__all__ = ["DEFAULT_LEAF_TYPES", "capture", "capture_traced", "trace_module"]


def capture(model: nn.Module, example_inputs: Sequence[Any] | torch.Tensor, *,
            leaf_modules: Iterable[type | str] = (), name: str | None = None) -> OpGraph:
    """Trace `model` and run `example_inputs` (batch first) through it to record every op's shapes."""
    inputs = _as_tuple(example_inputs)
    gm = trace_module(model, leaf_modules, num_inputs=len(inputs))
    return capture_traced(gm, model, inputs, name=name or type(model).__name__)


def capture_traced(gm: torch.fx.GraphModule, model: nn.Module, example_inputs: Sequence[Any] | torch.Tensor, *,
                   name: str) -> OpGraph:
    """Build the `OpGraph` of an already traced `gm` (from `trace_module(model)`)."""
    inputs = _as_tuple(example_inputs)
    batch_size = _batch_size(inputs)
    metas = record_metas(gm, model, _on_model_device(model, inputs))
    params = assign_params(gm, model)
    ops = tuple(_op_node(node, gm, metas, params.get(node.name, ())) for node in gm.graph.nodes)
    return OpGraph(name=name, ops=ops, example_batch_size=batch_size)


def _op_node(node: torch.fx.Node, gm: torch.fx.GraphModule, metas: dict[str, tuple[TensorMeta, ...]],
             params: tuple[ParamRef, ...]) -> OpNode:
    kind = str(node.op)
    module_path = str(node.target) if kind == "call_module" else None
    if module_path is not None:
        module = gm.get_submodule(module_path)
        module_type = type(module).__name__
        attrs = module_attrs(module)
    else:
        module_type = _callable_name(node)
        attrs = call_attrs(node) if kind in ("call_function", "call_method") else {}
    attrs["input_shapes"] = [list(meta.shape) for src in node.all_input_nodes for meta in metas.get(src.name, ())]
    return OpNode(
        name=node.name, kind=kind, target=_target_str(node), module_path=module_path, module_type=module_type,
        inputs=tuple(src.name for src in node.all_input_nodes), outputs=metas.get(node.name, ()),
        params=params, attrs=attrs)


def _callable_name(node: torch.fx.Node) -> str:
    if node.op in ("placeholder", "output", "get_attr"):
        return str(node.op)
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _target_str(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__qualname__', getattr(target, '__name__', str(target)))}".lstrip(".")


def _as_tuple(example_inputs: Sequence[Any] | torch.Tensor) -> tuple[Any, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    return tuple(example_inputs)


def _batch_size(inputs: tuple[Any, ...]) -> int:
    first = inputs[0] if inputs else None
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        raise GraphCaptureError(
            "the first example input must be a tensor with the batch as its first dimension, got "
            f"{type(first).__name__ if not isinstance(first, torch.Tensor) else 'a 0-d tensor'}; "
            "pass example_inputs as a tuple of tensors, batch first")
    return int(first.shape[0])


def _on_model_device(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Move the inputs to meta when the model's weights are on meta, so shapes propagate without data."""
    tensors = list(model.parameters()) + list(model.buffers())
    if not any(t.is_meta for t in tensors):
        return inputs
    return tuple(x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs)
