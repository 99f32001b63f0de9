"""MMT, the multi-modal transformer of the paper (§6): K branches of L transformer layers, concatenated.

Each branch reads its own input (one modality, `(batch, seq_len, hidden)`); the branch outputs
are concatenated on the feature dimension and a classifier head reads the mean over the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphpipe.models.layers import ClassifierHead, TransformerLayer
from graphpipe.models.zoo_model import ExampleData, ZooModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    num_branches: int = 4
    num_layers: int = 8
    seq_len: int = 256
    hidden: int = 1024
    num_heads: int = 16
    ffn_hidden: int = 4096
    num_classes: int = 1000
    batch_size: int = 8


PRESETS: dict[str, Config] = {
    "tiny": Config(num_branches=4, num_layers=2, seq_len=8, hidden=16, num_heads=2, ffn_hidden=32, num_classes=4,
                   batch_size=4),
    "paper": Config(),
}


class MultiBranchTransformer(nn.Module):
    """K parallel transformer stacks, one per input, merged by concatenation."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            nn.Sequential(*(TransformerLayer(config.hidden, config.num_heads, config.ffn_hidden)
                            for _ in range(config.num_layers)))
            for _ in range(config.num_branches))
        self.head = ClassifierHead(config.num_branches * config.hidden, config.num_classes)
        self.num_inputs = config.num_branches  # forward(*inputs): how many placeholders to trace

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        merged = torch.cat([branch(x) for branch, x in zip(self.branches, inputs)], dim=-1)
        out: torch.Tensor = self.head(merged)
        return out


def build(config: Config, data: ExampleData) -> ZooModel:
    model = MultiBranchTransformer(config)
    shape = (config.batch_size, config.seq_len, config.hidden)
    inputs = tuple(data.randn(*shape) for _ in range(config.num_branches))
    targets = data.randint(config.num_classes, config.batch_size)
    return ZooModel(model, inputs, targets, nn.CrossEntropyLoss())
