"""Training logs: read back line by line (a bad line named), drawn as curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphpipe.errors import InputFileError
from graphpipe.runtime.training_log import plot_training_log, read_training_log


def _log(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_log_is_read_in_order_and_drawn(tmp_path: Path) -> None:
    rows = [{"step": step, "loss": 1.0 / step, "samples_per_s": 100.0 + step, "learning_rate": 1e-3,
             "grad_norm": None} for step in range(1, 6)]
    assert read_training_log(_log(tmp_path, rows)) == rows
    written = plot_training_log(rows, tmp_path / "curves.png")
    assert Path(written).stat().st_size > 5_000


@pytest.mark.parametrize(("text", "said"), [("{\"step\": 1, \"loss\": 0.5}\nnot json\n", "line 2: not JSON"),
                                           ("[1, 2]\n", "line 1: not a step"), ("\n", "holds no step")])
def test_a_file_that_is_not_a_log_is_refused_naming_the_line(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(text)
    with pytest.raises(InputFileError, match=said):
        read_training_log(path)
