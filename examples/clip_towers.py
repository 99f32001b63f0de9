"""CLIP's text and vision towers (Hugging Face transformers, tiny random config, nothing downloaded).

    graphpipe capture --model examples/clip_towers.py:factory
    graphpipe plan --model examples/clip_towers.py:factory --cluster summit --devices 8 --batch 64 -o clip.json
    graphpipe show clip.json -o clip.png

The two towers share no op until the pair score, so graphpipe gives each its own stages. The
score is per pair (text i with image i), so micro-batches train exactly what the whole batch does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ClipTowers(nn.Module):
    def __init__(self, width: int = 64, layers: int = 4) -> None:
        super().__init__()
        from transformers import CLIPConfig, CLIPModel

        tower = {"hidden_size": width, "intermediate_size": 4 * width, "num_hidden_layers": layers,
                 "num_attention_heads": 4}
        config = CLIPConfig(text_config={**tower, "vocab_size": 1000, "max_position_embeddings": 32},
                            vision_config={**tower, "image_size": 32, "patch_size": 8}, projection_dim=width)
        self.clip = CLIPModel(config)

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        text = self.clip.text_projection(self.clip.text_model(input_ids=input_ids).pooler_output)
        image = self.clip.visual_projection(self.clip.vision_model(pixel_values=pixel_values).pooler_output)
        return nn.functional.cosine_similarity(text, image, dim=-1)


def factory(batch_size: int = 16, seed: int = 0, width: int = 64, layers: int = 4) -> tuple[Any, ...]:
    generator = torch.Generator().manual_seed(seed)
    model = ClipTowers(width, layers)
    inputs = {"input_ids": torch.randint(1, 1000, (batch_size, 16), generator=generator),
              "pixel_values": torch.randn(batch_size, 3, 32, 32, generator=generator)}
    targets = torch.rand(batch_size, generator=generator) * 2 - 1
    return model, inputs, targets, nn.functional.mse_loss
