"""`graphpipe train`'s costs, without starting workers: the plan it makes records them, and the
simulated time a rank reports uses the costs the plan records."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

import graphpipe.cli.train_cmd as train_cmd
from graphpipe.cost.sources import CostSource
from graphpipe.models import load_model
from graphpipe.stages.stage_graph import Plan
from graphpipe.train import simulated_iteration_s


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="graphpipe")
    train_cmd.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


@pytest.fixture()
def planned(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    train_cmd._plan_now(_args("--model", "toy_branches", "--nproc", "2", "--batch", "8", "--dtype", "bf16"), path)
    return path


def test_the_plan_train_makes_records_cpu_costs(planned: Path) -> None:
    assert Plan.load(str(planned)).cost_source == CostSource(kind="analytic", device="cpu", dtype="bfloat16")


def test_the_simulated_time_uses_the_recorded_costs(planned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = Plan.load(str(planned))
    zoo = load_model("toy_branches", "tiny", batch_size=8, device="meta")
    assert simulated_iteration_s(plan, zoo, plan.schedule, [], str(planned)) == \
        pytest.approx(plan.predicted_iteration_s)
    assert capsys.readouterr().err == ""
    measured = dataclasses.replace(plan, cost_source=CostSource(kind="measured", device="cpu"))
    assert simulated_iteration_s(measured, zoo, plan.schedule, [], str(planned)) is not None
    assert (f"graphpipe train: warning: plan {planned} was costed with costs measured on cpu, which cannot be "
            "recreated identically") in capsys.readouterr().err


def test_a_plan_for_another_config_is_refused_before_any_worker_starts(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpipe.errors import UsageError

    path = tmp_path / "plan.json"
    train_cmd._plan_now(_args("--model", "toy_diamond", "--set", "width=8", "--nproc", "2", "--batch", "8"), path)
    monkeypatch.setattr("graphpipe.runtime.launch.launch", lambda *a, **k: pytest.fail("workers started"))
    with pytest.raises(UsageError) as refused:
        train_cmd.run(_args("--plan", str(path), "--set", "width=16", "--nproc", "2"))
    message = str(refused.value)
    assert "\n" not in message
    assert "(--set width=16 here, width=8 in the plan)" in message
    assert "stem.0.weight 8x8" in message and "stem.0.weight 16x16" in message


def test_a_simulation_of_a_preset_device_is_said_uncalibrated(planned: Path) -> None:
    """The presets model a device's ops, not this machine's per-action overheads: the table prints `uncal.`
    instead of a number, unless the plan's device had them measured."""
    from graphpipe.cost.cluster import Cluster
    from graphpipe.train import simulation_calibrated

    plan = Plan.load(str(planned))
    rows = [{"step": 1, "loss": 1.0, "samples_per_s": 100.0, "iteration_s": 0.01, "simulated_iteration_s": 0.005,
             "peak_memory_bytes": [2**20]}]
    assert not simulation_calibrated(plan)
    assert "uncal." in train_cmd.render_metrics(rows, calibrated=False).splitlines()[1]
    cluster = Cluster.from_dict(plan.cluster)
    measured = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, fwd_action_overhead_us=80.0))
    assert simulation_calibrated(dataclasses.replace(plan, cluster=measured.to_dict()))
    assert "     5.0" in train_cmd.render_metrics(rows, calibrated=True).splitlines()[1]


def test_a_step_that_is_not_finite_is_one_line_naming_it(tmp_path: Path) -> None:
    from graphpipe.train import non_finite_problem

    assert non_finite_problem(3, 0.5, 2.0, None) is None
    assert non_finite_problem(3, float("nan"), None, None) == (
        "step 3: the loss is nan: training stopped before saving this step (no checkpoint was saved before it); "
        "a lower --lr, --clip-grad-norm or --warmup-steps may help")
    assert "step 4: the gradient norm is inf" in str(non_finite_problem(4, 0.5, float("inf"), str(tmp_path)))


def test_an_unwritable_log_is_found_before_workers_start(tmp_path: Path) -> None:
    from graphpipe.cli.train_cmd import _log_problem, _rows_after

    assert _log_problem(None) is None and _log_problem(str(tmp_path / "train.jsonl")) is None
    assert "is a directory" in str(_log_problem(str(tmp_path)))
    assert "does not exist" in str(_log_problem(str(tmp_path / "nowhere" / "train.jsonl")))
    log = tmp_path / "train.jsonl"
    log.write_text('{"step": 1, "loss": 1.0}\n')
    before = log.stat().st_size
    with log.open("a") as handle:
        handle.write('{"step": 2, "loss": 0.5}\n')
    assert _rows_after(log, before) == [{"step": 2, "loss": 0.5}]  # a resumed run's rows only


def test_a_mini_batch_larger_than_the_plans_accumulates_a_multiple_and_refuses_the_rest() -> None:
    from graphpipe.errors import UsageError

    args = argparse.Namespace(batch=32, accumulate=1)
    train_cmd._accumulate_to(args, 8)
    assert args.accumulate == 4
    with pytest.raises(UsageError, match="give a multiple of 8"):
        train_cmd._accumulate_to(argparse.Namespace(batch=12, accumulate=1), 8)
    same = argparse.Namespace(batch=8, accumulate=1)
    train_cmd._accumulate_to(same, 8)
    assert same.accumulate == 1


def test_evaluation_and_accumulation_options_are_checked_before_workers_start() -> None:
    from graphpipe.train import build_parser, train_args_problem

    def problem(*extra: str) -> str | None:
        return train_args_problem(build_parser().parse_args(["--plan", "p.json", *extra]))

    assert "together with --eval-data" in str(problem("--eval-every", "5"))
    assert "--accumulate must be at least 1" in str(problem("--accumulate", "0"))
    assert "no such file" in str(problem("--eval-data", "nowhere.py:test"))


def test_a_long_run_shows_a_sample_of_its_steps_and_every_evaluated_one() -> None:
    rows = [{"step": step, "loss": 1.0, "samples_per_s": 10.0, "iteration_s": 0.1, "peak_memory_bytes": [1],
             "eval_loss": 0.5 if step in (7, 300) else None} for step in range(1, 301)]
    table = train_cmd.render_metrics(rows, calibrated=False)
    lines = table.splitlines()
    assert "eval loss" in lines[0] and len(lines) < 30
    assert any(line.split()[0] == "7" and line.split()[-1] == "0.5" for line in lines[1:-1])
    assert "of 300 steps shown" in lines[-1]
    assert len(train_cmd.render_metrics(rows[:5]).splitlines()) == 6  # a short run: every step
