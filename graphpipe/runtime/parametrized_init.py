"""Initialise the originals of a parametrised tensor (`torch.nn.utils.parametrize`, weight norm) on one rank.

A parametrised module's tensor (`conv.weight` under weight norm) lives as originals
(`conv.parametrizations.weight.original0`, `original1`), and initialisers that write the
tensor in place write a temporary the parametrisation computes: they leave the originals unset.
At construction the module's own `reset_parameters` ran before the parametrisation was
registered, which then derived the originals from it. `parametrized_values` does the same: the
module's `reset_parameters` on a plain copy holding a scratch tensor, under the module's seed,
then the parametrisations' `right_inverse`s, last registered first.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.utils.parametrize import ParametrizationList

__all__ = ["parametrized_values"]


def parametrized_values(model: nn.Module, owner_name: str, seed_of: Callable[[str], int],
                        scratch: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """{original leaf: value} for `owner_name` when it names a `ParametrizationList`
    (`module.parametrizations.tensor`), else None. `seed_of(module name)` is the seed the module is
    initialised under; `scratch(like)` a host tensor of its shape no initialiser leaves behind."""
    parts = owner_name.split(".")
    if len(parts) < 2 or parts[-2] != "parametrizations":
        return None
    plist = model.get_submodule(owner_name)
    if not isinstance(plist, ParametrizationList):
        return None
    module_name, tensor_name = ".".join(parts[:-2]), parts[-1]
    module = model.get_submodule(module_name)
    with torch.no_grad():
        shaped = plist()  # the parametrised tensor, on the originals' device (meta: its shape only)
        plain = _plain_copy(module, tensor_name, scratch(shaped))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed_of(module_name))
            reset = getattr(plain, "reset_parameters", None)
            if callable(reset):
                reset()
        value: Any = plain._parameters[tensor_name]
        for parametrization in reversed(list(plist)):
            inverse = getattr(parametrization, "right_inverse", None)
            value = inverse(value) if callable(inverse) else value
    originals = value if isinstance(value, (tuple, list)) else (value,)
    names = ["original"] if len(originals) == 1 else [f"original{idx}" for idx in range(len(originals))]
    return {name: tensor.detach() for name, tensor in zip(names, originals)}


def _plain_copy(module: nn.Module, tensor_name: str, tensor: torch.Tensor) -> nn.Module:
    """A shallow copy of `module` as its class before parametrisation, holding `tensor` as a plain parameter
    and scratch copies of its other parameters (so initialising it writes nothing of the model's)."""
    cls: type[nn.Module] = type(module).__bases__[0] if type(module).__name__.startswith("Parametrized") \
        else type(module)
    plain: nn.Module = object.__new__(cls)
    plain.__dict__ = dict(module.__dict__)
    plain._modules = {key: value for key, value in module._modules.items() if key != "parametrizations"}
    plain._parameters = {key: (None if value is None else nn.Parameter(torch.empty_like(value, device="cpu")))
                         for key, value in module._parameters.items()}
    plain._parameters[tensor_name] = nn.Parameter(tensor)
    plain._buffers = copy.copy(module._buffers)
    return plain
