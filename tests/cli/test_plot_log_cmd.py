"""`graphpipe plot-log`: a training log's curves from the command line; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphpipe.cli import plot_log_cmd
from graphpipe.errors import UsageError
from tests.cli.run_command import run_command


def test_plot_log_draws_the_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.jsonl"
    log.write_text("".join(json.dumps({"step": step, "loss": 2.0 - step / 10, "samples_per_s": 50.0}) + "\n"
                           for step in range(1, 4)))
    assert run_command(plot_log_cmd, ["plot-log", str(log), "-o", str(tmp_path / "c.png")]) == 0
    assert "3 steps (1..3): loss 1.9 -> 1.7" in capsys.readouterr().out
    assert (tmp_path / "c.png").stat().st_size > 5_000


def test_plot_log_refuses_a_missing_log_and_an_unwritable_picture(tmp_path: Path) -> None:
    """Usage errors: `graphpipe` prints them in one line and exits 2."""
    log = tmp_path / "train.jsonl"
    with pytest.raises(UsageError, match="cannot read training log"):
        run_command(plot_log_cmd, ["plot-log", str(log)])
    log.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    with pytest.raises(UsageError, match="cannot write"):
        run_command(plot_log_cmd, ["plot-log", str(log), "-o", str(tmp_path / "nowhere" / "c.png")])


def test_plot_log_draws_the_eval_loss_beside_the_training_loss(tmp_path: Path) -> None:
    from graphpipe.runtime.training_log import plot_training_log

    rows = [{"step": step, "loss": 2.0 - step / 10, "samples_per_s": 50.0,
             "eval_loss": 1.5 if step == 3 else None} for step in range(1, 4)]
    import matplotlib.pyplot as plt

    seen: list[list[str]] = []
    original = plt.Figure.savefig

    def spy(fig: plt.Figure, *args: object, **kwargs: object) -> None:
        seen.append([line.get_label() for line in fig.axes[0].lines])
        original(fig, *args, **kwargs)

    plt.Figure.savefig = spy  # type: ignore[method-assign]
    try:
        plot_training_log(rows, tmp_path / "c.png")
    finally:
        plt.Figure.savefig = original  # type: ignore[method-assign]
    assert seen == [["train", "eval"]]
