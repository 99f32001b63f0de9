"""`graphpipe train` end to end under torchrun: a killed rank, then --resume from the last complete checkpoint."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from graphpipe.models import load_model
from graphpipe.runtime.checkpoint import latest_complete, read_complete
from graphpipe.train import KILL_ENV, shuffled_batch
from tests.runtime.helpers import by_target, plan_from
from tests.waiting import run_watched

pytestmark = pytest.mark.dist
LR = 0.01
NUM_STEPS = 5
REPO = Path(__file__).resolve().parents[2]


def _plan_file(tmp_path: Path) -> Path:
    zoo = load_model("toy_diamond", "tiny", batch_size=8)
    plan = plan_from(zoo.model, by_target([("stem", 0), ("left", 1), ("right", 2), ("add", 2)]),
                     [(0,), (1,), (2,)], micro_batch_size=2, global_batch_size=8)
    plan = dataclasses.replace(plan, model_spec={"model": "toy_diamond", "preset": "tiny"})
    path = tmp_path / "plan.json"
    plan.save(str(path))
    return path


def _train(plan: Path, ckpt: Path, *extra: str, env: dict[str, str] | None = None,
           nproc: int = 3) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "graphpipe.cli.main", "train", "--plan", str(plan), "--nproc", str(nproc),
               "--steps", str(NUM_STEPS), "--lr", str(LR), "--checkpoint-dir", str(ckpt), "--save-every", "1",
               "--json", *extra]
    return run_watched(command, env={**os.environ, **(env or {})})


def _reference_losses() -> list[float]:
    zoo = load_model("toy_diamond", "tiny", batch_size=8, seed=0)
    optimizer = torch.optim.Adam(zoo.model.parameters(), lr=LR)
    losses = []
    for step in range(NUM_STEPS):
        inputs, targets = shuffled_batch(zoo, 0, step)
        optimizer.zero_grad()
        loss = zoo.loss_fn(zoo.model(*inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_killed_rank_ends_the_run_and_resume_continues_from_the_last_complete_checkpoint(tmp_path: Path) -> None:
    plan, ckpt = _plan_file(tmp_path), tmp_path / "ckpt"
    start = time.monotonic()
    killed = _train(plan, ckpt, env={KILL_ENV: "1:3"})
    elapsed = time.monotonic() - start
    assert killed.returncode != 0
    assert elapsed < 60, f"the run took {elapsed:.0f} s to end after a rank died"
    assert "error: rank 1 failed (killed by SIGKILL)" in killed.stderr, killed.stderr[-3000:]
    latest = latest_complete(ckpt)
    assert latest is not None and latest.name == "step_3"
    assert read_complete(latest)["step"] == 3

    resumed = _train(plan, ckpt, "--resume", "--trace", str(tmp_path / "trace"), nproc=4)  # rank 3 idles
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 3 stays idle" in resumed.stderr and "rank 3: idle" in resumed.stderr
    steps = json.loads(resumed.stdout)["steps"]
    assert [row["step"] for row in steps] == [4, 5]
    expected = _reference_losses()[3:]
    assert [row["loss"] for row in steps] == pytest.approx(expected, rel=1e-5)
    assert all(len(row["peak_memory_bytes"]) == 3 and row["samples_per_s"] > 0 for row in steps)
    for rank in range(3):  # one Chrome trace per rank, one complete event per action
        events = json.loads((tmp_path / "trace" / f"rank_{rank}.json").read_text())["traceEvents"]
        names = [e["name"] for e in events if e["ph"] == "X"]
        assert names.count("STEP") == 2 and "F0" in names and "B3" in names


def test_weights_from_a_file_and_meta_init_train_like_one_device_from_the_same_start(tmp_path: Path) -> None:
    """`--weights FILE`: every rank builds the model without weights and reads its stage's keys; the losses are
    those of one device starting from the file. `--init meta` starts where `gp.materialize` puts one device."""
    from safetensors.torch import save_file

    from graphpipe.runtime.materialize import materialize

    from_file = load_model("toy_diamond", "tiny", batch_size=8, empty=True)
    materialize(from_file.model, seed=4)  # other weights than --init meta's (seed 0)
    path = tmp_path / "start.safetensors"
    save_file({name: t.detach().contiguous() for name, t in from_file.model.state_dict().items()}, str(path))
    from_seeds = load_model("toy_diamond", "tiny", batch_size=8, empty=True)
    materialize(from_seeds.model, seed=0)
    plan = _plan_file(tmp_path)
    for extra, start in ((["--weights", str(path)], from_file), (["--init", "meta"], from_seeds)):
        done = run_watched([sys.executable, "-m", "graphpipe.cli.main", "train", "--plan", str(plan), "--nproc",
                            "3", "--steps", "2", "--lr", str(LR), "--json", *extra])
        assert done.returncode == 0, done.stderr[-3000:]
        losses = [row["loss"] for row in json.loads(done.stdout)["steps"]]
        assert losses == pytest.approx(_losses_from(start, 2), rel=1e-5), extra


def _losses_from(zoo: object, num_steps: int) -> list[float]:
    import copy

    zoo = copy.deepcopy(zoo)
    optimizer = torch.optim.Adam(zoo.model.parameters(), lr=LR)  # type: ignore[attr-defined]
    losses = []
    for step in range(num_steps):
        inputs, targets = shuffled_batch(zoo, 0, step)
        optimizer.zero_grad()
        loss = zoo.loss_fn(zoo.model(*inputs), targets)  # type: ignore[attr-defined]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_training_on_data_resumes_with_the_next_unseen_mini_batch_and_equals_one_device(tmp_path: Path) -> None:
    """`--data` (a dataset of 20 samples: 2 mini-batches of 8 an epoch), 1 step, then `--resume` mid-epoch to 4:
    the losses are an uninterrupted run's, exactly, and one device's on the same mini-batches, the third from the
    second epoch's permutation."""
    from graphpipe.runtime.data import MiniBatches, load_data

    data = f"{REPO / 'tests' / 'runtime' / 'data_factories.py'}:dataset"
    ckpt = tmp_path / "ckpt"

    def run(steps: int, *extra: str, into: Path = ckpt) -> list[float]:
        command = [sys.executable, "-m", "graphpipe.cli.main", "train", "--model", "toy_chain", "--data", data,
                   "--mini-batch", "8", "--nproc", "2", "--steps", str(steps), "--lr", str(LR), "--checkpoint-dir",
                   str(into), "--json", *extra]
        done = run_watched(command, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        return [row["loss"] for row in json.loads(done.stdout)["steps"]]

    losses = run(1) + run(4, "--resume")
    assert losses == run(4, into=tmp_path / "uninterrupted")
    model = load_model("toy_chain", "tiny", batch_size=8, seed=0)
    optimizer = torch.optim.Adam(model.model.parameters(), lr=LR)
    batches = MiniBatches(load_data(data, 0), 8, seed=0)
    expected = []
    for step in range(4):
        inputs, targets = batches.at(step)
        optimizer.zero_grad()
        loss = model.loss_fn(model.model(inputs), targets)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    assert losses == pytest.approx(expected, rel=1e-5)


def test_accumulating_and_evaluating_from_the_command_line_equal_one_device(tmp_path: Path) -> None:
    """`--accumulate 2` over the plan's mini-batches of 8 (a list of mini-batches, two a step) and `--eval-data`
    (a dataset: its 2 whole mini-batches of 8) after the last step: one device's losses on the 16 samples of each
    step, and its eval-mode loss on those 16 samples."""
    from graphpipe.runtime.data import join_batches, load_data

    factories = REPO / "tests" / "runtime" / "data_factories.py"
    command = [sys.executable, "-m", "graphpipe.cli.main", "train", "--model", "toy_chain", "--data",
               f"{factories}:batches", "--eval-data", f"{factories}:dataset", "--mini-batch", "8", "--accumulate", "2",
               "--nproc", "2", "--steps", "2", "--lr", str(LR), "--json"]
    done = run_watched(command, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)["steps"]
    assert "4 samples beyond the last whole mini-batch of 8 are not evaluated" in done.stderr
    model = load_model("toy_chain", "tiny", batch_size=8, seed=0)
    optimizer = torch.optim.Adam(model.model.parameters(), lr=LR)
    stream = load_data(f"{factories}:batches", 0)
    expected = []
    for step in range(2):
        inputs, targets = join_batches([stream[(2 * step + k) % len(stream)] for k in range(2)])
        optimizer.zero_grad()
        loss = model.loss_fn(model.model(inputs), targets)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    held_out = load_data(f"{factories}:dataset", 0)
    with torch.no_grad():
        model.model.eval()
        inputs, targets = held_out[:16]
        expected_eval = model.loss_fn(model.model(inputs), targets).item()
    assert [row["loss"] for row in rows] == pytest.approx(expected, rel=1e-5)
    assert rows[0]["eval_loss"] is None and rows[-1]["eval_loss"] == pytest.approx(expected_eval, rel=1e-5)
