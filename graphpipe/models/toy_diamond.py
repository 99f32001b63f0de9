"""Toy diamond for tests: a stem fans out into two branches of different depth, merged by add or cat."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.errors import ModelLoadError
from graphpipe.models.layers import mlp
from graphpipe.models.zoo_model import ExampleData, ZooModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    width: int = 8
    merge: str = "add"  # "add" or "cat"
    batch_size: int = 4

    def __post_init__(self) -> None:
        if self.merge not in ("add", "cat"):
            raise ModelLoadError(f"toy_diamond: merge must be 'add' or 'cat', got {self.merge!r}")


PRESETS: dict[str, Config] = {"tiny": Config(), "paper": Config(width=1024, batch_size=32)}


class Diamond(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.merge = config.merge
        self.stem = mlp(config.width, config.width, 1)
        self.left = mlp(config.width, config.width, 1)
        self.right = mlp(config.width, config.width, 2)
        self.head = nn.Linear(config.width * (2 if config.merge == "cat" else 1), config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        left, right = self.left(h), self.right(h)
        merged = torch.cat([left, right], dim=1) if self.merge == "cat" else left + right
        out: torch.Tensor = self.head(merged)
        return out


def build(config: Config, data: ExampleData) -> ZooModel:
    inputs = (data.randn(config.batch_size, config.width),)
    return ZooModel(Diamond(config), inputs, data.randn(config.batch_size, config.width), nn.MSELoss())
