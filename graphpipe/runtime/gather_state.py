"""The whole model's `state_dict` assembled across the ranks of a running plan (`trainer.consolidated_state_dict`).

Every rank splits the whole captured model, so it knows each stage's tensors' names, shapes and dtypes, even
where it holds no values (meta). A tensor is provided by the leader rank of the first stage that holds it (a
weight several stages share is the same on all of them after each step, as in checkpoints) and zeros elsewhere;
one all-reduce per dtype sums them, so every rank of the plan gets every tensor, exactly (x + 0 = x). The
result follows the model's own `state_dict` (`graphpipe.runtime.model_keys`): its keys in order, a tied name
pointing at the same tensor as the name it ties to, non-persistent buffers left out. A tensor no stage holds
(a parameter the forward never reads) was never trained: it is left out, as `graphpipe export` leaves it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphpipe.runtime.comm import Transport
from graphpipe.runtime.stage_module import StageModule

__all__ = ["HeldTensor", "gather_state", "held_tensors", "in_model_order"]


@dataclass(frozen=True, slots=True)
class HeldTensor:
    """A parameter or buffer, the stage that provides it, and what it looks like."""

    name: str
    stage: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def held_tensors(stages: Sequence[StageModule]) -> tuple[HeldTensor, ...]:
    """Each stage tensor once, with the first stage that holds it."""
    found: dict[str, HeldTensor] = {}
    for stage in stages:
        for name, tensor in (*stage.named_parameters(), *stage.named_buffers()):
            if name not in found:
                found[name] = HeldTensor(name, stage.spec.stage_idx, tuple(tensor.shape), tensor.dtype)
    return tuple(found.values())


def gather_state(held: Sequence[HeldTensor], own: Mapping[str, torch.Tensor], provides: int | None,
                 transport: Transport, ranks: Sequence[int], device: torch.device) -> dict[str, torch.Tensor]:
    """Every held tensor, on the CPU, on every rank of `ranks`; this rank fills those of stage `provides`
    (None: this rank provides nothing) from `own`."""
    gathered: dict[str, torch.Tensor] = {}
    for dtype in sorted({entry.dtype for entry in held}, key=str):
        entries = [entry for entry in held if entry.dtype == dtype]
        wire = torch.uint8 if dtype == torch.bool else dtype  # gloo sums no bools
        flat = torch.zeros(sum(_numel(entry.shape) for entry in entries), dtype=wire, device=device)
        offsets = _offsets(entries)
        for entry, offset in zip(entries, offsets):
            if entry.stage == provides:
                flat[offset:offset + _numel(entry.shape)] = own[entry.name].detach().reshape(-1).to(wire)
        transport.all_reduce_sum_(flat, ranks)
        values = flat.cpu()
        for entry, offset in zip(entries, offsets):
            gathered[entry.name] = values[offset:offset + _numel(entry.shape)].view(entry.shape).to(dtype).clone()
    return gathered


def in_model_order(gathered: Mapping[str, torch.Tensor], keys: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The model's state_dict keys that were gathered, in the model's order; a tied name shares its tensor."""
    aliases: Mapping[str, str] = keys["aliases"]
    state: dict[str, torch.Tensor] = {}
    for key in keys["keys"]:
        found = next((name for name in (aliases.get(key, key), key) if name in gathered), None)
        if found is not None:
            state[key] = gathered[found]
    return state


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _offsets(entries: Sequence[HeldTensor]) -> list[int]:
    offsets, position = [], 0
    for entry in entries:
        offsets.append(position)
        position += _numel(entry.shape)
    return offsets
