"""Read a `torch.distributed.checkpoint`'s `.metadata` without running code from it.

DCP pickles its metadata. A crafted pickle runs whatever it names, so the file goes through the
pure-Python unpickler with `find_class` restricted to DCP's own metadata dataclasses, `torch.Size`,
dtypes and the layout lookup, and with BUILD (setting state) allowed only on those dataclasses'
instances: any other global, or state set on a class or a shared object, is refused with a
`WeightsError` naming it.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath
from typing import Any, ClassVar

import torch

from graphpipe.errors import WeightsError

__all__ = ["load_metadata"]

_DCP_NAMES: dict[str, tuple[str, ...]] = {
    "torch.distributed.checkpoint.metadata": ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "TensorProperties", "ChunkStorageMetadata", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo", "_StoragePrefix"),
    "torch.distributed._shard.sharded_tensor.metadata": ("TensorProperties", "MEM_FORMAT_ENCODING"),
    "torch.serialization": ("_get_layout",),
    "torch": ("Size",),
    "collections": ("OrderedDict",),
}
# A checkpoint id saved as a Path: rebuilt as a pure path (no file-system access, any platform).
_PATHS: dict[str, type[PurePath]] = {"Path": PurePath, "PurePath": PurePath, "PosixPath": PurePosixPath,
                                     "PurePosixPath": PurePosixPath, "WindowsPath": PureWindowsPath,
                                     "PureWindowsPath": PureWindowsPath}


def load_metadata(path: Path) -> Any:
    """DCP's `.metadata`, unpickled with only its own classes reachable; WeightsError for anything else."""
    try:
        with open(path, "rb") as handle:
            return _MetadataUnpickler(handle).load()
    except _RefusedError as refused:
        raise WeightsError(f"weights {path} refused: unpickling it would build {refused}, which DCP metadata never "
                            "holds and which could run code; if you trust the checkpoint, convert it with "
                            "torch.distributed.checkpoint.format_utils.dcp_to_torch_save and save that as "
                            ".safetensors") from None
    except Exception as error:
        raise WeightsError(f"weights {path} is not a readable torch.distributed.checkpoint metadata file "
                            f"({type(error).__name__}: {error}); re-save the checkpoint or give a .safetensors "
                            "file") from None


class _RefusedError(Exception):
    """A global or a state assignment the metadata unpickler does not allow."""


@functools.cache
def _allowed() -> dict[tuple[str, str], Any]:
    """{(module, name): object} the metadata may name: DCP's classes, torch.Size, dtypes, the layout lookup."""
    import importlib

    allowed: dict[tuple[str, str], Any] = {("pathlib", name): cls for name, cls in _PATHS.items()}
    for module_name, names in _DCP_NAMES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a torch without it: checkpoints naming it are refused
            continue
        allowed.update({(module_name, name): getattr(module, name) for name in names if hasattr(module, name)})
    allowed.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
    return allowed


@functools.cache
def _buildable() -> tuple[type, ...]:
    """The classes whose instances the metadata may set state on (DCP's dataclasses)."""
    return tuple(obj for obj in _allowed().values() if isinstance(obj, type) and dataclasses.is_dataclass(obj))


def _load_build(unpickler: Any) -> None:
    """BUILD only on DCP's dataclass instances: state set on a class or a shared object would outlive the load."""
    target = unpickler.stack[-2]
    if not isinstance(target, _buildable()):
        raise _RefusedError(f"state on a {type(target).__name__}")
    _BASE_BUILD(unpickler)


_BASE_BUILD = pickle._Unpickler.dispatch[pickle.BUILD[0]]


class _MetadataUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (its BUILD can be checked), resolving only the globals `_allowed` lists."""

    dispatch: ClassVar[dict[int, Any]] = {**pickle._Unpickler.dispatch, pickle.BUILD[0]: _load_build}

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _allowed()[(module, name)]
        except KeyError:
            raise _RefusedError(f"{module}.{name}") from None
