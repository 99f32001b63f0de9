"""Load a model by zoo name or from a user file: `load_model("mmt", "paper")`, `load_model("net.py:make")`."""

from __future__ import annotations

import dataclasses
import importlib
from contextlib import nullcontext
from types import ModuleType
from typing import Any

import torch

from graphpipe.errors import ModelLoadError
from graphpipe.meta_weights import empty_weights
from graphpipe.models.user_factory import is_file_spec, load_user_model
from graphpipe.models.zoo_model import ExampleData, ZooModel, to_device

ZOO: dict[str, str] = {
    "mmt": "graphpipe.models.mmt",
    "dlrm": "graphpipe.models.dlrm",
    "candle_uno": "graphpipe.models.candle_uno",
    "transformer": "graphpipe.models.transformer",
    "two_branch": "graphpipe.models.two_branch",
    "toy_chain": "graphpipe.models.toy_chain",
    "toy_diamond": "graphpipe.models.toy_diamond",
    "toy_branches": "graphpipe.models.toy_branches",
}
ZOO_NAMES: tuple[str, ...] = tuple(ZOO)
PRESET_NAMES: tuple[str, ...] = ("tiny", "paper")


def load_model(spec: str, preset: str = "tiny", *, batch_size: int | None = None,
               device: str | torch.device | None = None, seed: int = 0, empty: bool = False,
               **overrides: Any) -> ZooModel:
    """Build a zoo model (or call a `path/to/file.py:factory`) with its example batch.

    `overrides` replace preset fields (e.g. `num_branches=8`). With `device="meta"` no weights are
    allocated (for capture); on any other device the model is built on CPU with `seed` and moved, so
    the same seed gives the same weights everywhere. With `empty=True` the parameters are left on
    meta (`graphpipe.empty_weights`: buffers and example data stay real) for a trainer to give each
    rank only its stage's values.
    """
    target = torch.device(device) if device is not None else torch.device("cpu")
    if is_file_spec(spec):
        return load_user_model(spec, preset, batch_size=batch_size, device=target, seed=seed, empty=empty,
                               **overrides)
    module = _zoo_module(spec)
    config = zoo_config(spec, preset, batch_size=batch_size, **overrides)
    build_device = torch.device("meta") if target.type == "meta" else torch.device("cpu")
    with torch.random.fork_rng(devices=[]), torch.device(build_device), empty_weights() if empty else nullcontext():
        torch.manual_seed(seed)
        built: ZooModel = module.build(config, ExampleData(seed, build_device))
    return built if build_device == target else to_device(built, target)


def zoo_config(name: str, preset: str = "tiny", *, batch_size: int | None = None, **overrides: Any) -> Any:
    """The configuration dataclass of a zoo model after applying the preset and the overrides."""
    module = _zoo_module(name)
    presets: dict[str, Any] = module.PRESETS
    if preset not in presets:
        raise ModelLoadError(f"model {name!r} has no preset {preset!r}; choose one of {sorted(presets)}")
    config = presets[preset]
    if batch_size is not None:
        overrides["batch_size"] = batch_size
    fields = {field.name for field in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ModelLoadError(f"model {name!r} has no option {unknown}; its options are {sorted(fields)}")
    for key, value in overrides.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 1 and key != "batch_size":
            raise ModelLoadError(f"model {name!r}: {key} must be >= 1, got {value}")
    if overrides.get("batch_size", 1) < 1:
        raise ModelLoadError(f"batch size must be >= 1, got {overrides['batch_size']}")
    return dataclasses.replace(config, **overrides)


def _zoo_module(name: str) -> ModuleType:
    if name not in ZOO:
        raise ModelLoadError(
            f"unknown model {name!r}; choose one of {', '.join(ZOO_NAMES)} or pass path/to/file.py:factory")
    return importlib.import_module(ZOO[name])
