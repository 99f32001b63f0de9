"""A deep MLP whose weights one rank cannot hold: `big_mlp.py:build` for `graphpipe train --model`.

32 layers of width 2048 in fp32: 512 MiB of parameters (2 GiB with gradients and Adam's
moments). `width` and `depth` are options (`--set width=16` gives the same graph, tiny).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class DeepMlp(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def build(batch_size: int = 16, width: int = 2048, depth: int = 32, seed: int = 0) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch_size, width, generator=gen)
    targets = torch.randn(batch_size, width, generator=gen)
    return DeepMlp(width, depth), (inputs,), targets, nn.functional.mse_loss
