"""The model's outputs for a whole mini-batch from the pieces the sink's ranks computed (`trainer.evaluate`).

Each rank of the sink stage computes shares of its micro-batches (`graphpipe.runtime.lowering`), so its
outputs are pieces `(start, stop, output)` of the mini-batch's samples. A tensor leaf of the output (in a
tuple, list or mapping, as the model returns it) is written into a mini-batch-sized tensor of zeros at its
rows and summed over the sink's ranks: every rank of the sink ends with the same whole outputs, in sample
order. A leaf without a batch dimension (a 0-d tensor, a number) is taken from the first piece.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from graphpipe.errors import TrainingError
from graphpipe.runtime.comm import Transport

__all__ = ["assemble_outputs"]

Piece = tuple[int, int, Any]  # samples [start, stop) and the output computed for them


def assemble_outputs(pieces: Sequence[Piece], num_samples: int, transport: Transport,
                     ranks: Sequence[int]) -> Any:
    """The outputs of samples [0, num_samples) on every rank of `ranks` (each passes its own pieces)."""
    ordered = sorted(pieces, key=lambda piece: piece[0])
    if not ordered:
        raise TrainingError("the sink computed no samples: nothing to assemble")
    return _leaf_tree(ordered, [output for _, _, output in ordered], num_samples, transport, ranks)


def _leaf_tree(pieces: Sequence[Piece], values: list[Any], num_samples: int, transport: Transport,
               ranks: Sequence[int]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return _whole(pieces, values, num_samples, transport, ranks)
    if isinstance(first, (tuple, list)):
        items = [_leaf_tree(pieces, [value[i] for value in values], num_samples, transport, ranks)
                 for i in range(len(first))]
        return type(first)(items) if not hasattr(first, "_fields") else type(first)(*items)
    if isinstance(first, Mapping):
        rebuilt = {key: _leaf_tree(pieces, [value[key] for value in values], num_samples, transport, ranks)
                   for key in first}
        try:
            return type(first)(**rebuilt)  # a library's output class (keyword construction)
        except TypeError:
            return rebuilt
    return first


def _whole(pieces: Sequence[Piece], values: list[torch.Tensor], num_samples: int, transport: Transport,
           ranks: Sequence[int]) -> torch.Tensor:
    """One tensor of every sample's rows: this rank's pieces in place, the other ranks' summed in."""
    start, stop, _ = pieces[0]
    per_sample, remainder = divmod(values[0].shape[0], stop - start)
    if remainder or per_sample == 0:
        raise TrainingError(f"an output with {values[0].shape[0]} rows for {stop - start} samples cannot be "
                            "assembled: the model's outputs need the batch (or the batch flattened) first")
    whole = values[0].new_zeros((num_samples * per_sample, *values[0].shape[1:]))
    for (start, stop, _), value in zip(pieces, values):
        whole[start * per_sample:stop * per_sample] = value.detach()
    if whole.dtype == torch.bool:
        summed = whole.to(torch.uint8)
        transport.all_reduce_sum_(summed, ranks)
        return summed.bool()
    transport.all_reduce_sum_(whole, ranks)
    return whole
