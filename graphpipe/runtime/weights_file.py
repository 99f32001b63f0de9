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

from graphpipe.errors import TrainingError
from graphpipe.runtime.dcp_reader import DcpDirectory

__all__ = ["WeightsFile"]


class WeightsFile:
    """The names and shapes a weights file holds, and a way to read some of them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir() and (self.path / ".metadata").is_file():
            self.kind = "dcp"
        elif self.path.is_file() and self.path.suffix == ".safetensors":
            self.kind = "safetensors"
        elif not self.path.exists():
            raise TrainingError(f"weights file {self.path} does not exist")
        else:
            raise TrainingError(f"weights {self.path}: expected a .safetensors file or a torch.distributed."
                                "checkpoint directory (with a .metadata file)")
        self._dcp = DcpDirectory(self.path) if self.kind == "dcp" else None
        self.shapes = self._dcp.shapes if self._dcp is not None else self._read_shapes()

    def _read_shapes(self) -> dict[str, tuple[int, ...]]:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118

    def read(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        """{file key: CPU tensor} for `wanted` ({key: (shape, dtype)}); TrainingError naming what is missing
        or has another shape."""
        missing = sorted(key for key in wanted if key not in self.shapes)
        if missing:
            raise TrainingError(f"weights {self.path} lack {len(missing)} of the {len(wanted)} tensors this stage "
                                f"needs (first: {missing[:3]}); it holds {len(self.shapes)} tensors")
        wrong = [f"{key}: {list(self.shapes[key])} in the file, {list(shape)} in the model"
                 for key, (shape, _) in wanted.items() if self.shapes[key] != tuple(shape)]
        if wrong:
            raise TrainingError(f"weights {self.path} do not fit the model ({len(wrong)} shapes differ; first: "
                                f"{wrong[0]})")
        if self._dcp is not None:
            return self._dcp.read(wanted)
        return self._read_safetensors(wanted)

    def _read_safetensors(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            return {key: handle.get_tensor(key).to(dtype) for key, (_, dtype) in wanted.items()}
