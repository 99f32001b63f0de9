"""Output directories that training could not write are named before any worker starts, and nothing is left."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from graphpipe.runtime.output_paths import output_paths_problem


def _listing(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_writable_or_creatable_directories_pass_and_nothing_is_made(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    before = _listing(tmp_path)
    assert output_paths_problem(None, None) is None
    assert output_paths_problem(str(tmp_path / "ckpt"), str(tmp_path / "new" / "traces")) is None
    assert _listing(tmp_path) == before


def test_a_file_where_a_directory_is_expected(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("not a directory")
    problem = output_paths_problem(str(tmp_path / "ckpt"), None)
    assert problem == (f"--checkpoint-dir {tmp_path / 'ckpt'} exists but is a file, not a directory; give a "
                       "directory path or move the file away")


def test_a_parent_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("")
    problem = output_paths_problem(None, str(tmp_path / "runs" / "a" / "traces"))
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"--trace {tmp_path / 'runs' / 'a' / 'traces'} cannot be created: its parent "
                              f"{tmp_path / 'runs'} is a file")


def test_checkpoint_dir_is_reported_before_trace(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    problem = output_paths_problem(str(tmp_path / "file"), str(tmp_path / "file"))
    assert problem is not None and problem.startswith("--checkpoint-dir ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod; the probe test below covers it")
def test_a_read_only_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert output_paths_problem(str(locked), None) == (f"--checkpoint-dir {locked} is not writable "
                                                           "(Permission denied); give a directory you can write to")
        problem = output_paths_problem(None, str(locked / "traces"))
        assert problem is not None and f"cannot be created: {locked} is not writable" in problem
    finally:
        locked.chmod(0o755)


def test_a_directory_the_probe_cannot_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    assert output_paths_problem(str(tmp_path), None) == (f"--checkpoint-dir {tmp_path} is not writable "
                                                         "(Read-only file system); give a directory you can write to")
    problem = output_paths_problem(str(tmp_path / "a" / "b"), None)
    assert problem == (f"--checkpoint-dir {tmp_path / 'a' / 'b'} cannot be created: {tmp_path} is not writable "
                       "(Read-only file system); give a directory you can write to")
    assert not (tmp_path / "a").exists()
