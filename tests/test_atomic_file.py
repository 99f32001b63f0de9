"""Files written whole or not at all, with the mode the user's umask gives, and no temporary file left for good
by a writer that was killed; a resume names a newer step whose save was cut short."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from graphpipe.atomic_file import leftovers, write_atomic
from graphpipe.runtime.checkpoint import COMPLETE, latest_intact
from graphpipe.serde import write_json_atomic


def test_a_written_file_gets_the_mode_the_umask_gives_not_a_private_one(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    os.umask(mask)
    write_json_atomic(tmp_path / "plan.json", {"a": 1})
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o666 & ~mask


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "stage_0.pt"
    target.write_text("old")

    def fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, fail)
    assert target.read_text() == "old" and leftovers(target) == []


def test_the_next_write_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    target = tmp_path / "stage_0.pt"
    stale = tmp_path / ".stage_0.pt.ab12cd34"  # what mkstemp named the file of a writer killed midway
    stale.write_text("half")
    other = tmp_path / ".stage_1.pt.ab12cd34"  # another rank's: not ours to remove
    other.write_text("half")
    write_atomic(target, lambda tmp: Path(tmp).write_text("new"))
    assert target.read_text() == "new" and not stale.exists() and other.exists()


def test_resume_names_a_newer_step_whose_save_was_cut_short(tmp_path: Path) -> None:
    (tmp_path / "step_2").mkdir()
    (tmp_path / "step_2" / COMPLETE).write_text('{"step": 2, "num_stages": 0, "files": {}}')
    (tmp_path / "step_3").mkdir()  # no marker: killed while saving
    chosen, skipped = latest_intact(tmp_path)
    assert chosen == tmp_path / "step_2"
    assert skipped == ["step_3 has no complete marker (its save was cut short)"]
