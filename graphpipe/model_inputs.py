"""A model's example inputs as positional and keyword arguments, and their flat list of leaves.

Users pass one tensor, a tuple or list (positional arguments), a dict (keyword arguments),
or `ModelInputs(args=..., kwargs=...)` for both. Capture and the runtime flatten them the
same way (`torch.utils._pytree`), so the i-th leaf is the i-th input op of the graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from graphpipe.errors import GraphCaptureError

__all__ = ["ModelInputs", "as_model_inputs"]


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """Positional and keyword arguments of one call of the model (batch first in every batch tensor)."""

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def leaves(self) -> list[Any]:
        """Every leaf (tensor or constant) in the order capture numbers the inputs."""
        return pytree.tree_leaves((self.args, dict(self.kwargs)))

    def spec(self) -> pytree.TreeSpec:
        return pytree.tree_structure((self.args, dict(self.kwargs)))

    def batch_size(self) -> int:
        """The first dimension of the first tensor: the example's number of samples."""
        first = next((leaf for leaf in self.leaves() if isinstance(leaf, torch.Tensor)), None)
        if first is None or first.dim() == 0:
            got = "no tensor" if first is None else "a 0-d tensor"
            raise GraphCaptureError(
                f"the example inputs hold {got}; pass at least one tensor with the batch as its first dimension")
        return int(first.shape[0])

    def map_tensors(self, fn: Any) -> ModelInputs:
        """The same inputs with `fn` applied to every tensor leaf."""
        args, kwargs = pytree.tree_map_only(torch.Tensor, fn, (self.args, dict(self.kwargs)))
        return ModelInputs(args=tuple(args), kwargs=kwargs)

    def with_batch_size(self, size: int) -> ModelInputs:
        """The inputs with `size` samples: every tensor whose first dimension is the batch cut to its first rows,
        or its rows repeated in turn where `size` is larger."""
        batch = self.batch_size()
        rows = torch.arange(size) % batch
        return self.map_tensors(lambda t: t[rows.to(t.device)] if t.dim() > 0 and t.shape[0] == batch else t)


def as_model_inputs(example: Any) -> ModelInputs:
    """Normalise a tensor, tuple/list, dict or `ModelInputs` into `ModelInputs`."""
    if isinstance(example, ModelInputs):
        return example
    if isinstance(example, torch.Tensor):
        return ModelInputs(args=(example,))
    if isinstance(example, (tuple, list)):
        return ModelInputs(args=tuple(example))
    if isinstance(example, Mapping):
        bad = [key for key in example if not isinstance(key, str)]
        if bad:
            raise GraphCaptureError(f"keyword example inputs need string keys, got {bad[:3]}")
        return ModelInputs(kwargs=dict(example))
    raise GraphCaptureError(
        f"example inputs must be a tensor, a tuple of positional arguments, a dict of keyword arguments or "
        f"graphpipe.ModelInputs(args=..., kwargs=...), got {type(example).__name__}")
