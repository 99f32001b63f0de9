"""JSON helpers shared by the immutable spine types (plans on disk are JSON, never pickle)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
