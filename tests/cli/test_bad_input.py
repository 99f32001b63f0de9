"""Bad input to any command: one line on stderr naming what is wrong (the last, no traceback), exit code 2.

Run in-process through `graphpipe.cli.main.main`; `train` never gets as far as starting workers
(the launcher is replaced by one that fails the test if it is called): what a rank would find (the
loss, the --weights) `graphpipe train` checks first. `BAD_INPUTS` is the table of issue 45's cases.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import graphpipe.cli.train_cmd as train_cmd
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


# ---- every bad input of issue 45: one line, the last on stderr, no traceback, exit 2 -----------------------------
FACTORIES = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def ok(batch_size=4, seed=0):
    return Net(), {"x": torch.randn(batch_size, 4)}, torch.randn(batch_size, 2), nn.MSELoss()


def vector_loss(batch_size=4):
    return Net(), {"x": torch.randn(batch_size, 4)}, torch.randn(batch_size, 2), nn.MSELoss(reduction="none")


def raises(batch_size=4):
    raise RuntimeError("no GPU found")


def a_number():
    return 42


def two_things():
    return Net(), 1


def not_a_module():
    return "model", {"x": torch.randn(4, 4)}, torch.randn(4, 2), nn.MSELoss()
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the factories, weights files good and bad, and a file to use as a folder."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("bad_input")
    (root / "f.py").write_text(FACTORIES)
    (root / "syntax.py").write_text("def f(:\n")
    (root / "a_file").write_text("")
    good = {"a.weight": torch.ones(4, 4), "a.bias": torch.ones(4), "b.weight": torch.ones(2, 4),
            "b.bias": torch.ones(2)}
    save_file(good, root / "good.safetensors")
    save_file({k: v for k, v in good.items() if k != "b.bias"}, root / "missing.safetensors")
    save_file({**good, "a.weight": torch.ones(3, 4)}, root / "shape.safetensors")
    save_file({**good, "a.weight": torch.ones(4, 4, dtype=torch.int32)}, root / "int.safetensors")
    data = (root / "good.safetensors").read_bytes()
    (root / "cut.safetensors").write_bytes(data[: len(data) // 2])
    (root / "text.safetensors").write_text("not safetensors")
    return root


PLAN = ["plan", "--cluster", "local-cpu", "--devices", "2", "--mini-batch", "8"]
MMT = [*PLAN, "--model", "mmt", "--preset", "tiny"]
TRAIN = ["train", "--model", "{dir}/f.py:ok", "--nproc", "2"]
NO_PROC = "/proc/graphpipe-no-such-folder"  # a folder nobody can create, root included

BAD_INPUTS: dict[str, tuple[list[str], str]] = {
    # the model: file.py:factory, zoo names, --set
    "model file missing": ([*PLAN, "--model", "{dir}/none.py:ok"], "model file {dir}/none.py does not exist"),
    "model syntax error": ([*PLAN, "--model", "{dir}/syntax.py:f"], "importing {dir}/syntax.py failed: SyntaxError"),
    "factory missing": ([*PLAN, "--model", "{dir}/f.py:nope"], "has no callable 'nope'; it defines"),
    "no factory named": ([*PLAN, "--model", "{dir}/f.py"], "names a file but no factory; write {dir}/f.py:factory"),
    "factory raises": ([*PLAN, "--model", "{dir}/f.py:raises"], "raised RuntimeError: no GPU found"),
    "factory returns a number": ([*PLAN, "--model", "{dir}/f.py:a_number"],
                                 "must return (model, inputs, targets, loss_fn), got int"),
    "factory returns two things": ([*PLAN, "--model", "{dir}/f.py:two_things"], "got tuple of length 2"),
    "factory returns no module": ([*PLAN, "--model", "{dir}/f.py:not_a_module"], "returned a str as model"),
    "factory takes no option": ([*PLAN, "--model", "{dir}/f.py:ok", "--set", "width=3"], "takes no option ['width']"),
    "unknown zoo model": ([*PLAN, "--model", "mmtt"], "unknown model 'mmtt'; choose one of mmt,"),
    "unknown preset": ([*MMT, "--preset", "huge"], "model 'mmt' has no preset 'huge'"),
    "--set without =": ([*MMT, "--set", "num_layers"], "--set 'num_layers': write KEY=VALUE"),
    "--set unknown option": ([*MMT, "--set", "width=3"], "model 'mmt' has no option ['width']"),
    "--set bad value": ([*MMT, "--set", "num_branches=0"], "num_branches must be >= 1, got 0"),
    # --micro-batch-sizes and --mini-batch
    "micro-batch 0": ([*MMT, "--micro-batch-sizes", "0"], "0 is not a micro-batch size of the mini-batch of 8"),
    "micro-batch negative": ([*MMT, "--micro-batch-sizes=-2"], "-2 is not a micro-batch size"),
    "micro-batch words": ([*MMT, "--micro-batch-sizes", "a,b"], "'a,b': write whole numbers separated by commas"),
    "micro-batch fraction": ([*MMT, "--micro-batch-sizes", "1.5"], "'1.5': write whole numbers"),
    "micro-batch empty": ([*MMT, "--micro-batch-sizes", ","], "',': write whole numbers"),
    "micro-batch too large": ([*MMT, "--micro-batch-sizes", "16"], "16 is not a micro-batch size of the mini-batch"),
    "micro-batch divides not": ([*MMT, "--micro-batch-sizes", "3"], "none divides the mini-batch of 8; give sizes"),
    "unknown technique": ([*MMT, "--techniques", "recompute,offload"],
                          "unknown technique(s) offload; choose from none, all, recompute, zero-bubble"),
    "mini-batch too large to plan": ([*MMT, "--mini-batch", "1000000000"],
                                     "splits into at least 1,953,125 micro-batches (its largest micro-batch size is "
                                     "512)"),
    "train mini-batch too large": ([*TRAIN, "--mini-batch", "1000000000"], "e.g. 999997440 (= 61035 x 16384)"),
    # training: the loss, --weights, --lr (all found before any rank starts)
    "vector loss": (["train", "--model", "{dir}/f.py:vector_loss", "--nproc", "2"],
                    "loss_fn returns a tensor of shape (4, 2) on its example batch of 4, not a scalar"),
    "weights cut short": ([*TRAIN, "--weights", "{dir}/cut.safetensors"],
                          "weights {dir}/cut.safetensors is not a readable .safetensors file"),
    "weights not safetensors": ([*TRAIN, "--weights", "{dir}/text.safetensors"], "is not a readable .safetensors"),
    "weights lack a key": ([*TRAIN, "--weights", "{dir}/missing.safetensors"],
                           "lack 1 of the 4 tensors the model needs (first: ['b.bias'])"),
    "weights of another shape": ([*TRAIN, "--weights", "{dir}/shape.safetensors"],
                                 "a.weight: [3, 4] in the file, [4, 4] in the model"),
    "integer weights": ([*TRAIN, "--weights", "{dir}/int.safetensors"],
                        "a.weight is int32 in the file but float32 in the model"),
    "lr nan": ([*TRAIN, "--lr", "nan"], "--lr must be a finite number of at least 0, got nan"),
    "lr inf": ([*TRAIN, "--lr", "inf"], "got inf"),
    "lr negative": ([*TRAIN, "--lr=-0.1"], "got -0.1"),
    "log every 0": ([*TRAIN, "--log-every", "0"], "--log-every must be at least 1 (report every N steps), got 0"),
    # files written: -o, --gantt
    "plan -o a folder": ([*MMT, "-o", "{dir}"], "-o {dir} is a directory; give a file path, e.g. {dir}/plan.json"),
    "plan -o under a file": ([*MMT, "-o", "{dir}/a_file/plan.json"], "the folder {dir}/a_file exists but is a file"),
    "plan -o unwritable": ([*MMT, "-o", f"{NO_PROC}/plan.json"], "cannot be created: /proc is not writable"),
    "capture -o a folder": (["capture", "--model", "mmt", "-o", "{dir}"], "-o {dir} is a directory"),
    "capture -o under a file": (["capture", "--model", "mmt", "-o", "{dir}/a_file/g.json"], "exists but is a file"),
    "capture -o unwritable": (["capture", "--model", "mmt", "-o", f"{NO_PROC}/g.json"], "/proc is not writable"),
    "gantt a folder": (["simulate", "{dir}/plan.json", "--gantt", "{dir}"], "--gantt {dir} is a directory"),
    "gantt under a file": (["simulate", "{dir}/plan.json", "--gantt", "{dir}/a_file/g.png"], "exists but is a file"),
    "gantt unwritable": (["simulate", "{dir}/plan.json", "--gantt", f"{NO_PROC}/g.png"], "/proc is not writable"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_every_bad_input_is_one_line_and_exit_2(case: str, inputs: Path, diamond_plan: Plan, no_launch: None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    argv, says = BAD_INPUTS[case]
    if NO_PROC in " ".join(argv) and not Path("/proc").is_dir():
        pytest.skip("needs Linux's /proc as a folder nobody can write")
    diamond_plan.save(inputs / "plan.json")
    assert cli_main.main([word.format(dir=inputs) for word in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert says.format(dir=inputs) in err.splitlines()[-1], err


def test_good_weights_pass_the_checks_made_before_the_ranks_start(inputs: Path, diamond_plan: Plan,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The checks above refuse only what is wrong: the same model with fitting weights is launched."""
    def planned(args: Any, path: Path) -> str:  # not the model's plan: the launcher is a fake
        diamond_plan.save(path)
        return str(path)

    monkeypatch.setattr(train_cmd, "_plan_now", planned)
    monkeypatch.setattr(launch_module, "launch", _fake_launch(LaunchResult(returncode=0), steps=1))
    argv = [word.format(dir=inputs) for word in [*TRAIN, "--weights", "{dir}/good.safetensors", "--steps", "1"]]
    assert cli_main.main(argv) == 0, capsys.readouterr().err
