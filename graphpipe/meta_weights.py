"""Build a model without allocating its parameters: `with graphpipe.empty_weights(): model = Net()`.

Parameters registered inside the block are moved to the `meta` device as they are
registered, so a module's own initialiser, which runs after registration in torch's
modules, costs nothing and the memory `torch.empty` reserved for them is never touched.
Buffers stay real: they are small, and many are computed at construction (position ids,
rotary tables, masks) in a way no initialiser can redo later. So do parameters of one element:
they cost nothing, and their value often comes from the model's config at construction (CLIP's
logit scale), where no initialiser can redo it either. `PipelineTrainer` gives each
rank real values for its own stage's parameters only (`graphpipe.runtime.materialize`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.nn.parameter import UninitializedParameter

__all__ = ["empty_weights", "has_meta_tensors"]


@contextmanager
def empty_weights() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device; buffers and one-element parameters stay
    real."""
    original = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta and not isinstance(param, UninitializedParameter) \
                and param.numel() > 1:
            param = type(param)(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def has_meta_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of `module` lives on the meta device (has no values)."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))
