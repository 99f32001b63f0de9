"""Toy chain for tests: `num_layers` x (Linear + ReLU), one input, MSE against random targets."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from graphpipe.models.layers import mlp
from graphpipe.models.zoo_model import ExampleData, ZooModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    num_layers: int = 4
    width: int = 8
    batch_size: int = 4


PRESETS: dict[str, Config] = {"tiny": Config(), "paper": Config(num_layers=16, width=1024, batch_size=32)}


def build(config: Config, data: ExampleData) -> ZooModel:
    model = mlp(config.width, config.width, config.num_layers)
    inputs = (data.randn(config.batch_size, config.width),)
    return ZooModel(model, inputs, data.randn(config.batch_size, config.width), nn.MSELoss())
