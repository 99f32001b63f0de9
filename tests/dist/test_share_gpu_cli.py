"""`graphpipe train --share-gpu --log-every N` end to end: the ranks' messages staged through host memory (on the
CPU here: the same code a GPU runs, `graphpipe.runtime.host_staging`), the loss summed and reported only every N
steps, the last and the saved ones, and every reported loss equal to one device's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.dist.test_train_cli import LR, NUM_STEPS, _plan_file, _reference_losses
from tests.waiting import run_watched

pytestmark = pytest.mark.dist


def test_ranks_sharing_a_device_train_like_one_device_and_report_every_n_steps(tmp_path: Path) -> None:
    plan = _plan_file(tmp_path)
    trace = tmp_path / "trace"
    command = [sys.executable, "-m", "graphpipe.cli.main", "train", "--plan", str(plan), "--nproc", "3",
               "--steps", str(NUM_STEPS), "--lr", str(LR), "--share-gpu", "--log-every", "2", "--trace", str(trace),
               "--json"]
    done = run_watched(command, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--share-gpu: no CUDA device is visible: the 3 ranks compute on the CPU" in done.stderr
    rows = json.loads(done.stdout)["steps"]
    assert [row["step"] for row in rows] == [1, 2, 4, 5]  # the first, every 2nd, the last
    assert [row["steps_timed"] for row in rows] == [1, 1, 2, 1]
    expected = _reference_losses()
    assert [row["loss"] for row in rows] == pytest.approx([expected[row["step"] - 1] for row in rows], rel=1e-5)
    assert all(row["reserved_memory_bytes"] == [] for row in rows)  # on the CPU: no device memory to report
    trace_0 = json.loads((trace / "rank_0.json").read_text())
    assert trace_0["otherData"]["clock"] == "host monotonic clock"
    steps_traced = {event["args"]["step"] for event in trace_0["traceEvents"] if event.get("ph") == "X"}
    assert steps_traced == set(range(NUM_STEPS))  # every step, reported or not
