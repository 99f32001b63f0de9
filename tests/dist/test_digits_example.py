"""README.md's digits example, run as written on 4 ranks: plan, train on the real data with evaluation, export,
reload on one device; its test accuracy equals the one-device run's (same weights, same mini-batches)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.waiting import run_watched

pytestmark = pytest.mark.dist
REPO = Path(__file__).resolve().parents[2]
SECTION = "## A real run: handwritten digits"


def _readme_commands() -> list[list[str]]:
    """The section's bash block, one command per line (backslash continuations joined)."""
    text = (REPO / "README.md").read_text()
    start = text.index("```bash\n", text.index(SECTION)) + len("```bash\n")
    block = text[start:text.index("```", start)].replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def _run(command: list[str], cwd: Path) -> str:
    program = {"graphpipe": [sys.executable, "-m", "graphpipe.cli.main"], "python": [sys.executable]}[command[0]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = run_watched([*program, *command[1:]], cwd=cwd, env=env)
    assert done.returncode == 0, f"{shlex.join(command)}:\n{(done.stdout + done.stderr)[-3000:]}"
    return done.stdout


def _test_result(output: str) -> tuple[float, float]:
    found = re.search(r"loss: ([0-9.]+)\s+accuracy: ([0-9.]+)%", output)
    assert found, output
    return float(found.group(1)), float(found.group(2))


def test_the_readme_digits_commands_run_as_written_and_equal_one_device(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    (tmp_path / "examples").symlink_to(REPO / "examples")
    outputs = [_run(command, tmp_path) for command in _readme_commands()]
    pipeline_loss, pipeline_accuracy = _test_result(outputs[3])
    one_device_loss, one_device_accuracy = _test_result(outputs[4])
    assert abs(pipeline_loss - one_device_loss) <= 1e-3
    assert abs(pipeline_accuracy - one_device_accuracy) <= 100 / 360 + 1e-9  # one image at most
    assert pipeline_accuracy >= 95.0, "the README states 97.2%"
    assert "eval loss" in outputs[1] and (tmp_path / "digits.png").is_file()
