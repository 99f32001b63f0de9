"""`graphpipe plan`: the stage table, --json, -o, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphpipe.cli.plan_cmd as plan_cmd
from graphpipe.cli.main import main
from graphpipe.stages.stage_graph import Plan
from tests.cli.run_command import run_command


def test_plan_prints_stages_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = run_command(plan_cmd, ["plan", "--model", "toy_branches", "--preset", "tiny", "--cluster", "local-cpu",
                                  "--devices", "4", "--batch", "8", "--rank-by", "tps", "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "in-flight" in text and "depth" in text
    plan = Plan.load(str(out))
    assert plan.world_size <= 4 and plan.global_batch_size == 8 and plan.model_spec["model"] == "toy_branches"


def test_a_deep_model_planned_at_op_level_is_pointed_to_layer_granularity(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The hint counts the units at both levels (the tiny transformer: 36 op units, 4 layers kept whole, 8
    units); it is only given at op level, and only for graphs with LARGE_OP_GRAPH units or more."""
    command = ["plan", "--model", "transformer", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "2",
               "--batch", "4", "--rank-by", "tps"]
    assert run_command(plan_cmd, command) == 0
    assert "--granularity layer" not in capsys.readouterr().out  # 36 units: not a deep model
    monkeypatch.setattr(plan_cmd, "LARGE_OP_GRAPH", 36)
    assert run_command(plan_cmd, command) == 0
    note = next(line for line in capsys.readouterr().out.splitlines() if "--granularity layer" in line)
    assert "op level, 36 units" in note and "8 units (4 layers kept whole)" in note
    assert run_command(plan_cmd, [*command, "--granularity", "layer"]) == 0
    assert "--granularity layer this" not in capsys.readouterr().out


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_command(plan_cmd, ["plan", "--model", "toy_chain", "--preset", "tiny", "--cluster", "local-cpu",
                                  "--devices", "2", "--batch", "4", "--planner", "pipedream", "--rank-by", "tps",
                                  "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["planner"] == "pipedream" and data["stages"]


def test_bad_micro_batch_sizes_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "toy_chain", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "2",
                 "--batch", "8", "--micro-batch-sizes", "3,5"])
    assert code == 2 and "divides the mini-batch of 8" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "gib"), [("0.5", 0.5), ("512MiB", 0.5), ("0.38GiB", 0.38), ("2g", 2.0),
                                           ("16GB", 16e9 / 2**30), (" 1 TiB ", 1024.0)])
def test_memory_sizes_take_units(text: str, gib: float) -> None:
    from graphpipe.cli.common import memory_gib

    assert memory_gib(text) == pytest.approx(gib)


@pytest.mark.parametrize("text", ["lots", "0", "-1GiB", "1.5 parsecs", ""])
def test_a_memory_size_that_is_not_one_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--model", "toy_chain", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "2",
              "--memory-limit", text])
    assert exit_info.value.code == 2 and "--memory-limit" in capsys.readouterr().err


def test_memory_limit_with_a_unit_is_the_same_limit_in_gib(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "toy_branches", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "4",
            "--batch", "8", "--rank-by", "tps", "--json"]
    plans = []
    for limit in (["--memory-limit", "1MiB"], ["--memory-limit-gib", str(2**-10)]):
        assert run_command(plan_cmd, [*base, *limit]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0]["stages"] == plans[1]["stages"]
    assert all(stage["memory_bytes"] <= 2**20 for stage in plans[0]["stages"])


def test_a_local_cpu_plan_costs_ops_as_the_cpu_and_records_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The cluster implies the device when --device is not given (local-cpu: cpu, not a V100)."""
    from graphpipe.cost.sources import CostSource

    out = tmp_path / "plan.json"
    base = ["plan", "--model", "toy_branches", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "4",
            "--batch", "8", "--rank-by", "tps"]
    assert run_command(plan_cmd, [*base, "-o", str(out)]) == 0
    assert "costs: analytic costs on cpu" in capsys.readouterr().out
    plan = Plan.load(str(out))
    assert plan.cost_source == CostSource(kind="analytic", device="cpu") and plan.model_spec["device"] == "cpu"
    assert run_command(plan_cmd, [*base, "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted_tps_ms"] == plan.predicted_tps_ms
    assert run_command(plan_cmd, [*base, "--device", "v100-16gb", "--dtype", "bf16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost_source"] == {"kind": "analytic", "device": "v100-16gb",
                                                                  "dtype": "bfloat16"}


def test_an_op_level_graphpipe_plan_of_nested_blocks_is_warned_of_first(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """CLIP's towers (2 layers each here) hold one q/k/v block per layer inside each tower, and the vision tower
    one more (patch and class embeddings): 5 nested blocks. The note comes before the plan, on stderr, for
    graphpipe at op level only."""
    spec = f"{Path(__file__).resolve().parents[2] / 'examples' / 'clip_towers.py'}:factory"
    command = ["plan", "--model", spec, "--set", "layers=2", "--set", "width=32", "--cluster", "local-cpu",
               "--devices", "2", "--batch", "4", "--rank-by", "tps"]
    assert run_command(plan_cmd, command) == 0
    assert "parallel blocks" not in capsys.readouterr().err  # fewer than NESTED_BLOCKS
    monkeypatch.setattr(plan_cmd, "NESTED_BLOCKS", 5)
    assert run_command(plan_cmd, command) == 0
    note = next(line for line in capsys.readouterr().err.splitlines() if "parallel blocks" in line)
    assert "5 parallel blocks inside the branches of others" in note and "(4 layers kept whole)" in note
    for other in (["--granularity", "layer"], ["--planner", "sequential"]):
        assert run_command(plan_cmd, [*command, *other]) == 0
        assert "parallel blocks" not in capsys.readouterr().err


def test_the_llama_example_plans_and_is_warned_of_its_nested_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    """Two layers of Llama: the rotary embedding's two-level block inside the q and the k projection, four
    nested blocks a layer, eight in all."""
    pytest.importorskip("transformers")
    spec = f"{Path(__file__).resolve().parents[2] / 'examples' / 'llama.py'}:factory"
    command = ["plan", "--model", spec, "--preset", "tiny", "--cluster", "local-cpu", "--devices", "2", "--batch", "4",
               "--rank-by", "tps"]
    assert run_command(plan_cmd, command) == 0
    captured = capsys.readouterr()
    assert "8 parallel blocks inside the branches of others" in captured.err
    assert "graphpipe: " in captured.out
