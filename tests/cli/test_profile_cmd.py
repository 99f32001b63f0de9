"""`graphpipe profile`: measured and analytic tables from the command line, summary and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphpipe.cli import profile_cmd
from graphpipe.cost.cost_table import CostTable
from tests.cli.run_command import run_command


def test_measured_profile_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "costs.json"
    argv = ["profile", "--model", "toy_diamond", "--micro-batch-sizes", "1,2", "--repeats", "1", "--warmup", "0",
            "--no-progress", "--calibrate", "-o", str(out)]
    assert run_command(profile_cmd, argv) == 0
    text = capsys.readouterr().out
    assert "measured on cpu" in text and "costliest ops at micro-batch 2" in text and "calibrated device" in text
    table = CostTable.load(str(out))
    assert table.source == "measured" and table.micro_batch_sizes == (1, 2)
    assert "measurement spread: " in text and table.spread is not None
    assert "op times: scaled to sum to the model's pass" in text


def test_ops_alone_keeps_each_ops_own_time(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "--model", "toy_chain", "--micro-batch-sizes", "1,2", "--repeats", "1", "--warmup", "0",
            "--no-progress", "--ops-alone", "--json"]
    assert run_command(profile_cmd, argv) == 0
    assert json.loads(capsys.readouterr().out)["op_times"] == "each op alone"


def test_noisy_measurements_are_said_on_stderr(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(profile_cmd, "NOISY_SPREAD", -1.0)  # any spread is too much
    argv = ["profile", "--model", "toy_chain", "--micro-batch-sizes", "1", "--repeats", "3", "--warmup", "0",
            "--no-progress"]
    assert run_command(profile_cmd, argv) == 0
    assert "warning: the measurements are noisy" in capsys.readouterr().err


def test_analytic_json_summary(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "--model", "two_branch", "--preset", "paper", "--analytic", "v100-16gb",
            "--micro-batch-sizes", "1,4,16", "--json"]
    assert run_command(profile_cmd, argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"] == "analytic" and data["device"] == "v100-16gb"
    totals = data["totals"]
    assert [row["micro_batch_size"] for row in totals] == [1, 4, 16]
    assert totals[0]["ms_per_sample"] > totals[1]["ms_per_sample"] > totals[2]["ms_per_sample"]
    assert len(data["top_ops"]) == 5 and data["param_bytes"] > 0


def test_bad_sizes_are_rejected_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        run_command(profile_cmd, ["profile", "--model", "toy_chain", "--micro-batch-sizes", "0,2"])
