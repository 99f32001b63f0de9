"""Export a model as it runs on the host, whatever device its tensors are on: `all_on_host`.

torch.export runs the model's Python forward, and library code branches on the device it sees
(a mixture-of-experts router picks `histc`'s dtype by `device.type`, attention code adds
`contiguous()` calls by device). A graph captured with weights on `meta` (planning a model larger
than this machine) would then differ from the graph a rank captures with real weights, op for op.
Inside `all_on_host`, every tensor of the model that is not on the CPU is swapped for an
uninitialised CPU tensor of the same shape: `torch.empty` reserves address space but the pages are
never touched (export reads shapes, not values), so Llama-7B's 27 GB of weights cost about 0.1 GB
here. Every capture therefore sees the same device, and `graphpipe.graph.devices` names the
device the graph really runs on afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["all_on_host", "host_value"]


@contextmanager
def all_on_host(model: nn.Module) -> Iterator[None]:
    """Swap every parameter and buffer of `model` that is not on the CPU for an uninitialised CPU tensor of
    the same shape while the block runs (one per tensor, so tied weights stay tied); put them back after."""
    swapped: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    copies: dict[int, torch.Tensor] = {}
    try:
        for module in model.modules():
            tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
            for table in tables:
                for key, tensor in table.items():
                    if tensor is None or tensor.device.type == "cpu":
                        continue
                    if id(tensor) not in copies:
                        copies[id(tensor)] = _host_copy(tensor)
                    swapped.append((table, key, tensor))
                    table[key] = copies[id(tensor)]
        yield
    finally:
        for table, key, tensor in swapped:
            table[key] = tensor


def host_value(value: Any) -> Any:
    """An example input as a CPU tensor: meta ones as zeros of the same shape (export reads no values)."""
    if not isinstance(value, torch.Tensor) or value.device.type == "cpu":
        return value
    return torch.zeros(value.shape, dtype=value.dtype) if value.is_meta else value.detach().cpu()


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu") if tensor.is_meta else tensor.detach().cpu()
    return nn.Parameter(copy, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else copy
