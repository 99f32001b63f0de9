"""Read some tensors of a weights file: a `.safetensors` file or a `torch.distributed.checkpoint` directory.

A rank that trains one stage loads only that stage's keys. Safetensors maps the file and reads the
wanted tensors. A distributed checkpoint is read here rather than by `dcp.load`, because both its
`.metadata` and its `*.distcp` blobs are pickles and nothing read from a user's file may run code:
`.metadata` goes through an unpickler that builds only DCP's own metadata dataclasses, `torch.Size`,
dtypes and layouts (any other global, and state set on anything but those dataclasses, is refused),
and each wanted chunk is a `torch.save` blob read with `torch.load(weights_only=True)` and placed at
its offsets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from graphpipe.errors import WeightsError
from graphpipe.runtime.dcp_reader import DcpDirectory

__all__ = ["WeightsFile"]


# safetensors' dtype names (the header's "dtype" field) as torch dtypes
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
                       "F8_E5M2": torch.float8_e5m2}


class WeightsFile:
    """The names, shapes and dtypes a weights file holds, and a way to read some of them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir() and (self.path / ".metadata").is_file():
            self.kind = "dcp"
        elif self.path.is_file() and self.path.suffix == ".safetensors":
            self.kind = "safetensors"
        elif not self.path.exists():
            raise WeightsError(f"weights file {self.path} does not exist")
        else:
            raise WeightsError(f"weights {self.path}: expected a .safetensors file or a torch.distributed."
                               "checkpoint directory (with a .metadata file)")
        self._dcp = DcpDirectory(self.path) if self.kind == "dcp" else None
        if self._dcp is not None:
            self.shapes, self.dtypes = self._dcp.shapes, self._dcp.dtypes
        else:
            self.shapes, self.dtypes = self._read_header()

    def _read_header(self) -> tuple[dict[str, tuple[int, ...]], dict[str, torch.dtype | None]]:
        """Shapes and dtypes from the safetensors header (no tensor is read); WeightsError for a file that is
        not safetensors or is cut short."""
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as handle:
                slices = {key: handle.get_slice(key) for key in handle.keys()}  # noqa: SIM118
                return ({key: tuple(part.get_shape()) for key, part in slices.items()},
                        {key: _SAFETENSORS_DTYPES.get(part.get_dtype()) for key, part in slices.items()})
        except Exception as err:  # safetensors raises its own SafetensorError, or OSError
            raise WeightsError(f"weights {self.path} is not a readable .safetensors file ({err}); it is damaged or "
                               "of another format: save it again with safetensors.torch.save_file or "
                               "`graphpipe export`") from None

    def check(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]], what: str = "this stage") -> None:
        """WeightsError unless the file holds every key of `wanted` ({key: (shape, dtype)}) with that shape
        and a dtype that converts without losing meaning (floats to floats; integers into a float parameter
        would be cast silently, so they are refused)."""
        missing = sorted(key for key in wanted if key not in self.shapes)
        if missing:
            raise WeightsError(f"weights {self.path} lack {len(missing)} of the {len(wanted)} tensors {what} "
                               f"needs (first: {missing[:3]}); it holds {len(self.shapes)} tensors: save the "
                               "weights of this model (`graphpipe export`, or its state_dict with safetensors)")
        wrong = [f"{key}: {list(self.shapes[key])} in the file, {list(shape)} in the model"
                 for key, (shape, _) in wanted.items() if self.shapes[key] != tuple(shape)]
        if wrong:
            raise WeightsError(f"weights {self.path} do not fit the model ({len(wrong)} shapes differ; first: "
                               f"{wrong[0]}): give the weights of the model and --set options they were saved from")
        kinds = [f"{key} is {_name(self.dtypes.get(key))} in the file but {_name(dtype)} in the model"
                 for key, (_, dtype) in wanted.items() if not _same_kind(self.dtypes.get(key), dtype)]
        if kinds:
            raise WeightsError(f"weights {self.path}: {len(kinds)} tensor(s) of another kind than the model's "
                               f"(first: {kinds[0]}); casting would change their meaning: save them as "
                               "the model's dtype (e.g. tensor.float()) or fix the model's dtype")

    def read(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        """{file key: CPU tensor} for `wanted` ({key: (shape, dtype)}); WeightsError naming what is missing
        or has another shape or kind (`check`)."""
        self.check(wanted)
        if self._dcp is not None:
            return self._dcp.read(wanted)
        return self._read_safetensors(wanted)

    def _read_safetensors(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            return {key: handle.get_tensor(key).to(dtype) for key, (_, dtype) in wanted.items()}


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype.is_floating_point or dtype.is_complex else "int"


def _same_kind(found: torch.dtype | None, wanted: torch.dtype) -> bool:
    """Whether file data of dtype `found` may be cast to `wanted` (None: a dtype torch does not name)."""
    return found is None or _kind(found) == _kind(wanted)


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.") if dtype is not None else "?"
