"""CANDLE-Uno of the paper (§6): K feed-forward branches, each with its own input, concatenated, an MLP head.

The real model's feature sets (gene expression, drug descriptors, fingerprints) have different
widths; here every branch reads `in_features` features, which keeps the branches alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.models.layers import mlp
from graphpipe.models.zoo_model import ExampleData, ZooModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    num_branches: int = 7
    num_layers: int = 4
    in_features: int = 1024
    hidden: int = 4096
    num_head_layers: int = 3
    head_hidden: int = 4096
    batch_size: int = 8


PRESETS: dict[str, Config] = {
    "tiny": Config(num_branches=7, num_layers=4, in_features=16, hidden=32, num_head_layers=3, head_hidden=32,
                   batch_size=4),
    "paper": Config(),
}


class CandleUno(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.branches = nn.ModuleList(mlp(config.in_features, config.hidden, config.num_layers)
                                      for _ in range(config.num_branches))
        self.head = mlp(config.num_branches * config.hidden, config.head_hidden, config.num_head_layers,
                        out_features=1, last_relu=False)
        self.num_inputs = config.num_branches  # forward(*inputs): how many placeholders to trace

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.cat([branch(x) for branch, x in zip(self.branches, inputs)], dim=1))
        return out


def build(config: Config, data: ExampleData) -> ZooModel:
    model = CandleUno(config)
    inputs = tuple(data.randn(config.batch_size, config.in_features) for _ in range(config.num_branches))
    return ZooModel(model, inputs, data.randn(config.batch_size, 1), nn.MSELoss())
