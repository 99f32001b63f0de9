"""Models the project did not write: tiny, randomly initialised library models built from their config
classes (nothing downloaded), plus small models of our own with the features that break naive splits
(in-place ReLU at a stage entry, BatchNorm, tied weights, optional arguments).

Each entry builds `(model, inputs, loss)` where `loss(output) -> scalar` reads the output object as
the model returns it (a `ModelOutput`, a tuple, a tensor). Dropout is off so that two runs agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

BATCH = 4
SEQ = 8


@dataclass(frozen=True)
class CorpusModel:
    name: str
    build: Callable[[], tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]]
    two_towers: bool = False  # has two independent branches worth running side by side


def _tokens(vocab: int = 96, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(1, vocab, (BATCH, seq))


def _bert() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    inputs = {"input_ids": _tokens(), "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}
    return BertModel(config), inputs, lambda out: out.last_hidden_state.square().mean() + out.pooler_output.sum()


def _gpt2() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return GPT2Model(config), (_tokens(),), lambda out: out.last_hidden_state.square().mean()


def _t5() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    from transformers import T5Config, T5Model

    config = T5Config(vocab_size=96, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, dropout_rate=0.0,
                      use_cache=False, decoder_start_token_id=0)
    inputs = {"input_ids": _tokens(), "decoder_input_ids": _tokens(seq=6)}
    return T5Model(config), inputs, lambda out: out.last_hidden_state.square().mean()


def _llama() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    """Grouped-query attention, rotary embeddings, RMSNorm, and an LM head tied to the token embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         tie_word_embeddings=True, use_cache=False)
    return LlamaForCausalLM(config), (_tokens(),), lambda out: out.logits.square().mean()


def _albert() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    """One transformer layer's weights shared by every layer: a plan splits them across stages."""
    from transformers import AlbertConfig, AlbertModel

    config = AlbertConfig(vocab_size=96, embedding_size=16, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=4, num_attention_heads=2, max_position_embeddings=32,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return AlbertModel(config), (_tokens(),), lambda out: out.last_hidden_state.square().mean()


def _bart() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    from transformers import BartConfig, BartModel

    config = BartConfig(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=False)
    inputs = {"input_ids": _tokens(), "decoder_input_ids": _tokens(seq=6)}
    return BartModel(config), inputs, lambda out: out.last_hidden_state.square().mean()


def _swin() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    """Shifted-window attention: the batch and the windows share an axis inside each block."""
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(image_size=16, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=2,
                        drop_path_rate=0.0)
    return SwinModel(config), (torch.randn(BATCH, 3, 16, 16),), lambda out: out.pooler_output.square().mean()


class ClipTowers(nn.Module):
    """CLIP's text and vision towers with their projections; a per-sample pair score (no batch coupling)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import CLIPConfig, CLIPModel

        config = CLIPConfig(
            text_config={"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "max_position_embeddings": 16},
            vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 2, "image_size": 16, "patch_size": 8},
            projection_dim=16)
        self.clip = CLIPModel(config)

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        text = self.clip.text_model(input_ids=input_ids).pooler_output
        image = self.clip.vision_model(pixel_values=pixel_values).pooler_output
        return (self.clip.text_projection(text) * self.clip.visual_projection(image)).sum(-1)


def _clip() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    inputs = (_tokens(seq=SEQ), torch.randn(BATCH, 3, 16, 16))
    return ClipTowers(), inputs, lambda out: out.square().mean()


class InplaceCnn(nn.Module):
    """Conv -> ReLU(inplace=True) stacks, as torchvision writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu_(self.body(x) - 0.5)  # F.relu(..., inplace=True), as GoogLeNet writes it
        return self.head(h.mean(dim=(2, 3)))


class BatchNormMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16),
                                    nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class TiedTowers(nn.Module):
    """Two towers that share one embedding table (and an output layer tied to it)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.left = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
        self.right = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        left = self.left(self.embed(a).mean(1))
        right = self.right(self.embed(b).mean(1))
        return (left + right) @ self.embed.weight.t()


class OptionalArgs(nn.Module):
    """Optional forward arguments left at their defaults (timm's `forward(x, attn_mask=None, is_causal=False)`),
    a shape check and `B, N = x.shape`."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(12, 12), nn.GELU(), nn.Linear(12, 12))
        self.b = nn.Sequential(nn.Linear(12, 12), nn.GELU(), nn.Linear(12, 12))
        self.head = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        torch._assert(x.shape[-1] == 12, "x needs 12 features")
        batch, _ = x.shape
        if attn_mask is not None:
            x = x * attn_mask
        out = self.head(torch.cat([self.a(x), self.b(x)], dim=-1)).reshape(batch, -1)
        return out if bias is None else out + bias


def _own(cls: type[nn.Module], inputs: Callable[[], Any]) -> Callable[[], tuple[nn.Module, Any, Callable]]:
    return lambda: (cls(), inputs(), lambda out: out.square().mean())


CORPUS: tuple[CorpusModel, ...] = (
    CorpusModel("bert", _bert),
    CorpusModel("gpt2", _gpt2),
    CorpusModel("t5", _t5),
    CorpusModel("llama", _llama),
    CorpusModel("albert", _albert),
    CorpusModel("bart", _bart),
    CorpusModel("swin", _swin),
    CorpusModel("clip_towers", _clip, two_towers=True),
    CorpusModel("inplace_cnn", _own(InplaceCnn, lambda: (torch.randn(BATCH, 3, 8, 8),))),
    CorpusModel("batchnorm_mlp", _own(BatchNormMlp, lambda: (torch.randn(BATCH, 8),))),
    CorpusModel("tied_towers", _own(TiedTowers, lambda: (torch.randint(0, 50, (BATCH, 5)),
                                                         torch.randint(0, 50, (BATCH, 7))))),
    CorpusModel("optional_args", _own(OptionalArgs, lambda: (torch.randn(BATCH, 12),)), two_towers=True),
)
