"""`--recompute` on `graphpipe plan` and `graphpipe simulate` (with `--write-plan`), and how `show`, `simulate` and
the Gantt chart mark recomputing stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphpipe.cli.main import main
from graphpipe.stages.stage_graph import Plan

PLAN = ["plan", "--model", "mmt", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "4", "--mini-batch", "32",
        "--micro-batch-sizes", "4", "--planner", "sequential", "--rank-by", "tps"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("recompute")
    keep, again = folder / "keep.json", folder / "again.json"
    assert main([*PLAN, "-o", str(keep)]) == 0
    assert main([*PLAN, "--recompute", "s0,s1", "-o", str(again)]) == 0
    return keep, again


def test_plan_recompute_writes_the_choice_and_prices_it(plans: tuple[Path, Path]) -> None:
    keep, again = (Plan.load(path) for path in plans)
    assert keep.recompute_stages == () and again.recompute_stages == (0, 1)
    assert "recompute" not in keep.to_dict()["stages"][0]
    for before, after in zip(keep.stages, again.stages):
        if after.recompute:  # holds several micro-batches: its memory falls, its backward and TPS rise
            assert after.memory_bytes < before.memory_bytes
            assert after.bwd_ms > before.bwd_ms and after.tps_ms > before.tps_ms
        else:
            assert (after.memory_bytes, after.bwd_ms, after.tps_ms) == (before.memory_bytes, before.bwd_ms,
                                                                        before.tps_ms)


def test_show_and_simulate_mark_recomputing_stages(plans: tuple[Path, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    keep, again = plans
    capsys.readouterr()
    assert main(["show", str(keep)]) == 0
    assert "recompute" not in capsys.readouterr().out
    assert main(["show", str(again), "-o", str(tmp_path / "stages.png")]) == 0
    text = capsys.readouterr().out
    assert "recompute: s0,s1" in text and " yes" in text and (tmp_path / "stages.png").stat().st_size > 0
    assert main(["simulate", str(again), "--gantt", str(tmp_path / "gantt.png")]) == 0
    text = capsys.readouterr().out
    assert "recomputing stages (s0,s1)" in text and (tmp_path / "gantt.png").stat().st_size > 0
    assert main(["simulate", str(again), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recompute_stages"] == [0, 1]


def test_simulate_recompute_writes_the_plan_as_plan_recompute_would(plans: tuple[Path, Path], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    keep, again = plans
    written = tmp_path / "written.json"
    assert main(["simulate", str(keep), "--recompute", "s0,s1", "--write-plan", str(written), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert str(written) in summary["written"]
    assert Plan.load(written).stages == Plan.load(again).stages
    assert main(["simulate", str(again), "--recompute", "none", "--json"]) == 0
    none = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(keep), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_memory_bytes"] == none["peak_memory_bytes"]


@pytest.mark.parametrize(("command", "message"), [
    (["--recompute", "s9"], "--recompute 's9': the plan has stages s0..s3, not s9"),
    (["--recompute", "x"], "'x' is not a stage"),
    (["--write-plan", "out.json"], "give --recompute too"),
])
def test_a_bad_recompute_is_a_usage_error(plans: tuple[Path, Path], command: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(plans[0]), *command]) == 2
    assert message in capsys.readouterr().err
