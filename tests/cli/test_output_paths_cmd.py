"""`graphpipe train` with a --checkpoint-dir it could not write exits 2 with one line, before planning or workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import graphpipe.cli.train_cmd as train_cmd
import graphpipe.runtime.launch as launch_module
from graphpipe.cli import main as cli_main


def test_checkpoint_dir_that_is_a_file_stops_train_before_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("train went past its option checks")

    monkeypatch.setattr(launch_module, "launch", refuse)
    monkeypatch.setattr(train_cmd, "_plan_now", refuse)
    target = tmp_path / "ckpt"
    target.write_text("a file, not a directory")
    argv = ["train", "--model", "toy_chain", "--nproc", "2", "--steps", "1", "--checkpoint-dir", str(target)]
    assert cli_main.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert f"--checkpoint-dir {target} exists but is a file" in lines[0]
    assert target.read_text() == "a file, not a directory"
