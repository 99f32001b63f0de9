"""Run a model whose parameters are on `meta` and whose buffers are real: everything on meta, for a while.

A model built with `graphpipe.empty_weights` keeps real buffers next to meta parameters;
shape propagation needs one device (torch.export runs on host placeholders instead:
`graphpipe.graph.host_state`). Inside `all_on_meta`
every real parameter and buffer is replaced by a meta copy of the same shape (one copy
per tensor, so tied weights stay tied), and put back on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["all_on_meta"]


@contextmanager
def all_on_meta(model: nn.Module) -> Iterator[None]:
    """Swap every real tensor of `model` for a meta copy while the block runs."""
    swapped: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    copies: dict[int, torch.Tensor] = {}  # one copy per tensor, so tied weights stay tied
    for module in model.modules():
        tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
        for table in tables:
            for key, tensor in table.items():
                if tensor is None or tensor.is_meta:
                    continue
                swapped.append((table, key, tensor))
                if id(tensor) not in copies:
                    copy = tensor.detach().to("meta")
                    copies[id(tensor)] = nn.Parameter(copy, requires_grad=tensor.requires_grad) \
                        if isinstance(tensor, nn.Parameter) else copy
                table[key] = copies[id(tensor)]
    try:
        yield
    finally:
        for table, key, tensor in swapped:
            table[key] = tensor
