"""Capture with `torch.export` (non-strict, dynamic batch dimension) for models fx cannot trace.

`torch.export` runs the real Python forward on fake tensors, so decorators, dataclass
outputs and data structures that stop symbolic tracing (Hugging Face transformers) are
fine. The result is turned into a plain fx GraphModule: one placeholder per leaf of the
flattened example inputs, parameters and buffers read by `get_attr` under their original
names, and the flattened model output; `out_spec` rebuilds the output object (a
`ModelOutput`, a dict, a tuple) for the loss function.
"""

from __future__ import annotations

import inspect
import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn

from graphpipe.errors import GraphCaptureError
from graphpipe.model_inputs import ModelInputs

__all__ = ["BatchFixedError", "export_module"]


class BatchFixedError(GraphCaptureError):
    """The model's forward fixes the batch size (export specialised the dynamic batch to a constant)."""


def export_module(model: nn.Module, given: ModelInputs, *, static: bool = False) -> tuple[
        torch.fx.GraphModule, pytree.TreeSpec, pytree.TreeSpec]:
    """(flat GraphModule, input spec, output spec) of `model` exported with a dynamic batch dimension, or with
    every shape fixed at the example's (`static`: the graph then runs at that batch size only).
    BatchFixedError when the forward fixes the batch size and `static` is off."""
    batch = given.batch_size()
    if batch < 2 and not static:
        raise GraphCaptureError(
            f"capture with torch.export needs an example batch of at least 2 samples (got {batch}): with 1, "
            "export cannot tell the batch dimension from a constant; pass a larger example batch")
    try:
        with _quiet_torch_logs():
            dynamic = None if static else _dynamic_shapes(model, given, batch)
            program = torch.export.export(model, tuple(given.args), dict(given.kwargs), dynamic_shapes=dynamic,
                                          strict=False)
    except Exception as err:
        if not static and _specialised_batch(err):
            raise BatchFixedError(f"{type(model).__name__}'s forward fixes the batch size ({_first_line(err)})") \
                from err
        raise GraphCaptureError(
            f"torch.export could not capture {type(model).__name__}: {type(err).__name__}: "
            f"{_first_line(err)}. Fix: make the failing line independent of tensor values, or mark the module "
            "that contains it as a leaf and capture with fx (--capture fx --leaf-module NAME)") from err
    unlifted = program.module()
    in_spec, out_spec = unlifted._in_spec, unlifted._out_spec
    assert isinstance(in_spec, pytree.TreeSpec) and isinstance(out_spec, pytree.TreeSpec)
    return _plain_graph_module(unlifted, type(model).__name__), in_spec, out_spec


def _dynamic_shapes(model: nn.Module, given: ModelInputs, batch: int) -> dict[str, Any]:
    """Dim 0 of every tensor whose first dimension is the example batch is the (shared) batch dimension."""
    dim = torch.export.Dim("batch")

    def spec(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == batch:
            return {0: dim}
        return None

    try:
        bound = inspect.signature(model.forward).bind(*given.args, **given.kwargs)
    except TypeError as err:
        raise GraphCaptureError(f"the example inputs do not match {type(model).__name__}.forward: {err}") from err
    return {name: pytree.tree_map(spec, value) for name, value in bound.arguments.items()}


def _plain_graph_module(unlifted: torch.fx.GraphModule, name: str) -> torch.fx.GraphModule:
    """A GraphModule that takes the flat inputs and returns the flat outputs, without export's guard call."""
    graph = unlifted.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and str(node.target) == "_guards_fn":
            graph.erase_node(node)
    graph._codegen = torch.fx.graph.CodeGen()
    graph.lint()
    return torch.fx.GraphModule(unlifted, graph, name)


@contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """torch.export logs warnings and prints the partial graph to stderr when it fails; the error says
    what matters."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def _specialised_batch(err: BaseException) -> bool:
    """Whether export failed because the code turned the dynamic batch dimension into a constant."""
    text = str(err)
    return "Constraints violated (batch)" in text or ("batch" in text and "specialized it to be a constant" in text)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
