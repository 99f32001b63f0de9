"""The devices a captured graph names: `torch.arange(n, device=...)`, `x.to(device)` and the like.

torch.export records the device of every tensor a forward creates as a constant argument. graphpipe
exports every model as on the host (`graphpipe.graph.host_state`), so those constants say `cpu`;
`place_graph_on` names the device the graph will run on instead, once its tensors are there (the
model's own device after capture, `meta` for a model without weights, a rank's CUDA device in the
trainer).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

__all__ = ["place_graph_on", "tensor_device"]


def place_graph_on(gm: torch.fx.GraphModule, device: torch.device | str) -> torch.fx.GraphModule:
    """`gm` with every device its ops name replaced by `device` (the graph runs on one device), in the graphs
    of its submodules too (export keeps an autocast or no-grad region as a nested GraphModule)."""
    target = torch.device(device)
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            _place_nodes(module, target)
    return gm


def _place_nodes(gm: torch.fx.GraphModule, target: torch.device) -> None:
    changed = False
    for node in gm.graph.nodes:
        args, kwargs = _placed(node.args, target), _placed(dict(node.kwargs), target)
        if args != node.args or kwargs != node.kwargs:
            node.args, node.kwargs = args, kwargs
            changed = True
    if changed:
        gm.recompile()


def tensor_device(module: torch.nn.Module) -> torch.device:
    """Where `module` runs: `meta` if any of its tensors has no values, else its first tensor's device (CPU
    for a module without tensors)."""
    tensors = [*module.parameters(), *module.buffers()]
    if any(t.is_meta for t in tensors):
        return torch.device("meta")
    return tensors[0].device if tensors else torch.device("cpu")


def _placed(value: Any, target: torch.device) -> Any:
    if isinstance(value, torch.device):
        return target
    if isinstance(value, tuple):
        return tuple(_placed(item, target) for item in value)
    if isinstance(value, list):
        return [_placed(item, target) for item in value]
    if isinstance(value, dict):
        return {key: _placed(item, target) for key, item in value.items()}
    return value
