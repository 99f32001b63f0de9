"""Library models as a user brings them: `graphpipe plan/train --model tests/corpus/cli_factories.py:NAME`.

Tiny random configs of Hugging Face model classes (nothing downloaded), one of every kind graph
pipelining meets: a decoder with grouped-query attention and an untied head, an encoder-decoder,
two towers, three mixture-of-experts families, a vision-language model, a state-space model, an
audio encoder and a CNN. Every factory returns `(model, inputs, targets, loss_fn)` in float64 (so
that a split run and one device agree to rounding), dropout off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB, SEQ = 96, 8
EXPERTS = "batched_mm"  # every token through its experts by batched products: grouped ones take no float64


class NextTokenLoss(nn.Module):
    """Cross-entropy of each position's logits against the next token."""

    def forward(self, output: Any, tokens: torch.Tensor) -> torch.Tensor:
        logits = output.logits[:, :-1]
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class HiddenLoss(nn.Module):
    """Mean square of the last hidden state (models without a head)."""

    def forward(self, output: Any, _targets: torch.Tensor) -> torch.Tensor:
        return output.last_hidden_state.square().mean()


class PooledLoss(nn.Module):
    """Mean square of the pooled output (vision backbones)."""

    def forward(self, output: Any, _targets: torch.Tensor) -> torch.Tensor:
        return output.pooler_output.square().mean()


class PairLoss(nn.Module):
    """Mean square of each image's similarity to its own text: per sample, so a micro-batch share is exact."""

    def forward(self, output: Any, _targets: torch.Tensor) -> torch.Tensor:
        return (output.text_embeds * output.image_embeds).sum(-1).square().mean()


def _done(model: nn.Module, inputs: Any, targets: torch.Tensor, loss: nn.Module, dtype: str) -> tuple[Any, ...]:
    kind = getattr(torch, dtype)
    model = model.to(kind)
    inputs = {key: _cast(value, kind) for key, value in inputs.items()}
    return model, inputs, _cast(targets, kind), loss


def _cast(tensor: torch.Tensor, kind: torch.dtype) -> torch.Tensor:
    return tensor.to(kind) if tensor.is_floating_point() else tensor


def _tokens(batch_size: int, seed: int, seq: int = SEQ, low: int = 1, high: int = VOCAB) -> torch.Tensor:
    return torch.randint(low, high, (batch_size, seq), generator=torch.Generator().manual_seed(seed))


def _floats(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 1))


def qwen2(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """A decoder with grouped-query attention (4 query heads, 1 key/value head) and an untied LM head."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=32,
                         tie_word_embeddings=False, use_cache=False)
    tokens = _tokens(batch_size, seed)
    return _done(Qwen2ForCausalLM(config), {"input_ids": tokens}, tokens, NextTokenLoss(), dtype)


def bart(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """An encoder-decoder."""
    from transformers import BartConfig, BartModel

    config = BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=False)
    tokens = _tokens(batch_size, seed)
    inputs = {"input_ids": tokens, "decoder_input_ids": _tokens(batch_size, seed + 7, seq=6)}
    return _done(BartModel(config), inputs, tokens, HiddenLoss(), dtype)


def clip(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """Two towers (text and vision) joined by their embeddings."""
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig

    text = CLIPTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, max_position_embeddings=32)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=16, patch_size=8)
    config = CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16)
    tokens = _tokens(batch_size, seed)
    inputs = {"input_ids": tokens, "pixel_values": _floats(seed, batch_size, 3, 16, 16)}
    return _done(CLIPModel(config), inputs, tokens, PairLoss(), dtype)


def olmoe(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """Mixture of experts (OLMoE): 4 experts, 2 per token, data-dependent routing."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = OlmoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                         max_position_embeddings=32, use_cache=False, pad_token_id=0, eos_token_id=1,
                         bos_token_id=2, experts_implementation=EXPERTS)
    tokens = _tokens(batch_size, seed)
    return _done(OlmoeForCausalLM(config), {"input_ids": tokens}, tokens, NextTokenLoss(), dtype)


def granitemoe(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """Mixture of experts (GraniteMoE)."""
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM

    config = GraniteMoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                              num_experts_per_tok=2, max_position_embeddings=32, use_cache=False,
                              experts_implementation=EXPERTS)
    tokens = _tokens(batch_size, seed)
    return _done(GraniteMoeForCausalLM(config), {"input_ids": tokens}, tokens, NextTokenLoss(), dtype)


def mixtral(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """Mixture of experts (Mixtral) with grouped-query attention."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=32, use_cache=False, experts_implementation=EXPERTS)
    tokens = _tokens(batch_size, seed)
    return _done(MixtralForCausalLM(config), {"input_ids": tokens}, tokens, NextTokenLoss(), dtype)


def llava(batch_size: int = 4, seed: int = 0, dtype: str = "float64", width: int = 32, layers: int = 2,
          patches: int = 4) -> tuple[Any, ...]:
    """A vision-language model: a CLIP vision tower whose image features replace the image tokens of a Llama
    decoder's input. Its forward fixes the batch size, so it is captured at one sample (`export-static`).
    `patches` per side of the image (`patches**2` image tokens)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                              num_attention_heads=2, image_size=8 * patches, patch_size=8, projection_dim=width)
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, use_cache=False)
    image_tokens = patches * patches
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=VOCAB - 1, vision_feature_layer=-1,
                         vision_feature_select_strategy="default", image_seq_length=image_tokens)
    tokens = _tokens(batch_size, seed, seq=SEQ + image_tokens, high=VOCAB - 2)
    tokens[:, 1:1 + image_tokens] = VOCAB - 1  # the image's patches
    inputs = {"input_ids": tokens, "pixel_values": _floats(seed, batch_size, 3, 8 * patches, 8 * patches)}
    return _done(LlavaForConditionalGeneration(config), inputs, tokens, NextTokenLoss(), dtype)


def mllama(batch_size: int = 4, seed: int = 0, dtype: str = "float64", width: int = 32, layers: int = 4,
           vision_layers: int = 2, patches: int = 2) -> tuple[Any, ...]:
    """A vision-language model whose image enters the decoder by cross-attention half way up (Mllama): the
    vision tower runs beside the decoder's first half, and both join at the cross-attention layer.
    `patches` per side of the image (one tile)."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    vision = {"hidden_size": width, "num_hidden_layers": vision_layers, "num_global_layers": 1, "attention_heads": 2,
              "intermediate_size": 2 * width, "vision_output_dim": 2 * width, "image_size": 8 * patches,
              "patch_size": 8, "max_num_tiles": 1, "intermediate_layers_indices": [0],
              "supported_aspect_ratios": [[1, 1]]}
    text = {"vocab_size": VOCAB, "hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": layers,
            "num_attention_heads": 2, "num_key_value_heads": 1, "cross_attention_layers": [layers // 2],
            "max_position_embeddings": 64, "use_cache": False, "pad_token_id": 0, "bos_token_id": 1,
            "eos_token_id": 2}
    config = MllamaConfig(vision_config=vision, text_config=text, image_token_index=VOCAB - 1)
    tokens = _tokens(batch_size, seed, high=VOCAB - 2)
    tokens[:, 0] = VOCAB - 1  # the image token: every text token attends to the image
    one = torch.ones(batch_size, dtype=torch.long)
    inputs = {"input_ids": tokens, "pixel_values": _floats(seed, batch_size, 1, 1, 3, 8 * patches, 8 * patches),
              "aspect_ratio_ids": one.view(-1, 1), "aspect_ratio_mask": one.view(-1, 1, 1),
              "cross_attention_mask": one.view(-1, 1, 1, 1).expand(-1, SEQ, 1, 1).contiguous()}
    return _done(MllamaForConditionalGeneration(config), inputs, tokens, NextTokenLoss(), dtype)


def mamba(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """A state-space model (Mamba, the reference scan)."""
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                         conv_kernel=4, use_cache=False)
    tokens = _tokens(batch_size, seed)
    return _done(MambaForCausalLM(config), {"input_ids": tokens}, tokens, NextTokenLoss(), dtype)


def wav2vec2(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """An audio encoder: convolutional feature extractor, then a transformer."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=2, hidden_dropout=0.0, attention_dropout=0.0,
                            activation_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
                            do_stable_layer_norm=True, feat_extract_norm="layer")
    audio = _floats(seed, batch_size, 400)
    return _done(Wav2Vec2Model(config), {"input_values": audio}, audio, HiddenLoss(), dtype)


def convnext(batch_size: int = 4, seed: int = 0, dtype: str = "float64") -> tuple[Any, ...]:
    """A CNN (ConvNeXt: depthwise convolutions and LayerNorm, no batch statistics)."""
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, patch_size=2,
                            drop_path_rate=0.0)
    images = _floats(seed, batch_size, 3, 16, 16)
    return _done(ConvNextModel(config), {"pixel_values": images}, images, PooledLoss(), dtype)
