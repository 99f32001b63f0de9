"""Shape propagation: run the traced module once and keep only the `TensorMeta` of every node's value."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx
from torch import nn

from graphpipe.errors import GraphCaptureError
from graphpipe.graph.tensor_meta import TensorMeta


def tensor_meta(tensor: torch.Tensor) -> TensorMeta:
    return TensorMeta(shape=tuple(int(dim) for dim in tensor.shape), dtype=str(tensor.dtype).removeprefix("torch."))


def flatten_metas(value: Any) -> tuple[TensorMeta, ...]:
    """Metas of every tensor in a (nested) tuple, list or dict value, in order; non-tensors give none."""
    if isinstance(value, torch.Tensor):
        return (tensor_meta(value),)
    if isinstance(value, (tuple, list)):
        return tuple(meta for item in value for meta in flatten_metas(item))
    if isinstance(value, dict):
        return tuple(meta for item in value.values() for meta in flatten_metas(item))
    return ()


class _MetaRecorder(torch.fx.Interpreter):
    """Runs the graph and records each node's output metas; values are freed after their last use."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.metas: dict[str, tuple[TensorMeta, ...]] = {}
        self.is_tensor: dict[str, bool] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            value = super().run_node(n)
        except Exception as err:
            where = f"module {n.target!r}" if n.op == "call_module" else f"{n.op} {n.target}"
            raise GraphCaptureError(
                f"running op {n.name!r} ({where}) on the example inputs failed: {type(err).__name__}: {err}. "
                "Check that example_inputs match the model's forward (batch first) and sit on the model's "
                "device") from err
        self.metas[n.name] = flatten_metas(value)
        self.is_tensor[n.name] = isinstance(value, torch.Tensor)
        return value


def record_metas(gm: torch.fx.GraphModule, model: nn.Module,
                 inputs: tuple[Any, ...]) -> dict[str, tuple[TensorMeta, ...]]:
    """Output metas of every node of `gm`, computed without gradients and without changing model buffers."""
    return _record(gm, model, inputs).metas


@dataclass(frozen=True, slots=True)
class NodeValues:
    """What capture records of every node's value: tensor metas (with batch axes) and whether it is one tensor."""

    metas: dict[str, tuple[TensorMeta, ...]]
    is_tensor: dict[str, bool]
    fixed_batch: str | None = None  # why the graph cannot run at another batch size, if it cannot


def record_values(gm: torch.fx.GraphModule, model: nn.Module, inputs: tuple[Any, ...],
                  batch_size: int) -> NodeValues:
    """Metas of every node with their batch axes: the graph runs on the example and on the example twice over.

    The batch axis of a tensor is its first dimension that doubles with the batch (a flattened
    `[B*T, C]` counts too); a tensor whose shape stays is batch-free (position ids, masks
    broadcast over the batch, a rotary table).
    """
    once = _record(gm, model, inputs)
    fixed = None
    try:
        doubled = _record(gm, model, tuple(_doubled(x, batch_size) for x in inputs)).metas
    except GraphCaptureError as err:  # the graph fixed the batch size: batch-first wherever the size matches
        fixed = str(err).split(". Check that", 1)[0]
        doubled = {name: tuple(_scaled_first_dim(meta, batch_size) for meta in found)
                   for name, found in once.metas.items()}
    metas = {name: tuple(_with_axis(meta, other) for meta, other in zip(found, doubled.get(name, ())))
             for name, found in once.metas.items()}
    return NodeValues(metas=metas, is_tensor=once.is_tensor, fixed_batch=fixed)


def _scaled_first_dim(meta: TensorMeta, batch_size: int) -> TensorMeta:
    if meta.shape and meta.shape[0] == batch_size:
        return replace(meta, shape=(2 * batch_size, *meta.shape[1:]))
    return meta


def _record(gm: torch.fx.GraphModule, model: nn.Module, inputs: tuple[Any, ...]) -> _MetaRecorder:
    recorder = _MetaRecorder(gm)
    with torch.no_grad(), _buffers_restored(model):
        recorder.run(*inputs)
    return recorder


def _doubled(value: Any, batch_size: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch_size:
        return torch.cat([value, value])
    if isinstance(value, (tuple, list)):
        return type(value)(_doubled(item, batch_size) for item in value)
    if isinstance(value, dict):
        return {key: _doubled(item, batch_size) for key, item in value.items()}
    return value


def _with_axis(meta: TensorMeta, doubled: TensorMeta) -> TensorMeta:
    axis = next((dim for dim, (a, b) in enumerate(zip(meta.shape, doubled.shape)) if a > 0 and b == 2 * a), None)
    return replace(meta, batch_axis=axis)


@contextmanager
def _buffers_restored(model: nn.Module) -> Iterator[None]:
    """Running the example batch must not count as training (BatchNorm statistics, step counters)."""
    saved = {name: buf.clone() for name, buf in model.named_buffers() if not buf.is_meta}
    try:
        yield
    finally:
        buffers = dict(model.named_buffers())
        for name, value in saved.items():
            buffers[name].copy_(value)
