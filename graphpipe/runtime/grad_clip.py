"""Gradient clipping by the global norm of a model split into stages, equal to `clip_grad_norm_` on one device.

`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` scales every gradient by
`min(1, max_norm / (norm + 1e-6))`, where `norm` is the 2-norm of all the model's gradients. Split into
stages, each parameter's gradient lives on the ranks of its stage (the same on each data-parallel replica,
after their all-reduce) and, for a weight several stages share, on every holder (the same summed gradient).
So each rank adds the squares of the gradients it is asked to count (`counted`: each parameter counted by one
rank), one all-reduce over the plan's ranks gives the squared norm, and every rank scales every gradient it
holds by the same factor, before any optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from graphpipe.runtime.comm import Transport

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def clip_global_grad_norm_(counted: Sequence[nn.Parameter], held: Sequence[nn.Parameter], max_norm: float,
                           transport: Transport, ranks: Sequence[int], device: torch.device) -> float:
    """Scale the gradients of `held` so that the global norm is at most `max_norm`; the norm before (every
    rank of `ranks` must call this once, in the same order as its other collectives)."""
    squares = torch.zeros(1, dtype=torch.float64, device=device)
    for param in counted:
        if param.grad is not None:
            squares += param.grad.detach().to(torch.float64).square().sum()
    transport.all_reduce_sum_(squares, ranks)
    norm = float(squares.sqrt().item())
    scale = min(1.0, max_norm / (norm + EPS))
    for param in held:
        if param.grad is not None:
            param.grad.detach().mul_(scale)
    return norm
