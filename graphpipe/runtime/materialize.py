"""Give real values to a model's meta tensors, or to one stage's: a seed per module name, or a weights file.

A model built with `graphpipe.empty_weights` (or on the meta device) has no parameter
values. `materialize` creates them on the host, tensor by tensor, for the names asked for:

- from a weights file (`WeightsFile`: safetensors or a distributed checkpoint), reading only
  those keys; or
- by the modules' own initialisers: `reset_parameters` (torch's modules), then the
  `_init_weights(module)` of the innermost (sub-)model around the module that has one (Hugging
  Face models; the order their `post_init` uses); a parametrised tensor's originals (weight norm) from
  its module's `reset_parameters` and the parametrisation's right inverse
  (`graphpipe.runtime.parametrized_init`). Each module is initialised under its own seed, drawn from the run's
  seed and the module's name, so a parameter's values depend on its name alone and not
  on which stage, rank or split holds it: a pipeline run and a one-device run of the
  same seed start from the same weights.

Tied tensors (one tensor under several names) are created once, under their first name, and
placed under every name. A tensor whose initialiser left it unset is an error naming it,
rather than silent garbage. Real tensors are left as they are.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphpipe.errors import TrainingError
from graphpipe.runtime.parametrized_init import parametrized_values
from graphpipe.runtime.weights_file import WeightsFile

__all__ = ["materialize", "module_seed"]


@dataclass(frozen=True, slots=True)
class _Tied:
    """One tensor of the model and every name it has (the first is canonical)."""

    names: tuple[str, ...]
    tensor: torch.Tensor


def materialize(model: nn.Module, *, names: Iterable[str] | None = None, device: torch.device | str = "cpu",
                seed: int = 0, weights: str | os.PathLike[str] | WeightsFile | None = None,
                into: Sequence[nn.Module] = ()) -> int:
    """Give values to `names` of `model` (every parameter and buffer when None) and place them in `model`
    and in each module of `into` (stage modules holding the same tensors under the same names). With
    `weights`, those tensors are read from the file (real ones too); otherwise only meta ones are
    initialised. Returns the bytes created."""
    tied = _tied_tensors(model)
    chosen = _chosen(tied, names)
    source = weights if weights is None or isinstance(weights, WeightsFile) else WeightsFile(weights)
    if source is not None:
        values = _from_file(source, chosen)
    else:
        values = _initialised([t for t in chosen if t.tensor.is_meta], model, seed)
    created = 0
    for item in chosen:
        value = values.get(item.names[0])
        if value is None:
            value = item.tensor  # real already: only placed where a copy is still meta
        else:
            created += value.numel() * value.element_size()
        value = _as_kind(value.to(device), item.tensor)
        for root in (model, *into):
            for name in item.names:
                _place(root, name, value)
    return created


def module_seed(seed: int, module_name: str) -> int:
    """The seed a module is initialised under: from the run's seed and the module's name only."""
    digest = hashlib.sha256(f"{seed}:{module_name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _tied_tensors(model: nn.Module) -> dict[str, _Tied]:
    """Every parameter and buffer by each of its names; tied names share one entry."""
    by_id: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, tensor in (*model.named_parameters(remove_duplicate=False),
                         *model.named_buffers(remove_duplicate=False)):
        by_id.setdefault(id(tensor), []).append(name)
        tensors[id(tensor)] = tensor
    out: dict[str, _Tied] = {}
    for key, found in by_id.items():
        entry = _Tied(names=tuple(found), tensor=tensors[key])
        out.update({name: entry for name in found})
    return out


def _chosen(tied: dict[str, _Tied], names: Iterable[str] | None) -> list[_Tied]:
    wanted = list(tied) if names is None else list(names)
    unknown = [name for name in wanted if name not in tied]
    if unknown:
        raise TrainingError(f"the model has no parameter or buffer {unknown[0]!r} ({len(unknown)} unknown names); "
                            "materialise the model the stages were split from")
    return list({id(tied[name]): tied[name] for name in wanted}.values())


def _from_file(source: WeightsFile, chosen: list[_Tied]) -> dict[str, torch.Tensor]:
    """{canonical name: tensor} read from the file, under whichever of its names the file holds."""
    key_of = {item.names[0]: next((name for name in item.names if name in source.shapes), item.names[0])
              for item in chosen}
    read = source.read({key_of[item.names[0]]: (item.tensor.shape, item.tensor.dtype) for item in chosen})
    return {canonical: read[key] for canonical, key in key_of.items()}


def _initialised(chosen: list[_Tied], model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """{canonical name: tensor} from the initialisers of the modules that own them, module by module."""
    by_owner: dict[str, list[str]] = {}
    for item in chosen:
        owner, _, leaf = item.names[0].rpartition(".")
        by_owner.setdefault(owner, []).append(leaf)
    values: dict[str, torch.Tensor] = {}
    for owner in sorted(by_owner):
        parametrized = parametrized_values(model, owner, lambda name: module_seed(seed, name), _unset_like)
        found = parametrized if parametrized is not None else _initialise_module(model, owner, by_owner[owner], seed)
        for leaf, value in found.items():
            if leaf not in by_owner[owner]:
                continue
            values[f"{owner}.{leaf}" if owner else leaf] = value
    return values


def _initialise_module(model: nn.Module, owner_name: str, leaves: list[str], seed: int) -> dict[str, torch.Tensor]:
    """Run the initialisers of one module on scratch host tensors; keep `leaves`, restore everything else."""
    owner = model.get_submodule(owner_name)
    saved = {**owner._parameters, **owner._buffers}
    try:
        tables: tuple[dict[str, Any], ...] = (owner._parameters, owner._buffers)
        for table in tables:
            for key, tensor in table.items():
                if tensor is not None:
                    table[key] = _as_kind(_unset_like(tensor), tensor)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(module_seed(seed, owner_name))
            ran = _run_initialisers(_initialising_model(model, owner_name), owner)
        values = {leaf: _detached(owner._parameters[leaf] if leaf in owner._parameters else owner._buffers[leaf])
                  for leaf in leaves}
    finally:
        for key, tensor in saved.items():
            home: dict[str, Any] = owner._parameters if key in owner._parameters else owner._buffers
            home[key] = tensor
    unset = [leaf for leaf, value in values.items() if _still_unset(value)]
    if unset:
        label = owner_name or type(model).__name__
        why = f"its initialisers ({', '.join(ran)}) leave it unset" if ran else "the module has no reset_parameters()"
        raise TrainingError(
            f"cannot initialise {label}.{unset[0]} ({type(owner).__name__}) on this rank: {why}."
            " Fix: load the weights from a file (--weights FILE), give the module a reset_parameters(), or build the "
            "model with graphpipe.empty_weights() so buffers computed at construction stay real")
    return values


def _initialising_model(model: nn.Module, owner_name: str) -> nn.Module:
    """The innermost module around `owner_name` (itself included) with an `_init_weights`, else `model`: a
    composite Hugging Face model (LLaVA: a CLIP vision tower and a Llama decoder) initialises each sub-model's
    modules with that sub-model's own `_init_weights`, as its `post_init` does."""
    parts = owner_name.split(".") if owner_name else []
    for depth in range(len(parts), 0, -1):
        candidate = model.get_submodule(".".join(parts[:depth]))
        if callable(getattr(candidate, "_init_weights", None)):
            return candidate
    return model


def _run_initialisers(model: nn.Module, owner: nn.Module) -> list[str]:
    ran = []
    for method in ("reset_parameters", "_reset_parameters"):
        if callable(getattr(owner, method, None)):
            getattr(owner, method)()
            ran.append(method)
            break
    init_weights = getattr(model, "_init_weights", None)
    if callable(init_weights):
        init_weights(owner)
        ran.append("_init_weights")
    return ran


def _unset_like(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor of the same shape holding a value no initialiser leaves behind (NaN, the minimum int)."""
    scratch = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        scratch.fill_(float("nan"))
    elif tensor.dtype != torch.bool:
        scratch.fill_(torch.iinfo(tensor.dtype).min)
    return scratch


def _still_unset(value: torch.Tensor) -> bool:
    if value.dtype.is_floating_point or value.dtype.is_complex:
        return bool(torch.isnan(value).any())
    if value.dtype == torch.bool or value.numel() == 0:
        return False
    return bool((value == torch.iinfo(value.dtype).min).all())


def _detached(tensor: torch.Tensor | None) -> torch.Tensor:
    assert tensor is not None
    return tensor.detach()


def _as_kind(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`value` as a Parameter when `like` is one (same requires_grad), else as a plain tensor."""
    if isinstance(like, nn.Parameter):
        return nn.Parameter(value.detach(), requires_grad=like.requires_grad)
    return value.detach()


def _place(root: nn.Module, name: str, value: torch.Tensor) -> None:
    """Put `value` under `name` in `root` when `root` has a tensor of that name."""
    owner_name, _, leaf = name.rpartition(".")
    try:
        owner = root.get_submodule(owner_name)
    except AttributeError:
        return
    if leaf in owner._parameters:
        owner._parameters[leaf] = value if isinstance(value, nn.Parameter) else nn.Parameter(value)
    elif leaf in owner._buffers:
        owner._buffers[leaf] = value.detach()
