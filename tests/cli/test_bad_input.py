"""Bad input to `simulate`, `show` and `train`: one line on stderr naming what is wrong, exit code 2.

Run in-process through `graphpipe.cli.main.main`; `train` never gets as far as starting workers
(the launcher is replaced by one that fails the test if it is called).
"""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import graphpipe.runtime.launch as launch_module
from graphpipe.cli import main as cli_main
from graphpipe.models import load_model
from graphpipe.runtime.launch import LaunchResult, Stopped
from graphpipe.stages.stage_graph import Plan
from tests.runtime.helpers import by_target, plan_from
from tests.simulation.factories import diamond, make_costs

PLAN_COMMANDS = {"simulate": ["simulate", "{plan}"], "show": ["show", "{plan}"],
                 "train": ["train", "--plan", "{plan}", "--nproc", "3"]}


@pytest.fixture()
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> LaunchResult:
        raise AssertionError("the workers were started")

    monkeypatch.setattr(launch_module, "launch", refuse)


@pytest.fixture(scope="module")
def diamond_plan() -> Plan:
    """toy_diamond on 3 ranks, recording its model (what `simulate` and `train` rebuild)."""
    zoo = load_model("toy_diamond", "tiny", batch_size=8)
    plan = plan_from(zoo.model, by_target([("stem", 0), ("left", 1), ("right", 2), ("add", 2)]),
                     [(0,), (1,), (2,)], micro_batch_size=2, global_batch_size=8)
    return dataclasses.replace(plan, model_spec={"model": "toy_diamond", "preset": "tiny"})


def _write_bad_plan(tmp_path: Path, case: str, plan: Plan) -> Path:
    path = tmp_path / f"{case}.json"
    text = json.dumps(plan.to_dict())
    without_stages = {k: v for k, v in plan.to_dict().items() if k != "stages"}
    contents = {"empty": "", "truncated": text[: len(text) // 2], "not_json": "stages: [0, 1]\n",
                "a_list": "[1, 2]", "no_stages": json.dumps(without_stages),
                "cost_table": json.dumps(make_costs(diamond(1, 2)).to_dict())}
    if case in contents:
        path.write_text(contents[case])
    return path


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("command", sorted(PLAN_COMMANDS))
@pytest.mark.parametrize(("case", "says"), [
    ("missing", "does not exist"), ("empty", "is empty"), ("truncated", "ends early"),
    ("not_json", "is not valid JSON"), ("a_list", "holds a JSON list"), ("no_stages", "has no 'stages' field"),
    ("cost_table", "not a graphpipe plan (format 'graphpipe.costs/1')"),
])
def test_a_bad_plan_file_is_named_in_one_line(command: str, case: str, says: str, tmp_path: Path,
                                              diamond_plan: Plan, no_launch: None,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_bad_plan(tmp_path, case, diamond_plan)
    argv = [word.format(plan=path) for word in PLAN_COMMANDS[command]]
    assert cli_main.main(argv) == 2
    line = _one_line(capsys)
    assert line.startswith(f"graphpipe {command}: error: plan file {path} ") and says in line, line


@pytest.mark.parametrize("command", ["simulate", "train"])
def test_a_plan_that_misses_ops_of_the_model_is_refused(command: str, tmp_path: Path, diamond_plan: Plan,
                                                        no_launch: None,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    data = diamond_plan.to_dict()
    data["stages"][2]["ops"] = data["stages"][2]["ops"][:-3]  # the last three ops of the model
    path = tmp_path / "short.json"
    path.write_text(json.dumps(data))
    assert cli_main.main([word.format(plan=path) for word in PLAN_COMMANDS[command]]) == 2
    line = _one_line(capsys)
    assert f"plan {path} does not fit the model" in line and "3 ops are in no stage" in line
    assert "re-plan" in line


@pytest.mark.parametrize("command", ["simulate", "train"])
def test_a_plan_for_another_model_is_refused(command: str, tmp_path: Path, diamond_plan: Plan,
                                             no_launch: None, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.json"
    diamond_plan.save(path)
    argv = [word.format(plan=path) for word in PLAN_COMMANDS[command]] + ["--model", "toy_chain"]
    assert cli_main.main(argv) == 2
    line = _one_line(capsys)
    assert "it is for graph 'Diamond' but the model is 'toy_chain-tiny'" in line and "re-plan" in line


def test_costs_for_another_graph_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = diamond(2, 8)
    costs = make_costs(plan)
    costs = dataclasses.replace(costs, entries={op: per for op, per in costs.entries.items() if op != "op1"})
    plan.save(tmp_path / "plan.json")
    costs.save(tmp_path / "costs.json")
    assert cli_main.main(["simulate", str(tmp_path / "plan.json"), "--costs", str(tmp_path / "costs.json")]) == 2
    assert "has no cost for 1 of the plan's 4 ops (e.g. ['op1'])" in _one_line(capsys)


@pytest.mark.parametrize(("extra", "says"), [
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--steps", "-3"], "--steps must be at least 1, got -3"),
    (["--save-every", "-1", "--checkpoint-dir", "ck"], "--save-every must be 0"),
    (["--resume", "--checkpoint-dir", "{tmp}/empty"], "holds no complete checkpoint"),
    (["--weights", "{tmp}/none.safetensors"], "--weights {tmp}/none.safetensors does not exist"),
])
def test_train_options_that_cannot_work_are_usage_errors(extra: list[str], says: str, tmp_path: Path,
                                                         diamond_plan: Plan, no_launch: None,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    diamond_plan.save(tmp_path / "plan.json")
    argv = ["train", "--plan", str(tmp_path / "plan.json"), "--nproc", "3", *extra]
    assert cli_main.main([word.format(tmp=tmp_path) for word in argv]) == 2
    assert says.format(tmp=tmp_path) in _one_line(capsys)


def test_more_ranks_than_cuda_devices_is_a_usage_error(tmp_path: Path, diamond_plan: Plan, no_launch: None,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    diamond_plan.save(tmp_path / "plan.json")
    assert cli_main.main(["train", "--plan", str(tmp_path / "plan.json"), "--nproc", "3"]) == 2
    assert "3 ranks on this machine but it has 2 CUDA device(s)" in _one_line(capsys)


def _fake_launch(result: LaunchResult, steps: int = 2) -> Any:
    """A launcher that writes `steps` metric rows (as rank 0 would) and returns `result`."""
    def launch(nproc: int, train_args: list[str], **kwargs: Any) -> LaunchResult:
        metrics = Path(train_args[train_args.index("--metrics-out") + 1])
        rows = [{"step": step, "loss": 1.0, "iteration_s": 0.1, "samples_per_s": 40.0, "peak_memory_bytes": [1]}
                for step in range(1, steps + 1)]
        metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return result

    return launch


def test_train_json_prints_only_json_on_stdout(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launch_module, "launch", _fake_launch(LaunchResult(returncode=0)))
    assert cli_main.main(["train", "--model", "mmt", "--preset", "tiny", "--nproc", "4", "--steps", "2",
                          "--json"]) == 0
    captured = capsys.readouterr()
    assert [row["step"] for row in json.loads(captured.out)["steps"]] == [1, 2]
    assert "graphpipe train: planned Plan(" in captured.err


def test_the_failed_ranks_own_error_is_the_last_line(tmp_path: Path, diamond_plan: Plan,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    failed = LaunchResult(returncode=1, failed_rank=2, rank_exitcode=1, message="stage 2 ran out of memory")
    monkeypatch.setattr(launch_module, "launch", _fake_launch(failed))
    diamond_plan.save(tmp_path / "plan.json")
    assert cli_main.main(["train", "--plan", str(tmp_path / "plan.json"), "--nproc", "3"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == ("graphpipe train: error: rank 2 failed (exit code 1): stage 2 ran out "
                                             "of memory; torchrun stopped the other ranks")


@pytest.mark.parametrize(("raised", "code", "says"), [
    (KeyboardInterrupt(), 130, "graphpipe train: interrupted"),
    (Stopped(signal.SIGINT), 130, "graphpipe train: interrupted"),
    (Stopped(signal.SIGTERM), 143, "graphpipe train: stopped by SIGTERM"),
])
def test_an_interrupted_train_exits_128_plus_the_signal_with_one_line(
        raised: BaseException, code: int, says: str, tmp_path: Path, diamond_plan: Plan,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> LaunchResult:
        raise raised

    monkeypatch.setattr(launch_module, "launch", interrupted)
    diamond_plan.save(tmp_path / "plan.json")
    assert cli_main.main(["train", "--plan", str(tmp_path / "plan.json"), "--nproc", "3"]) == code
    assert _one_line(capsys) == says
