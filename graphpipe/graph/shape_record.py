"""Shape propagation: run the traced module once and keep only the `TensorMeta` of every node's value."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
        return value


def record_metas(gm: torch.fx.GraphModule, model: nn.Module,
                 inputs: tuple[Any, ...]) -> dict[str, tuple[TensorMeta, ...]]:
    """Output metas of every node of `gm`, computed without gradients and without changing model buffers."""
    recorder = _MetaRecorder(gm)
    with torch.no_grad(), _buffers_restored(model):
        recorder.run(*inputs)
    return recorder.metas


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
