"""Planning granularity: layer-level plans of every planner list ops, keep each layer whole and validate;
"auto" is never worse than "layer"; the exhaustive oracle agrees with the DP at layer level; the CLI flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest

import graphpipe.cli.capture_cmd as capture_cmd
import graphpipe.cli.compare_cmd as compare_cmd
import graphpipe.cli.plan_cmd as plan_cmd
import graphpipe.cli.train_cmd as train_cmd
from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.errors import PlanningError
from graphpipe.graph.capture import capture
from graphpipe.graph.op_graph import OpGraph
from graphpipe.models import load_model
from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.baselines.exhaustive import plan_exhaustive
from graphpipe.planner.granularity import boundary_blocks
from graphpipe.planning import plan
from graphpipe.stages.stage_graph import Plan
from graphpipe.stages.validate import check_runtime_rules, validate_plan
from tests.cli.run_command import run_command
from tests.planner.factories import chain_graph, make_cluster, make_costs

DP_TOLERANCE = 1e-3  # the partitioner's search precision


@cache
def zoo(name: str, num_layers: int | None = None) -> tuple[OpGraph, CostTable]:
    options = {} if num_layers is None else {"num_layers": num_layers}
    model, inputs, _, _ = load_model(name, "tiny", **options)
    graph = capture(model, inputs, name=name, capture="fx")
    return graph, analytic_costs(graph, "v100-16gb")


def check_layers_whole(result: Plan, graph: OpGraph, cluster: Cluster) -> None:
    validate_plan(result, graph, cluster)
    check_runtime_rules(result, graph)
    assert sorted(op for stage in result.stages for op in stage.ops) == sorted(graph.names)
    request = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster, 8, granularity="layer")
    assert request.blocks
    for block in request.blocks:
        assert len({result.stage_of_op(op).idx for op in block.ops}) == 1, f"{block.path} is cut"


@pytest.mark.parametrize("planner", ["graphpipe", "sequential", "parallel-only", "pipedream", "piper"])
@pytest.mark.parametrize("name", ["mmt", "transformer"])
def test_layer_plans_list_ops_keep_layers_whole_and_validate(planner: str, name: str) -> None:
    graph, costs = zoo(name)
    cluster = Cluster.preset("summit", 4)
    result = plan(graph, costs, cluster, 8, planner=planner, granularity="layer")
    assert result.granularity == "layer" and result.planner == planner
    check_layers_whole(result, graph, cluster)


def test_the_planners_see_one_unit_per_layer() -> None:
    graph, costs = zoo("mmt")
    op = make_request(graph, costs, Cluster.preset("summit", 4), 8)
    layer = make_request(graph, costs, Cluster.preset("summit", 4), 8, granularity="layer")
    assert len(layer.blocks) == 8 and op.blocks == ()
    assert len(layer.units.keys) == len(op.units.keys) - sum(len(block.keys) - 1 for block in layer.blocks)
    assert len(layer.chain_tree.items) == len(layer.units.keys) == 8 + 5  # the layers; cat, mean, norm, fc, output
    assert sorted(layer.sp_tree.ops) == sorted(graph.names)


@pytest.mark.parametrize("rank_by", ["simulation", "tps"])
@pytest.mark.parametrize(("name", "devices"), [("mmt", 4), ("mmt", 8), ("transformer", 4), ("dlrm", 8)])
def test_auto_is_never_worse_than_layer(name: str, devices: int, rank_by: str) -> None:
    graph, costs = zoo(name)
    cluster = Cluster.preset("summit", devices)
    layer = plan(graph, costs, cluster, 16, granularity="layer", rank_by=rank_by)
    auto = plan(graph, costs, cluster, 16, granularity="auto", rank_by=rank_by)
    assert auto.granularity == "auto"
    assert auto.predicted_iteration_s <= layer.predicted_iteration_s
    validate_plan(auto, graph, cluster)
    check_runtime_rules(auto, graph)


def test_auto_candidates_add_the_refined_search_to_the_layer_ones() -> None:
    graph, costs = zoo("transformer")
    cluster = Cluster.preset("summit", 2)
    layer = plan_candidates(graph, costs, cluster, 8, granularity="layer")
    auto = plan_candidates(graph, costs, cluster, 8, granularity="auto")
    opened = boundary_blocks(graph, layer[0])
    assert opened and opened < {f"layers.{k}" for k in range(4)}
    stages = {tuple(stage.ops for stage in candidate.stages) for candidate in auto}
    assert {tuple(stage.ops for stage in candidate.stages) for candidate in layer} <= stages
    assert min(p.predicted_tps_ms for p in auto) <= min(p.predicted_tps_ms for p in layer)
    assert all(candidate.granularity == "auto" for candidate in auto)


def test_layer_level_matches_the_exhaustive_oracle_and_op_level_is_no_worse() -> None:
    graph, costs = zoo("transformer", num_layers=2)
    cluster = Cluster.preset("summit", 3)
    kwargs = {"micro_batch_sizes": (2, 4), "granularity": "layer"}
    request = make_request(graph, costs, cluster, 8, **kwargs)
    model = request.model

    def bottleneck(candidate: Plan) -> float:
        return max(model.stage_cost(s.ops, len(s.ranks), s.micro_batch_size).tps_ms for s in candidate.stages)

    def oracle(**options: bool) -> float:
        return min(max(model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in p.stages)
                   for p in plan_exhaustive(request, **options))

    found = min(bottleneck(p) for p in plan_candidates(graph, costs, cluster, 8, **kwargs))
    assert oracle() - 1e-9 <= found <= oracle(sp_aligned=True) * (1 + DP_TOLERANCE) + 1e-9
    exhaustive = plan_candidates(graph, costs, cluster, 8, planner="exhaustive", **kwargs)
    for candidate in exhaustive:
        check_layers_whole(candidate, graph, cluster)
    op_level = min(bottleneck(p) for p in plan_candidates(graph, costs, cluster, 8, micro_batch_sizes=(2, 4)))
    assert op_level <= found * (1 + DP_TOLERANCE)


def test_without_module_stacks_layer_is_op_level() -> None:
    graph = chain_graph(6)  # made by hand: no module stacks, so no layer blocks
    costs, cluster = make_costs(graph), make_cluster(2)
    op = plan(graph, costs, cluster, 4, rank_by="tps")
    for granularity in ("layer", "auto"):
        other = plan(graph, costs, cluster, 4, rank_by="tps", granularity=granularity)
        assert [s.ops for s in other.stages] == [s.ops for s in op.stages]


def test_unknown_granularity_is_a_planning_error() -> None:
    graph = chain_graph(3)
    with pytest.raises(PlanningError, match="unknown granularity 'block'"):
        plan(graph, make_costs(graph), make_cluster(2), 4, granularity="block")
    with pytest.raises(PlanningError, match="unknown granularity"):
        plan_candidates(graph, make_costs(graph), make_cluster(2), 4, granularity="ops")


def test_plan_file_keeps_the_granularity_and_old_files_load() -> None:
    graph, costs = zoo("transformer")
    result = plan(graph, costs, Cluster.preset("summit", 2), 8, granularity="layer", rank_by="tps")
    assert Plan.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    data = result.to_dict()
    del data["granularity"]
    assert Plan.from_dict(data) == dataclasses.replace(result, granularity="op")


# ---- command line -------------------------------------------------------------------------------------
def test_plan_command_takes_the_granularity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "transformer", "--preset", "tiny", "--cluster", "summit", "--devices", "4",
            "--batch", "8", "--granularity", "layer", "-o", str(out)]
    assert run_command(plan_cmd, argv) == 0
    assert "layer granularity" in capsys.readouterr().out
    saved = Plan.load(str(out))
    assert saved.granularity == "layer"
    assert run_command(plan_cmd, [*argv[:-2], "--granularity", "auto", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["granularity"] == "auto"
    with pytest.raises(SystemExit):
        run_command(plan_cmd, [*argv[:-4], "--granularity", "module"])


def test_capture_command_counts_units_at_each_granularity(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capture", "--model", "mmt", "--preset", "tiny", "--capture", "fx"]
    assert run_command(capture_cmd, argv) == 0
    assert "granularity:  op 69 units, layer 13 units (8 x TransformerLayer kept whole)" in capsys.readouterr().out
    assert run_command(capture_cmd, [*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["units"] == {"op": 69, "layer": 13}
    assert data["layer_blocks"] == {"graphpipe.models.layers.TransformerLayer": 8}


def test_compare_command_takes_the_granularity(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "--model", "transformer", "--devices", "2", "--planners", "graphpipe,sequential",
            "--granularity", "layer", "--json"]
    assert run_command(compare_cmd, argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [row["planner"] for row in rows] == ["graphpipe", "sequential"] and not any(r["gave_up"] for r in rows)


def test_train_command_takes_the_granularity_for_planning() -> None:
    parser = argparse.ArgumentParser(prog="graphpipe")
    train_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "--model", "transformer", "--nproc", "2", "--granularity", "auto"])
    assert args.granularity == "auto"
    assert parser.parse_args(["train", "--model", "transformer", "--nproc", "2"]).granularity == "op"
