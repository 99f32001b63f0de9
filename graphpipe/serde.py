"""JSON helpers shared by the immutable spine types (plans on disk are JSON, never pickle).

`JsonFile.load` is the one place where a plan, cost table or op graph file is read, so a
missing, empty, truncated or foreign file is explained there, naming the file, and never
surfaces as a raw FileNotFoundError, JSONDecodeError or KeyError.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from typing_extensions import Self

from graphpipe.atomic_file import write_atomic
from graphpipe.errors import GraphPipeError, InputFileError

# The command that writes each file type, for the hint in a load error.
_MADE_BY = {"Plan": "graphpipe plan -o plan.json", "CostTable": "graphpipe profile -o costs.json",
            "OpGraph": "graphpipe capture -o graph.json"}


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON whole or not at all (`graphpipe.atomic_file`)."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=1)
            handle.write("\n")

    write_atomic(path, write)


def read_json_object(path: str | os.PathLike[str], kind: str = "JSON", made_by: str = "") -> dict[str, Any]:
    """The JSON object in `path`; InputFileError saying what is wrong with the file (`kind` names it in
    the message, `made_by` is the command that writes a good one)."""
    label = f"{kind} file {os.fspath(path)}"
    again = f"; write it again with `{made_by}`" if made_by else ""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        make = f" or make one with `{made_by}`" if made_by else ""
        raise InputFileError(f"{label} does not exist; check the path{make}") from None
    except IsADirectoryError:
        raise InputFileError(f"{label} is a directory; give the path of the file") from None
    except UnicodeDecodeError:
        raise InputFileError(f"{label} is not text (binary data, not JSON){again}") from None
    except OSError as err:
        raise InputFileError(f"{label} cannot be read ({err.strerror or err})") from None
    data = _parse(text, label, again)
    if not isinstance(data, dict):
        raise InputFileError(f"{label} holds a JSON {_json_type(data)}, not an object{again}")
    return data


def _parse(text: str, label: str, again: str) -> Any:
    if not text.strip():
        raise InputFileError(f"{label} is empty{again}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        if _cut_short(text, err):
            raise InputFileError(f"{label} ends early at line {err.lineno} (truncated?): {err.msg}{again}") from None
        raise InputFileError(f"{label} is not valid JSON (line {err.lineno}, column {err.colno}: "
                             f"{err.msg}){again}") from None


def _cut_short(text: str, err: json.JSONDecodeError) -> bool:
    """The error is the end of the text: an object or list that never closes (a copy or a write cut short)."""
    body = text.strip()
    return err.pos >= len(body) or (body[:1] in "{[" and body[-1:] not in "}]")


def _json_type(data: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(data), "number")


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
        """Read a file `save` wrote; InputFileError naming the file and what is wrong with it."""
        kind = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", cls.__name__).lower()  # CostTable -> "cost table"
        made_by = _MADE_BY.get(cls.__name__, "")
        data = read_json_object(path, kind, made_by)
        try:
            return cls.from_dict(data)
        except (GraphPipeError, KeyError, TypeError, ValueError, AttributeError) as err:
            again = f"; write it again with `{made_by}`" if made_by else ""
            raise InputFileError(f"{kind} file {os.fspath(path)} {_what_is_wrong(err, data)}{again}") from err


def _what_is_wrong(err: Exception, data: dict[str, Any]) -> str:
    """The problem `from_dict` hit, in words; a missing or malformed field names the file's format tag."""
    tag = f" (its format is {data['format']!r})" if "format" in data else " (it has no format tag)"
    if isinstance(err, KeyError):
        return f"has no {err.args[0]!r} field{tag}"
    if isinstance(err, GraphPipeError):
        return f"is not usable: {err}"
    return f"has a malformed field{tag}: {type(err).__name__}: {err}"
