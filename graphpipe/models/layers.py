"""Building blocks of the zoo, written from plain leaf layers so that torch.fx traces them cleanly."""

from __future__ import annotations

import torch
from torch import nn


class TransformerLayer(nn.Module):
    """Pre-norm transformer layer: attention and a GELU feed-forward, each with a residual."""

    def __init__(self, hidden: int, num_heads: int, ffn_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        out: torch.Tensor = x + self.fc2(self.act(self.fc1(self.norm2(x))))
        return out


def mlp(in_features: int, hidden: int, num_layers: int, out_features: int | None = None,
        last_relu: bool = True) -> nn.Sequential:
    """`num_layers` Linear layers with ReLU between them: in -> hidden ... hidden -> out (default hidden)."""
    widths = [in_features] + [hidden] * (num_layers - 1) + [out_features or hidden]
    layers: list[nn.Module] = []
    for idx in range(num_layers):
        layers.append(nn.Linear(widths[idx], widths[idx + 1]))
        if last_relu or idx < num_layers - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class ClassifierHead(nn.Module):
    """Mean over the sequence, then a Linear to the classes."""

    def __init__(self, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.norm(x.mean(dim=1)))
        return out
