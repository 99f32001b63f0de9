"""`graphpipe compare`: rows, speedups over the best sequential plan, and planners that give up."""

from __future__ import annotations

import importlib.util
import json

import pytest

import graphpipe.cli.compare_cmd as compare_cmd
from graphpipe.cli.compare_cmd import Row, render_rows
from graphpipe.errors import GraphPipeError
from tests.cli.run_command import run_command


def _row(planner: str, samples_per_s: float, *, sequential: bool, gave_up: str = "") -> Row:
    return Row(model="mmt", num_devices=8, global_batch_size=32, planner=planner, depth=2, micro_batch="4",
               samples_per_s=samples_per_s, peak_memory_bytes=2**30, search_time_s=0.5, sequential=sequential,
               gave_up=gave_up)


def test_speedup_is_over_the_best_sequential_plan() -> None:
    rows = compare_cmd._with_speedups([_row("graphpipe", 150.0, sequential=False),
                                       _row("sequential", 100.0, sequential=True),
                                       _row("pipedream", 120.0, sequential=True),
                                       _row("piper", 0.0, sequential=False, gave_up="too many downsets")])
    assert [r.speedup for r in rows] == [pytest.approx(1.25), pytest.approx(100 / 120), 1.0, 0.0]


def test_table_shows_planners_that_gave_up() -> None:
    text = render_rows([_row("graphpipe", 150.0, sequential=False),
                        _row("piper", 0.0, sequential=False, gave_up="too many downsets")])
    assert "gave up: too many downsets" in text and "150.0" in text and "1.00 GiB" in text
    long_reason = "no strategy within 2000 downsets: the search space grows exponentially with the branches"
    text = render_rows([_row("piper", 0.0, sequential=False, gave_up=long_reason)])
    assert "gave up: no strategy within 2000" in text and "…" in text
    assert text.splitlines()[-1].strip() == f"piper: {long_reason}"


def test_batches_default_to_four_per_device_and_must_match_the_devices() -> None:
    assert compare_cmd._batches(None, [8, 16]) == [32, 64]
    assert compare_cmd._batches("64", [8, 16]) == [64, 64]
    assert compare_cmd._batches("32,64", [8, 16]) == [32, 64]
    with pytest.raises(GraphPipeError, match="one per device count"):
        compare_cmd._batches("1,2,3", [8, 16])
    with pytest.raises(GraphPipeError, match="whole numbers"):
        compare_cmd._ints("8,x", "--devices")


@pytest.mark.skipif(importlib.util.find_spec("graphpipe.planning") is None, reason="planner not installed")
def test_compare_runs_end_to_end_on_a_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(compare_cmd, ["compare", "--model", "toy_branches", "--cluster", "local-cpu", "--devices",
                                     "4", "--batch", "8", "--planners", "graphpipe,sequential", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["planner"] for r in rows] == ["graphpipe", "sequential"]
    done = [r for r in rows if not r["gave_up"]]
    assert done and all(r["samples_per_s"] > 0 and r["depth"] >= 1 for r in done)
