"""Run a stage of a graph captured at one sample (`export-static`) on a share of any size, sample by sample.

A model whose forward fixes the batch size (a vision-language model that loops over its images,
say) is captured with static shapes, and a static graph's ops can depend on the batch it was
captured at (one `getitem` per image). graphpipe captures such a model at one sample, so that
every rank splits the very graph the plan was made on, and runs each stage on its share one
sample at a time: the inputs cut along their batch axes, the outputs concatenated along the
first dimension (the axis crossing values are sent along). Autograd sees one graph per sample and
sums their gradients as it would over the rows of one call. Batch-coupled ops (train-mode
BatchNorm) then see one sample per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from graphpipe.errors import TrainingError

__all__ = ["run_per_sample"]


def run_per_sample(call: Callable[..., dict[str, Any]], data: Mapping[str, Any], data_axes: Mapping[str, int | None],
                   received: Mapping[str, Any], samples: int) -> dict[str, Any]:
    """`call(data_i, received_i)` for each of the share's `samples` samples, the results concatenated sample after
    sample. A received value holds the same rows for every sample (one, or its tokens where the batch is
    flattened with the sequence)."""
    results = []
    for idx in range(samples):
        one_data = {name: _sample(value, idx, samples, data_axes.get(name, 0)) for name, value in data.items()}
        one_received = {name: _sample(value, idx, samples, 0) for name, value in received.items()}
        results.append(call(one_data, one_received))
    return {key: _joined([result[key] for result in results], key) for key in results[0]}


def _sample(value: Any, idx: int, samples: int, axis: int | None) -> Any:
    if axis is None or not isinstance(value, torch.Tensor) or value.dim() <= axis:
        return value
    rows = value.shape[axis]
    if rows % samples:
        raise TrainingError(f"an input of {rows} rows along axis {axis} does not hold {samples} samples")
    per = rows // samples
    return value.narrow(axis, idx * per, per)


def _joined(values: list[Any], key: str) -> Any:
    flats = [pytree.tree_flatten(value)[0] for value in values]
    spec = pytree.tree_structure(values[0])
    joined = []
    for position, first in enumerate(flats[0]):
        column = [flat[position] for flat in flats]
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            joined.append(torch.cat(column))
        elif all(item is first or item == first for item in column):
            joined.append(first)
        else:
            raise TrainingError(f"output {key!r} of a stage captured at one sample holds a value without a batch "
                                f"dimension that differs between samples ({type(first).__name__}); it cannot be "
                                "joined into one batch")
    return pytree.tree_unflatten(joined, spec)
