"""`--schedule zero-bubble` on `graphpipe simulate` and `graphpipe show`: the split schedule runs from the command
line, no slower than 1F1B, its grid showing the input and weight halves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphpipe.cli.show_cmd as show_cmd
import graphpipe.cli.simulate_cmd as simulate_cmd
from tests.cli.run_command import run_command
from tests.simulation.factories import diamond, make_costs


def test_simulate_and_show_take_the_zero_bubble_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = diamond(2, 8, bytes_per_sample=1e6)
    plan_path, costs_path = tmp_path / "plan.json", tmp_path / "costs.json"
    plan.save(str(plan_path))
    make_costs(plan, param_bytes=10**6).save(str(costs_path))
    found = {}
    for schedule in ("1f1b", "zero-bubble"):
        assert run_command(simulate_cmd, ["simulate", str(plan_path), "--costs", str(costs_path), "--schedule",
                                          schedule, "--json"]) == 0
        found[schedule] = json.loads(capsys.readouterr().out)
    assert found["zero-bubble"]["schedule"] == "zero-bubble"
    assert found["zero-bubble"]["iteration_time_s"] <= found["1f1b"]["iteration_time_s"]
    assert found["zero-bubble"]["peak_memory_bytes"] == found["1f1b"]["peak_memory_bytes"]
    assert run_command(show_cmd, ["show", str(plan_path), "--schedule", "zero-bubble"]) == 0
    grid = capsys.readouterr().out
    assert "I0" in grid and "W0" in grid
