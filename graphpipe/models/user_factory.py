"""Users bring their own network as `path/to/file.py:factory`, returning `(model, inputs, targets, loss_fn)`.

The factory may accept any of `preset`, `batch_size`, `seed`, `device` and model options; what it
does not accept is done here: a batch size it cannot make is made by repeating the rows of its
example batch, and a device it does not take is reached by moving the result.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphpipe.errors import GraphCaptureError, ModelLoadError
from graphpipe.meta_weights import empty_weights
from graphpipe.model_inputs import ModelInputs, as_model_inputs
from graphpipe.models.zoo_model import ZooModel, to_device


def is_file_spec(spec: str) -> bool:
    """`file.py:factory` or a bare `file.py` (the latter only to say what is missing)."""
    return spec.endswith(".py") or (":" in spec and spec.rsplit(":", 1)[0].endswith(".py"))


def load_user_model(spec: str, preset: str, *, batch_size: int | None, device: torch.device, seed: int,
                    empty: bool = False, **overrides: Any) -> ZooModel:
    factory = load_factory(spec)
    offered: dict[str, Any] = {"preset": preset, "seed": seed, "device": device}
    if batch_size is not None:
        offered["batch_size"] = batch_size
    kwargs = _accepted(factory, offered, overrides, spec)
    with torch.random.fork_rng(devices=[]), empty_weights() if empty else nullcontext():
        torch.manual_seed(seed)
        try:
            result = factory(**kwargs)
        except ModelLoadError:
            raise
        except Exception as err:
            raise ModelLoadError(f"the factory {spec} raised {type(err).__name__}: {err}") from err
    zoo = _as_zoo_model(result, spec)
    if batch_size is not None and zoo.batch_size != batch_size:
        zoo = repeat_rows(zoo, batch_size)
    return zoo if "device" in kwargs else to_device(zoo, device)


def repeat_rows(zoo: ZooModel, batch_size: int) -> ZooModel:
    """An example batch of `batch_size` rows made by cycling through the rows of the given one."""
    rows = torch.arange(batch_size) % zoo.batch_size

    def take(value: Any) -> Any:
        if isinstance(value, ModelInputs):
            return ModelInputs(args=take(value.args), kwargs=take(dict(value.kwargs)))
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == zoo.batch_size:
            return value[rows.to(value.device)]
        if isinstance(value, (tuple, list)):
            return type(value)(take(item) for item in value)
        if isinstance(value, dict):
            return {key: take(item) for key, item in value.items()}
        return value

    return ZooModel(zoo.model, take(zoo.inputs), take(zoo.targets), zoo.loss_fn)


def load_factory(spec: str) -> Callable[..., Any]:
    if ":" not in spec:
        raise ModelLoadError(f"model spec {spec!r} names a file but no factory; write {spec}:factory_name")
    path_str, name = spec.rsplit(":", 1)
    path = Path(path_str)
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist; pass an existing path/to/file.py:factory")
    module_name = "graphpipe_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ModelLoadError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        raise ModelLoadError(f"importing {path} failed: {type(err).__name__}: {err}") from err
    factory: Callable[..., Any] | None = getattr(module, name, None)
    if factory is None or not callable(factory):
        found = sorted(key for key, value in vars(module).items() if callable(value) and not key.startswith("_"))
        raise ModelLoadError(f"{path} has no callable {name!r}; it defines {found}")
    return factory


def _accepted(factory: Callable[..., Any], offered: dict[str, Any], overrides: dict[str, Any],
              spec: str) -> dict[str, Any]:
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if takes_any:
        return {**offered, **overrides}
    rejected = sorted(set(overrides) - set(params))
    if rejected:
        raise ModelLoadError(f"the factory {spec} takes no option {rejected}; it takes {sorted(params)}")
    return {**{key: value for key, value in offered.items() if key in params}, **overrides}


def _as_zoo_model(result: Any, spec: str) -> ZooModel:
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        raise ModelLoadError(
            f"the factory {spec} must return (model, inputs, targets, loss_fn), got {type(result).__name__}"
            + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))
    model, inputs, targets, loss_fn = result
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"the factory {spec} returned a {type(model).__name__} as model; expected nn.Module")
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else inputs
    try:
        as_model_inputs(inputs).batch_size()
    except GraphCaptureError as err:
        raise ModelLoadError(
            f"the factory {spec} must return inputs as a tensor, a tuple (positional arguments), a dict (keyword "
            f"arguments) or graphpipe.ModelInputs(args=..., kwargs=...), with the batch first: {err}") from err
    if not callable(loss_fn):
        raise ModelLoadError(f"the factory {spec} returned a loss_fn that is not callable")
    return ZooModel(model, inputs, targets, loss_fn)


def parse_model_options(items: Iterable[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs, values parsed as JSON where they parse (8, 0.5, true) and text otherwise; the
    same in the launcher, its checks and every rank."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ModelLoadError(f"--set {item!r}: write KEY=VALUE, e.g. --set num_branches=8")
        try:
            options[key] = json.loads(text)
        except json.JSONDecodeError:
            options[key] = text
    return options
