"""`graphpipe plan`: the stage table, --json, -o, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphpipe.cli.plan_cmd as plan_cmd
from graphpipe.cli.main import main
from graphpipe.planner.stage_graph import Plan
from tests.cli.run_command import run_command


def test_plan_prints_stages_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = run_command(plan_cmd, ["plan", "--model", "toy_branches", "--preset", "tiny", "--cluster", "local-cpu",
                                  "--devices", "4", "--batch", "8", "--rank-by", "tps", "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "in-flight" in text and "depth" in text
    plan = Plan.load(str(out))
    assert plan.world_size <= 4 and plan.global_batch_size == 8 and plan.model_spec["model"] == "toy_branches"


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_command(plan_cmd, ["plan", "--model", "toy_chain", "--preset", "tiny", "--cluster", "local-cpu",
                                  "--devices", "2", "--batch", "4", "--planner", "pipedream", "--rank-by", "tps",
                                  "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["planner"] == "pipedream" and data["stages"]


def test_bad_micro_batch_sizes_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "toy_chain", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "2",
                 "--batch", "8", "--micro-batch-sizes", "3,5"])
    assert code == 1 and "divides the mini-batch of 8" in capsys.readouterr().err
