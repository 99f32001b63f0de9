"""Which op owns which parameter: the first op (in topological order) that uses it.

A parameter read through `get_attr` (the form torch.export gives every parameter) is used
by the ops that read the `get_attr`, not by the read itself, so the owner is an op that
computes with it and a parameter read by two ops is shared between them.

Parameters and buffers are named as in the original model (`model.named_parameters()`),
so a stage's `state_dict` can be compared with the whole model's by name. Tied weights
(one tensor reached under two names) are one parameter under its first name.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.fx
from torch import nn

from graphpipe.graph.op_graph import ParamRef


def assign_params(gm: torch.fx.GraphModule, model: nn.Module) -> dict[str, tuple[ParamRef, ...]]:
    """ParamRefs per op name; every parameter and buffer of `model` is owned by exactly one op.

    Parameters no op reads (dead modules) are given to the `output` op so that they are still
    covered once.
    """
    canonical = _canonical_names(model)
    owner: dict[str, str] = {}
    shared: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        for name in dict.fromkeys(canonical[id(t)] for t in _tensors_used(gm, node) if id(t) in canonical):
            if name in owner:
                shared[name].append(node.name)
            else:
                owner[name], shared[name] = node.name, []
    output_name = next(node.name for node in gm.graph.nodes if node.op == "output")
    tensors = dict(_named_tensors(model))
    buffers = {name for name, _ in model.named_buffers()}
    refs: dict[str, list[ParamRef]] = {}
    for name, tensor in tensors.items():
        op_name = owner.get(name, output_name)
        refs.setdefault(op_name, []).append(ParamRef(
            name=name, num_bytes=tensor.numel() * tensor.element_size(), shape=tuple(tensor.shape),
            shared_with=tuple(dict.fromkeys(shared.get(name, ()))), is_buffer=name in buffers))
    return {op_name: tuple(items) for op_name, items in refs.items()}


def _named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def _canonical_names(model: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, tensor in _named_tensors(model):
        names.setdefault(id(tensor), name)
    return names


def _tensors_used(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[torch.Tensor]:
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return [t for _, t in module.named_parameters(remove_duplicate=False)] + [
            t for _, t in module.named_buffers(remove_duplicate=False)]
    if node.op in ("call_function", "call_method", "output"):  # the readers of a get_attr own what it reads
        values = [_get_attr(gm, str(src.target)) for src in node.all_input_nodes if src.op == "get_attr"]
        return [value for value in values if isinstance(value, torch.Tensor)]
    return []


def _get_attr(root: nn.Module, path: str) -> object:
    value: object = root
    for part in path.split("."):
        value = getattr(value, part)
    return value
