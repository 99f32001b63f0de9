"""A training log (`graphpipe train --log FILE.jsonl`): one JSON object per step, and its picture.

Rank 0 appends a line after every step (`graphpipe.runtime.metrics.StepMetrics.to_dict`: step, loss,
learning rate, gradient norm, samples/s, iteration and simulated time, peak memory per rank, and the eval loss
after the steps that evaluate `--eval-data`), so a run stopped at any point leaves every step it finished; a
resumed run appends to the same file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from graphpipe.errors import InputFileError

__all__ = ["plot_training_log", "read_training_log"]


def read_training_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The steps of a log, in file order; a refused file says which line is not a step."""
    rows = []
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise InputFileError(f"cannot read training log {path}: {err.strerror or err}") from err
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputFileError(f"{path}, line {number}: not JSON ({err.msg}); a training log holds one JSON "
                                 "object per step, as `graphpipe train --log` writes") from err
        if not isinstance(row, dict) or "step" not in row or "loss" not in row:
            raise InputFileError(f"{path}, line {number}: not a step (no 'step' and 'loss'); a training log "
                                 "holds one JSON object per step, as `graphpipe train --log` writes")
        rows.append(row)
    if not rows:
        raise InputFileError(f"training log {path} holds no step")
    return rows


def plot_training_log(rows: list[dict[str, Any]], path: str | os.PathLike[str], *, title: str = "") -> str:
    """Loss (and the eval loss where logged), samples/s and (where logged) the learning rate, if it changes, and
    the gradient norm against the step, one panel each, to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in rows]
    panels: list[tuple[str, list[Any], bool]] = [("loss", [row["loss"] for row in rows], False),
                                                  ("samples/s", [row.get("samples_per_s") for row in rows], False)]
    if len({row.get("learning_rate") for row in rows} - {None}) > 1:  # a schedule, not a constant rate
        panels.append(("learning rate", [row.get("learning_rate") for row in rows], False))
    norms = [row.get("grad_norm") for row in rows]
    present = [norm for norm in norms if norm is not None and norm > 0]
    if present:  # a log axis where the norm spans decades (a run that diverges)
        panels.append(("gradient norm", norms, max(present) > 10 * min(present)))
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.2 * len(panels)), sharex=True, squeeze=False)
    for ax, (label, values, log_scale) in zip(axes[:, 0], panels):
        points = [(step, value) for step, value in zip(steps, values) if value is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if log_scale:
            ax.set_yscale("log")
    evaluated = [(row["step"], row["eval_loss"]) for row in rows if row.get("eval_loss") is not None]
    if evaluated:  # the validation loss beside the training loss
        loss_axis = axes[0, 0]
        loss_axis.lines[0].set_label("train")
        loss_axis.plot([p[0] for p in evaluated], [p[1] for p in evaluated], marker="o", label="eval")
        loss_axis.legend()
    axes[-1, 0].set_xlabel("step")
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
