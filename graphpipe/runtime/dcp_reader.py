"""Read some tensors of a `torch.distributed.checkpoint` directory without `dcp.load`, and without running code.

`dcp.load` unpickles the metadata and any non-tensor entry; here the metadata goes through
`graphpipe.runtime.dcp_metadata`, and each wanted chunk (a `torch.save` blob in a `*.distcp` file,
at the offset the metadata records) is read with `torch.load(weights_only=True)`, checked and
placed at its offsets in the tensor.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import torch

from graphpipe.errors import WeightsError
from graphpipe.runtime.dcp_metadata import load_metadata

__all__ = ["DcpDirectory"]


class DcpDirectory:
    """A distributed checkpoint written by `FileSystemWriter`: its tensors' shapes, and their chunks' places."""

    def __init__(self, root: Path) -> None:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.root = root
        metadata = load_metadata(root / ".metadata")
        tensors = {key: item for key, item in _field(metadata, "state_dict_metadata", dict, root).items()
                   if isinstance(item, TensorStorageMetadata)}
        self.places = _storage_places(_field(metadata, "storage_data", dict, root), root)
        try:
            self.shapes = {str(key): tuple(int(n) for n in item.size) for key, item in tensors.items()}
            self.dtypes = {str(key): _dtype(item) for key, item in tensors.items()}
            self.chunks = {str(key): [(tuple(int(n) for n in chunk.offsets), tuple(int(n) for n in chunk.sizes))
                                      for chunk in item.chunks] for key, item in tensors.items()}
        except (AttributeError, TypeError, ValueError) as error:
            raise WeightsError(f"weights {root}/.metadata: a tensor entry is malformed ({error}); re-save the "
                                "checkpoint with torch.distributed.checkpoint.save") from None

    def read(self, wanted: Mapping[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        """{key: CPU tensor of the asked dtype}, each put together from its chunks."""
        with ExitStack() as stack:
            handles: dict[str, BinaryIO] = {}
            return {key: self._tensor(key, torch.Size(shape), dtype, handles, stack)
                    for key, (shape, dtype) in wanted.items()}

    def _tensor(self, key: str, shape: torch.Size, dtype: torch.dtype, handles: dict[str, BinaryIO],
                stack: ExitStack) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype)
        covered = 0
        for offsets, sizes in self.chunks[key]:
            if len(offsets) != len(shape) or len(sizes) != len(shape) or any(
                    o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, shape)):
                raise WeightsError(f"weights {self.root}: a chunk of {key!r} at {list(offsets)} of size "
                                    f"{list(sizes)} lies outside its shape {list(shape)}; the checkpoint is damaged")
            part = self._chunk(key, offsets, handles, stack)
            if tuple(part.shape) != sizes:
                raise WeightsError(f"weights {self.root}: the chunk of {key!r} at {list(offsets)} holds "
                                    f"{list(part.shape)}, the metadata says {list(sizes)}; the checkpoint is damaged")
            out[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].copy_(part)
            covered += math.prod(sizes)
        if covered != math.prod(shape):
            raise WeightsError(f"weights {self.root}: the chunks of {key!r} cover {covered} of its "
                                f"{math.prod(shape)} elements; the checkpoint is incomplete")
        return out

    def _chunk(self, key: str, offsets: tuple[int, ...], handles: dict[str, BinaryIO],
               stack: ExitStack) -> torch.Tensor:
        place = self.places.get((key, offsets))
        if place is None:
            raise WeightsError(f"weights {self.root}/.metadata: no storage entry for {key!r} at {list(offsets)}; "
                                "the checkpoint is incomplete")
        relative, start, length, transforms = place
        if relative not in handles:
            handles[relative] = stack.enter_context(open(self.root / relative, "rb"))  # noqa: SIM115
        handle = handles[relative]
        handle.seek(start)
        blob = handle.read(length)
        if len(blob) != length:
            raise WeightsError(f"weights {self.root / relative}: {key!r} needs bytes {start}..{start + length} but "
                                f"the file ends first; the checkpoint is truncated")
        return _tensor_blob(_untransformed(blob, transforms, self.root / relative), key, self.root / relative)


def _dtype(item: Any) -> torch.dtype | None:
    """A tensor entry's dtype, None where the metadata names none."""
    dtype = getattr(getattr(item, "properties", None), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _field(metadata: object, name: str, kind: type, root: Path) -> Any:
    value = getattr(metadata, name, None)
    if not isinstance(value, kind):
        raise WeightsError(f"weights {root}/.metadata has no {name} {kind.__name__}; it is not a "
                            "torch.distributed.checkpoint written by FileSystemWriter")
    return value


def _storage_places(storage: dict[Any, Any], root: Path) -> dict[tuple[str, tuple[int, ...]],
                                                                  tuple[str, int, int, tuple[str, ...]]]:
    """{(key, chunk offsets): (file, start, length, stream transforms)}, with files kept inside `root`."""
    places = {}
    for index, info in storage.items():
        try:
            relative = str(info.relative_path)
            place = (relative, int(info.offset), int(info.length),
                     tuple(str(t) for t in getattr(info, "transform_descriptors", None) or ()))
            where = (str(index.fqn), tuple(int(n) for n in index.offset))
        except (AttributeError, TypeError, ValueError) as error:
            raise WeightsError(f"weights {root}/.metadata: a storage entry is malformed ({error}); re-save the "
                                "checkpoint with torch.distributed.checkpoint.save") from None
        path = PurePosixPath(relative)
        if not relative or path.is_absolute() or ".." in path.parts:
            raise WeightsError(f"weights {root}/.metadata points at {relative!r}, outside the checkpoint "
                                "directory; refusing to read it")
        places[where] = place
    return places


def _untransformed(blob: bytes, transforms: tuple[str, ...], path: Path) -> bytes:
    """Undo the stream transforms (e.g. compression) DCP recorded for a blob."""
    if not transforms:
        return blob
    from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension

    try:
        stream: Any = io.BytesIO(blob)
        for extension in ExtensionRegistry().from_descriptor_list(transforms):
            if isinstance(extension, StreamTransformExtension):
                stream = extension.transform_from(stream)
        return bytes(stream.read())
    except Exception as error:  # an unknown transform or a missing codec package
        raise WeightsError(f"weights {path}: cannot undo the stream transforms {list(transforms)} ({error}); "
                            "install the codec or re-save the checkpoint without them") from None


def _tensor_blob(blob: bytes, key: str, path: Path) -> torch.Tensor:
    try:
        tensor = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as error:  # weights_only refuses anything but tensors and plain containers
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WeightsError(f"weights {path}: the blob of {key!r} is not a plain tensor ({first}); re-save "
                            "the checkpoint with torch.distributed.checkpoint.save") from None
    if not isinstance(tensor, torch.Tensor):
        raise WeightsError(f"weights {path}: the blob of {key!r} holds a {type(tensor).__name__}, not a tensor")
    return tensor
