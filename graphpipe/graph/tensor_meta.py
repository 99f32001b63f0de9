"""Shape, dtype and size of one tensor that an op produces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TensorMeta"]

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorMeta:
    """One tensor as captured with the example batch (batch dimension first when it has one)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    batch_axis: int | None = 0  # the dimension that grows with the batch; None: the same for every batch

    def __post_init__(self) -> None:
        if any(dim < 0 for dim in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        if self.batch_axis is not None and not 0 <= self.batch_axis < max(len(self.shape), 1):
            raise ValueError(f"batch axis {self.batch_axis} outside shape {self.shape}")

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def num_bytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "batch_axis": self.batch_axis}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorMeta:
        return cls(shape=tuple(data["shape"]), dtype=data["dtype"], batch_axis=data.get("batch_axis", 0))

    def __str__(self) -> str:
        return f"{self.dtype}[{'x'.join(map(str, self.shape))}]"
