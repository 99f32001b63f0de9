"""Toy multi-input model for tests: K branches, each its own input, concatenated, a Linear head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.models.layers import mlp
from graphpipe.models.zoo_model import ExampleData, ZooModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    num_branches: int = 3
    num_layers: int = 2
    width: int = 8
    batch_size: int = 4


PRESETS: dict[str, Config] = {"tiny": Config(), "paper": Config(num_branches=4, num_layers=8, width=1024,
                                                                batch_size=32)}


class Branches(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.branches = nn.ModuleList(mlp(config.width, config.width, config.num_layers)
                                      for _ in range(config.num_branches))
        self.head = nn.Linear(config.num_branches * config.width, config.width)
        self.num_inputs = config.num_branches  # forward(*inputs): how many placeholders to trace

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.cat([branch(x) for branch, x in zip(self.branches, inputs)], dim=1))
        return out


def build(config: Config, data: ExampleData) -> ZooModel:
    inputs = tuple(data.randn(config.batch_size, config.width) for _ in range(config.num_branches))
    return ZooModel(Branches(config), inputs, data.randn(config.batch_size, config.width), nn.MSELoss())
