"""`graphpipe simulate` and `graphpipe show` on saved plans, with a costs file or the plan's own model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import graphpipe.cli.show_cmd as show_cmd
import graphpipe.cli.simulate_cmd as simulate_cmd
from graphpipe.cost.sources import CostSource
from graphpipe.errors import ModelLoadError
from graphpipe.simulation.simulator import simulate
from graphpipe.stages.stage_graph import Plan, Stage, StageEdge
from tests.cli.run_command import run_command
from tests.simulation.factories import diamond, make_cluster, make_costs


@pytest.fixture()
def saved(tmp_path: Path) -> tuple[Path, Path, Plan]:
    plan = diamond(2, 8, bytes_per_sample=1e6)
    plan_path, costs_path = tmp_path / "plan.json", tmp_path / "costs.json"
    plan.save(str(plan_path))
    make_costs(plan, param_bytes=10**6).save(str(costs_path))
    return plan_path, costs_path, plan


def test_simulate_prints_the_tables_and_writes_pictures(saved: tuple[Path, Path, Plan], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    plan_path, costs_path, _ = saved
    gantt, trace = tmp_path / "g.png", tmp_path / "t.json"
    assert run_command(simulate_cmd, ["simulate", str(plan_path), "--costs", str(costs_path), "--gantt",
                                      str(gantt), "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "samples/s" in out and "bubble" in out and "critical path: s0.F0" in out
    assert out.count("\ns") >= 4  # one row per stage
    assert gantt.stat().st_size > 10_000 and json.loads(trace.read_text())["traceEvents"]


def test_simulate_json_has_the_same_numbers_as_the_api(saved: tuple[Path, Path, Plan],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    plan_path, costs_path, plan = saved
    assert run_command(simulate_cmd, ["simulate", str(plan_path), "--costs", str(costs_path), "--schedule",
                                      "gpipe", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = simulate(plan, make_costs(plan, param_bytes=10**6), schedule="gpipe")
    assert data["iteration_time_s"] == pytest.approx(expected.iteration_time_s)
    assert data["peak_memory_bytes"] == list(expected.peak_memory_bytes)
    assert data["bubble_fraction"] == {str(k): pytest.approx(v) for k, v in expected.bubble_fraction.items()}


def test_plan_without_model_or_costs_is_explained(saved: tuple[Path, Path, Plan]) -> None:
    plan_path, _, _ = saved
    with pytest.raises(ModelLoadError, match="pass --costs"):
        run_command(simulate_cmd, ["simulate", str(plan_path)])


def test_model_spec_prefers_the_plan_then_the_command_line() -> None:
    plan = diamond(1, 2)
    spec = simulate_cmd.resolve_model_spec(
        Plan.from_dict({**plan.to_dict(), "graph_name": "mmt-paper"}), None, None, None, {"num_branches": 2})
    assert spec == {"model": "mmt", "preset": "paper", "options": {"num_branches": 2}}
    recorded = Plan.from_dict({**plan.to_dict(), "model_spec": {"model": "dlrm", "preset": "tiny", "options": {}}})
    assert Plan.from_dict(recorded.to_dict()).model_spec == {"model": "dlrm", "preset": "tiny", "options": {}}
    assert simulate_cmd.resolve_model_spec(recorded, None, "paper", 4, {})["preset"] == "paper"


def test_simulate_rebuilds_analytic_costs_from_the_plans_zoo_model(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """toy_diamond cut by hand into stem, two branches and head; no costs file."""
    groups = [("x", "stem_0", "stem_1"), ("left_0", "left_1"), ("right_0", "right_1", "right_2", "right_3"),
              ("add", "head", "output")]
    stages = tuple(Stage(idx=i, ops=ops, ranks=(i,), micro_batch_size=2, in_flight_samples=n)
                   for i, (ops, n) in enumerate(zip(groups, (6, 4, 4, 2))))
    edges = tuple(StageEdge(src=a, dst=b, tensors=(t,), bytes_per_sample=256.0)
                  for a, b, t in ((0, 1, "stem_1"), (0, 2, "stem_1"), (1, 3, "left_1"), (2, 3, "right_3")))
    plan = Plan(graph_name="toy_diamond-tiny", stages=stages, edges=edges, global_batch_size=8, num_devices=4,
                planner="hand", cluster=make_cluster(4).to_dict())
    plan.save(str(tmp_path / "plan.json"))
    assert run_command(simulate_cmd, ["simulate", str(tmp_path / "plan.json"), "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["costs"] == "analytic" and data["iteration_time_s"] > 0
    assert data["peak_in_flight_samples"] == {"0": 6, "1": 4, "2": 4, "3": 2}


def test_show_lists_stages_draws_the_graph_and_the_schedule(saved: tuple[Path, Path, Plan], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    plan_path, _, _ = saved
    picture = tmp_path / "stages.png"
    assert run_command(show_cmd, ["show", str(plan_path), "-o", str(picture), "--schedule", "1f1b"]) == 0
    out = capsys.readouterr().out
    assert "depth 3" in out and "s1,s2" in out and "stage |" in out
    assert picture.stat().st_size > 10_000
    assert run_command(show_cmd, ["show", str(plan_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depth"] == 3


# ---- the costs a plan records ------------------------------------------------------------------
PLAN_ARGS = ["plan", "--model", "toy_branches", "--preset", "tiny", "--cluster", "local-cpu", "--devices", "2",
             "--batch", "8"]


@pytest.fixture()
def planned_with_a_file(tmp_path: Path) -> tuple[Path, Path]:
    """A plan made from a costs file (the cpu model, saved as if measured), and that file."""
    import graphpipe.cli.plan_cmd as plan_cmd
    import graphpipe.cli.profile_cmd as profile_cmd

    costs_path, plan_path = tmp_path / "costs.json", tmp_path / "plan.json"
    assert run_command(profile_cmd, ["profile", "--model", "toy_branches", "--preset", "tiny", "--analytic", "cpu",
                                     "-o", str(costs_path), "--json"]) == 0
    costs_path.write_text(costs_path.read_text().replace('"source": "analytic"', '"source": "measured"'))
    assert run_command(plan_cmd, [*PLAN_ARGS, "--costs", str(costs_path), "-o", str(plan_path), "--json"]) == 0
    return plan_path, costs_path


def test_the_plan_file_keeps_its_cost_source(planned_with_a_file: tuple[Path, Path]) -> None:
    plan_path, costs_path = planned_with_a_file
    plan = Plan.load(str(plan_path))
    assert plan.cost_source == CostSource(kind="file", device="cpu", path=str(costs_path),
                                          sha256=hashlib.sha256(costs_path.read_bytes()).hexdigest())
    assert Plan.from_dict(plan.to_dict()) == plan
    old = {key: value for key, value in plan.to_dict().items() if key != "cost_source"}  # a file from before
    assert Plan.from_dict(old).cost_source is None


def test_simulate_uses_the_recorded_costs_file(planned_with_a_file: tuple[Path, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    plan_path, _ = planned_with_a_file
    capsys.readouterr()
    assert run_command(simulate_cmd, ["simulate", str(plan_path), "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["costs"] == "measured" and data["cost_source"]["kind"] == "file" and err == ""
    assert data["iteration_time_s"] == pytest.approx(Plan.load(str(plan_path)).predicted_iteration_s)


def test_simulate_warns_when_told_to_use_other_costs(planned_with_a_file: tuple[Path, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    plan_path, costs_path = planned_with_a_file
    capsys.readouterr()
    assert run_command(simulate_cmd, ["simulate", str(plan_path), "--device", "v100-16gb"]) == 0
    out, err = capsys.readouterr()
    recorded = Plan.load(str(plan_path)).cost_source
    assert err.strip() == (f"graphpipe simulate: warning: plan {plan_path} was costed with {recorded}; using "
                           "analytic costs on v100-16gb as asked")
    assert "analytic costs on v100-16gb" in out.splitlines()[0]
    costs_path.write_text(costs_path.read_text().replace('"source": "measured"', '"source": "measured (2)"'))
    assert run_command(simulate_cmd, ["simulate", str(plan_path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "that file has changed since" in err and str(recorded.sha256)[:12] in err
    assert json.loads(out)["costs"] == "measured (2)"


def test_simulate_recreates_recorded_analytic_costs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import graphpipe.cli.plan_cmd as plan_cmd

    plan_path = tmp_path / "plan.json"
    assert run_command(plan_cmd, [*PLAN_ARGS, "--dtype", "bf16", "-o", str(plan_path), "--json"]) == 0
    capsys.readouterr()
    assert run_command(simulate_cmd, ["simulate", str(plan_path), "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["cost_source"] == {"kind": "analytic", "device": "cpu", "dtype": "bfloat16"} and err == ""
    assert data["iteration_time_s"] == pytest.approx(Plan.load(str(plan_path)).predicted_iteration_s)
    assert run_command(show_cmd, ["show", str(plan_path)]) == 0
    assert "costs: analytic costs on cpu, bfloat16 activations" in capsys.readouterr().out
