"""Read some tensors of a weights file: a `.safetensors` file or a `torch.distributed.checkpoint` directory.

A rank that trains one stage loads only that stage's keys: safetensors maps the file and
reads the wanted tensors; a distributed checkpoint's metadata says what it holds and
`dcp.load` (without collectives: each rank reads on its own) fills only the keys asked for.
Nothing is unpickled.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from graphpipe.errors import TrainingError

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
        self.shapes = self._read_shapes()

    def _read_shapes(self) -> dict[str, tuple[int, ...]]:
        if self.kind == "safetensors":
            from safetensors import safe_open

            with safe_open(str(self.path), framework="pt") as handle:
                return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        metadata = FileSystemReader(str(self.path)).read_metadata().state_dict_metadata
        return {key: tuple(item.size) for key, item in metadata.items() if isinstance(item, TensorStorageMetadata)}

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
        if self.kind == "safetensors":
            return self._read_safetensors(wanted)
        return self._read_dcp(wanted)

    def _read_safetensors(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            return {key: handle.get_tensor(key).to(dtype) for key, (_, dtype) in wanted.items()}

    def _read_dcp(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict_loader import load

        state = {key: torch.empty(shape, dtype=dtype) for key, (shape, dtype) in wanted.items()}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=".*single process.*")
            load(state, checkpoint_id=str(self.path), no_dist=True)
        return state
