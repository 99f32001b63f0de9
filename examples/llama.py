"""A Llama decoder (Hugging Face transformers' `LlamaForCausalLM`, random weights from its config: nothing
downloaded), trained as a language model: next-token cross-entropy.

    graphpipe capture --model examples/llama.py:factory
    graphpipe plan --model examples/llama.py:factory --preset tiny --devices 4 --batch 8 -o llama.json
    graphpipe plan --model examples/llama.py:factory --preset paper --devices 64 --mini-batch 512 \\
        --granularity auto -o llama7b.json

`tiny` (width 64, 2 layers) trains on a laptop; `paper` (the default of `graphpipe plan`) has Llama-7B's
shapes (width 4,096, 32 layers, sequence 512), which plan on any machine: planning builds the model without
its weights (`graphpipe.empty_weights()`, or `device="meta"` here). `--set layers=8` or `--set width=2048`
change them. At op level each layer holds parallel blocks (the rotary embedding inside the q and k
projections, the MLP's gate and up projections), which make the graph-pipeline search slow on many devices:
plan it with `--granularity auto` or `layer` (`docs/architecture.md`, "The 1.2x target and two-branch
blocks").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

PRESETS = {"tiny": {"width": 64, "layers": 2, "seq": 16, "vocab": 1000},
           "paper": {"width": 4096, "layers": 32, "seq": 512, "vocab": 32000}}


class NextTokenLoss(nn.Module):
    """Cross-entropy of each position's logits against the next token."""

    def forward(self, output: Any, tokens: torch.Tensor) -> torch.Tensor:
        logits = output.logits[:, :-1]
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def factory(preset: str = "tiny", batch_size: int = 4, seed: int = 0, device: str | torch.device = "cpu",
            **sizes: int) -> tuple[Any, ...]:
    """(model, inputs, targets, loss_fn); `sizes` override the preset's width, layers, seq and vocab."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import graphpipe as gp

    shape = {**PRESETS[preset], **sizes}
    width = shape["width"]
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=width, intermediate_size=width * 43 // 16,
                         num_hidden_layers=shape["layers"], num_attention_heads=max(1, width // 128),
                         max_position_embeddings=max(2048, shape["seq"]), use_cache=False)
    on_meta = torch.device(device).type == "meta"
    with gp.empty_weights() if on_meta else torch.device(device):
        model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape["vocab"], (batch_size, shape["seq"]), generator=generator)
    if not on_meta:
        tokens = tokens.to(device)
    return model, (tokens,), tokens, NextTokenLoss()
