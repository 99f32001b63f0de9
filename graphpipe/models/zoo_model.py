"""What every zoo builder returns, and deterministic example data on any device (meta included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from graphpipe.meta_weights import has_meta_tensors
from graphpipe.model_inputs import ModelInputs, as_model_inputs


class ZooModel(NamedTuple):
    """A model with one example batch: unpacks as `model, inputs, targets, loss_fn`.

    `inputs` holds the forward's arguments with the batch first: a tuple (positional), a dict
    (keyword) or `ModelInputs` (both); `loss_fn(outputs, targets)` returns the mean loss over the
    batch as a scalar.
    """

    model: nn.Module
    inputs: Any
    targets: Any
    loss_fn: Callable[[Any, Any], torch.Tensor]

    @property
    def batch_size(self) -> int:
        return as_model_inputs(self.inputs).batch_size()


class ExampleData:
    """Random example tensors from a seeded generator; on `meta` only their shapes exist."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int) -> torch.Tensor:
        if self.device.type == "meta":
            return torch.empty(shape, device="meta")
        return torch.randn(shape, generator=self.generator)

    def randint(self, high: int, *shape: int) -> torch.Tensor:
        if self.device.type == "meta":
            return torch.empty(shape, dtype=torch.int64, device="meta")
        return torch.randint(high, shape, generator=self.generator)

    def bernoulli(self, *shape: int) -> torch.Tensor:
        if self.device.type == "meta":
            return torch.empty(shape, device="meta")
        return torch.randint(2, shape, generator=self.generator).float()


def to_device(zoo: ZooModel, device: torch.device) -> ZooModel:
    """The same model and batch on `device` (the model is moved in place)."""
    def move(value: Any) -> Any:
        if isinstance(value, ModelInputs):
            return value.map_tensors(lambda t: t.to(device))
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, (tuple, list)):
            return type(value)(move(item) for item in value)
        if isinstance(value, dict):
            return {key: move(item) for key, item in value.items()}
        return value

    model = zoo.model
    if not has_meta_tensors(model):  # empty weights move with their stage, once it has values
        model = model.to(device)
    return ZooModel(model, move(zoo.inputs), move(zoo.targets), zoo.loss_fn)
