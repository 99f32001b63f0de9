"""Check the directories training writes into (--checkpoint-dir, --trace) before any worker starts, and the
files a command writes (plan -o, capture -o, simulate --gantt) before it works.

Otherwise a path that cannot be written is found at the first save, after the training (or the search) it was
meant to keep. Nothing is created: an existing directory is probed with an unnamed temporary file
(gone when closed), a missing one through its nearest existing ancestor, where it would be created.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["output_file_problem", "output_paths_problem"]


def output_paths_problem(checkpoint_dir: str | None, trace_dir: str | None) -> str | None:
    """The first output directory training could not write, in one line with the fix, or None."""
    for option, directory in (("--checkpoint-dir", checkpoint_dir), ("--trace", trace_dir)):
        if directory:
            problem = _directory_problem(option, directory)
            if problem:
                return problem
    return None


def output_file_problem(option: str, path: str, example: str) -> str | None:
    """Why the file `path` (given as `option`) could not be written, in one line with the fix, or None.
    Its missing folders are fine where they can be created (the commands create them); `example` is a
    file name to suggest when `path` is a directory."""
    if os.path.isdir(path):
        return f"{option} {path} is a directory; give a file path, e.g. {os.path.join(path, example)}"
    problem = _directory_problem(f"{option} {path}: the folder", os.path.dirname(os.path.abspath(path)))
    if problem is not None:
        return problem
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{option} {path} is not writable (permissions); give a path you can write, or change its mode"
    return None


def _directory_problem(option: str, directory: str) -> str | None:
    if os.path.lexists(directory) and not os.path.isdir(directory):
        return (f"{option} {directory} exists but is a file, not a directory; give a directory path or move the "
                "file away")
    existing = _nearest_existing(Path(os.path.abspath(directory)))
    if not os.path.isdir(existing):
        return (f"{option} {directory} cannot be created: its parent {existing} is a file, not a directory; give a "
                "path whose parents are directories")
    error = _write_error(existing)
    if error is None:
        return None
    if existing == Path(os.path.abspath(directory)):
        return f"{option} {directory} is not writable ({error}); give a directory you can write to"
    return (f"{option} {directory} cannot be created: {existing} is not writable ({error}); give a directory you "
            "can write to")


def _nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (the root always does)."""
    while not os.path.lexists(path) and path.parent != path:
        path = path.parent
    return path


def _write_error(directory: Path) -> str | None:
    """Why a file cannot be made in `directory`, or None; the probe has no name there and leaves nothing."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as error:
        return error.strerror or str(error)
