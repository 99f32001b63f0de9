"""JSON helpers shared by the immutable spine types (plans on disk are JSON, never pickle)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from typing_extensions import Self


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON to a temporary file beside `path`, then rename: no half-written file on failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as handle:
        return json.load(handle)


def int_keys(mapping: dict[str, Any]) -> dict[int, Any]:
    """JSON object keys are strings; restore the integer keys of a mapping."""
    return {int(key): value for key, value in mapping.items()}


class JsonFile:
    """Mixin: `save(path)` / `load(path)` for a type with `to_dict()` and `from_dict()`."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} must define to_dict")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        raise TypeError(f"{cls.__name__} must define from_dict")

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        return cls.from_dict(read_json(path))
