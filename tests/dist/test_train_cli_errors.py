"""`graphpipe train` supervised under torchrun: SIGINT and SIGTERM stop every worker and end with one line;
--resume past a damaged newest checkpoint continues on every rank from the newest intact one; a rank's own
error is the last line, with no traceback from torchrun."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphpipe.models import load_model
from graphpipe.runtime.checkpoint import complete_steps
from tests.runtime.helpers import by_target, plan_from
from tests.waiting import Progress, descendants, run_watched

pytestmark = pytest.mark.dist
SAVE_EVERY = 20
ENDED_S = 120.0  # a run told to stop ends within this (its processes' progress bounds the other waits)


def _plan_file(tmp_path: Path) -> Path:
    zoo = load_model("toy_diamond", "tiny", batch_size=8)
    plan = plan_from(zoo.model, by_target([("stem", 0), ("left", 1), ("right", 2), ("add", 2)]),
                     [(0,), (1,), (2,)], micro_batch_size=2, global_batch_size=8)
    path = tmp_path / "plan.json"
    dataclasses.replace(plan, model_spec={"model": "toy_diamond", "preset": "tiny"}).save(str(path))
    return path


def _command(plan: Path, ckpt: Path, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "graphpipe.cli.main", "train", "--plan", str(plan), "--nproc", "3", "--steps",
            str(steps), "--checkpoint-dir", str(ckpt), "--save-every", str(SAVE_EVERY), *extra]


def _processes_naming(text: str) -> list[int]:
    """Pids whose command line contains `text` (the run's unique plan path: torchrun and its ranks)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _stop_mid_run(tmp_path: Path, sig: signal.Signals) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """Start a long run, send `sig` to `graphpipe train` once two checkpoints are complete, wait for the end."""
    plan, ckpt = _plan_file(tmp_path), tmp_path / "ckpt"
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:  # SIGINT as a terminal delivers it: not ignored, even where the
        # suite itself runs with SIGINT ignored (started with `&` by a shell without job control), which the
        # launcher would keep (`nohup` semantics) and so never stop
        proc = subprocess.Popen(_command(plan, ckpt, 1_000_000), stdout=subprocess.PIPE, stderr=stderr, text=True,
                                preexec_fn=_interruptible)
    try:
        progress = Progress(lambda: descendants(proc.pid))
        while len(complete_steps(ckpt)) < 2:
            assert proc.poll() is None, stderr_path.read_text()[-3000:]
            assert not progress.stalled(), f"no two checkpoints saved ({progress.why()})"
            time.sleep(0.2)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=ENDED_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _processes_naming(str(plan)):  # only if the launcher failed to stop them
            os.kill(pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, stderr_path.read_text()), plan, ckpt


def _interruptible() -> None:
    """In the child before it runs `graphpipe train`: SIGINT and SIGTERM back to their default dispositions."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _workers_gone(plan: Path) -> bool:
    """Whether the run's workers end while they still make progress (exiting uses CPU; a hung one does not)."""
    progress = Progress(lambda: _processes_naming(str(plan)), quiet_s=ENDED_S)
    while _processes_naming(str(plan)):
        if progress.stalled():
            return False
        time.sleep(0.2)
    return True


def test_sigint_stops_every_worker_and_exits_130_with_one_line(tmp_path: Path) -> None:
    done, plan, _ = _stop_mid_run(tmp_path, signal.SIGINT)
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == "graphpipe train: interrupted"
    assert "Traceback" not in done.stderr
    assert _workers_gone(plan), "workers still run after graphpipe train ended"


def test_sigterm_stops_every_worker_then_resume_skips_a_damaged_step(tmp_path: Path) -> None:
    done, plan, ckpt = _stop_mid_run(tmp_path, signal.SIGTERM)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == "graphpipe train: stopped by SIGTERM"
    assert _workers_gone(plan), "workers still run after graphpipe train ended"

    newest, intact = complete_steps(ckpt)[:2]
    stage_file = newest / "stage_2.pt"
    size = stage_file.stat().st_size
    stage_file.write_bytes(stage_file.read_bytes()[: size // 2])  # rank 2's file, cut short
    steps = int(newest.name.split("_")[1])
    resumed = run_watched(_command(plan, ckpt, steps, "--resume", "--json"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f"graphpipe train: {newest.name} is damaged (stage_2.pt: {size // 2} of {size} bytes); resuming from "
            f"{intact.name}") in resumed.stderr
    done_steps = [row["step"] for row in json.loads(resumed.stdout)["steps"]]
    assert done_steps == list(range(int(intact.name.split("_")[1]) + 1, steps + 1))


def test_a_loss_that_is_not_finite_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    """A learning rate of 1e30 makes the second step's loss nan: every rank stops there, exit 1, one line
    naming the step; step 1's checkpoint stays the newest, and the --log holds both steps."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "train.jsonl"
    command = [sys.executable, "-m", "graphpipe.cli.main", "train", "--model", "toy_chain", "--nproc", "2",
               "--steps", "4", "--lr", "1e30", "--checkpoint-dir", str(ckpt), "--save-every", "1", "--log", str(log)]
    done = run_watched(command, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]  # torchrun's own report is held back (launch.py)
    last = done.stderr.strip().splitlines()[-1]
    assert "step 2: the loss is nan: training stopped before saving this step" in last
    assert f"the last checkpoint, {ckpt / 'step_1'}, is kept" in last
    assert [path.name for path in complete_steps(ckpt)] == ["step_1"]
    assert f"the steps done are in {log}" in last
    rows = [json.loads(line) for line in log.read_text().splitlines()]  # the failing step logged too
    assert [row["step"] for row in rows] == [1, 2] and rows[1]["loss"] != rows[1]["loss"]
