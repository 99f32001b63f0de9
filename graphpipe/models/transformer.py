"""The sequential transformer of the paper (§6): MMT's layer configuration as one chain.

One input, `num_layers` layers (paper: 4 branches x 8 layers = 32), the same classifier head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.models.layers import ClassifierHead, TransformerLayer
from graphpipe.models.zoo_model import ExampleData, ZooModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    num_layers: int = 32
    seq_len: int = 256
    hidden: int = 1024
    num_heads: int = 16
    ffn_hidden: int = 4096
    num_classes: int = 1000
    batch_size: int = 8


PRESETS: dict[str, Config] = {
    "tiny": Config(num_layers=4, seq_len=8, hidden=16, num_heads=2, ffn_hidden=32, num_classes=4, batch_size=4),
    "paper": Config(),
}


class SequentialTransformer(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(TransformerLayer(config.hidden, config.num_heads, config.ffn_hidden)
                                      for _ in range(config.num_layers)))
        self.head = ClassifierHead(config.hidden, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.layers(x))
        return out


def build(config: Config, data: ExampleData) -> ZooModel:
    model = SequentialTransformer(config)
    inputs = (data.randn(config.batch_size, config.seq_len, config.hidden),)
    targets = data.randint(config.num_classes, config.batch_size)
    return ZooModel(model, inputs, targets, nn.CrossEntropyLoss())
