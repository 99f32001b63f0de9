"""A stage in eval mode for `trainer.evaluate`, whichever way it was captured.

`module.train(False)` switches the modules an fx graph calls (a `Dropout`, a `BatchNorm`). A graph captured
with torch.export (or a functional call fx traced) has no modules to switch: the mode is an argument baked
into each op at capture, `aten.dropout(x, p, True)`, `aten.batch_norm(..., True, ...)`, and BatchNorm's
`num_batches_tracked += 1` is an op of its own. `eval_mode` rewrites those arguments for the duration (the
dropouts' and batch norms' mode to False, the increment to 0) and puts them back after, so a library model
captured with torch.export evaluates as `model.eval()` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx

__all__ = ["eval_mode"]

_aten = torch.ops.aten
# op -> position of its training flag in args, and its keyword name
_MODE_FLAGS: dict[Any, tuple[int, str]] = {
    _aten.dropout.default: (2, "train"), _aten.native_dropout.default: (2, "train"),
    _aten.feature_dropout.default: (2, "train"), _aten.alpha_dropout.default: (2, "train"),
    _aten.feature_alpha_dropout.default: (2, "train"), _aten.batch_norm.default: (5, "training"),
    torch.nn.functional.dropout: (2, "training"), torch.nn.functional.dropout1d: (2, "training"),
    torch.nn.functional.dropout2d: (2, "training"), torch.nn.functional.dropout3d: (2, "training"),
    torch.nn.functional.alpha_dropout: (2, "training"), torch.nn.functional.feature_alpha_dropout: (2, "training"),
    torch.nn.functional.batch_norm: (5, "training"),
}
_INCREMENTS = (_aten.add_.Tensor, _aten.add_.Scalar)


@contextmanager
def eval_mode(module: torch.fx.GraphModule) -> Iterator[None]:
    """`module` in eval mode inside the block, in training mode (as it was) after."""
    was_training = module.training
    saved = [(node, node.args, dict(node.kwargs)) for node in module.graph.nodes if _in_train_form(node)]
    for node, _, _ in saved:
        _to_eval_form(node)
    if saved:
        module.recompile()
    module.train(False)
    try:
        yield
    finally:
        for node, args, kwargs in saved:
            node.args, node.kwargs = args, kwargs
        if saved:
            module.recompile()
        module.train(was_training)


def _in_train_form(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in _MODE_FLAGS:
        position, name = _MODE_FLAGS[node.target]
        flag = node.kwargs.get(name, node.args[position] if len(node.args) > position else False)
        return flag is True
    return node.target in _INCREMENTS and _counts_batches(node)


def _to_eval_form(node: torch.fx.Node) -> None:
    if node.target in _INCREMENTS:
        node.args = (node.args[0], 0)  # num_batches_tracked += 0: eval mode leaves it as it is
        return
    position, name = _MODE_FLAGS[node.target]
    if name in node.kwargs:
        node.kwargs = {**node.kwargs, name: False}
    else:
        node.args = (*node.args[:position], False, *node.args[position + 1:])


def _counts_batches(node: torch.fx.Node) -> bool:
    """An in-place add to a BatchNorm's `num_batches_tracked` buffer."""
    target = node.args[0] if node.args else None
    return isinstance(target, torch.fx.Node) and target.op == "get_attr" and \
        str(target.target).endswith("num_batches_tracked")
