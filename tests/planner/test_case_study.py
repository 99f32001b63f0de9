"""The paper's case study (docs/method.md §6) on the zoo's `two_branch` model: 8 devices, memory-limited.

Two branches of 4 [attention + 2 linear] layers, a concat and a head. The paper's graph
pipeline ends in a merge stage M that takes the tails of both branches plus the concat and
the head (`graphpipe.planner.sp_dp.fork_join`), so both sources are 4 stages from the sink and hold
4 micro-batches where a chain of 8 stages holds 8. Three memory limits show the three regimes:

- 0.38 GiB: the sequential pipeline is 8 deep with micro-batch 1 (one layer per device).
  graphpipe's graph is 4 deep with micro-batch 2: A1 -> A2 -> A3' -> M and B1 -> B2 -> B3' -> M,
  where A3' is layer 3 and the attention of layer 4, and M the feed-forward halves of both
  fourth layers with the concat and the head, on one device. A depth-5 graph would need 5
  micro-batches of 2 at its sources, which do not fit.
- 0.4 GiB: graphpipe runs the same 8 one-layer stages as the sequential pipeline, as two chains
  side by side, with micro-batch 2; the concat and the head ride on one branch's last stage,
  which makes the other chain one hop longer: depth 5, counted as docs/method.md §3 counts it.
- 0.52 GiB: M holds both whole fourth layers, the concat and the head on 2 data-parallel
  devices: depth 4 with micro-batch 4, against a sequential pipeline 7 deep with micro-batch 2
  (the model inputs are read from the data by every stage, so no stage waits for them).
"""

from __future__ import annotations

import pytest

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.graph.capture import capture
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, SPParallel
from graphpipe.models import load_model
from graphpipe.planner.api import make_request
from graphpipe.planner.build import build_plan
from graphpipe.planner.sp_dp import TOLERANCE
from graphpipe.planner.stage_spec import Partition, StageSpec
from graphpipe.planning import plan

GiB = 2**30
BATCH = 128


@pytest.fixture(scope="module")
def two_branch() -> tuple:
    zoo = load_model("two_branch", "paper", device="meta")
    graph = capture(zoo.model, zoo.inputs)
    return graph, analytic_costs(graph, "v100-16gb")


def _layers(graph: OpGraph) -> tuple[list[list[tuple[str, ...]]], tuple[str, ...]]:
    """Ops of every layer of each branch (a branch's input with its first layer), and the join ops."""
    tree = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 1), 1).sp_tree
    block = tree.items[0]
    assert isinstance(block, SPParallel) and len(block.branches) == 2
    branches = []
    for branch in block.branches:
        assert isinstance(branch, SPChain)
        layers: list[list[str]] = []
        for op in branch.ops:
            if op.endswith("_norm1") or not layers:
                layers.append([])
            layers[-1].append(op)
        layers[1] = layers[0] + layers[1]  # the branch input goes with the first layer
        branches.append([tuple(layer) for layer in layers[1:]])
    join = tuple(op for item in tree.items[1:] for op in item.ops)
    return branches, join


def _layer_of(op: str) -> str:
    parts = op.split("_")
    return "_".join(parts[:3]) if op.startswith("branches_") else ""


def _plans(two_branch: tuple, limit_gib: float) -> tuple:
    graph, costs = two_branch
    cluster = cluster_preset("summit", 8)
    kwargs = {"memory_limit": limit_gib * GiB, "rank_by": "tps"}
    return (plan(graph, costs, cluster, BATCH, **kwargs),
            plan(graph, costs, cluster, BATCH, planner="sequential", **kwargs))


def test_depth_four_against_depth_eight_with_a_larger_micro_batch(two_branch: tuple) -> None:
    """The acceptance of the case study: depth 4 where `sequential` has depth 8, micro-batch at least as large."""
    gpp, spp = _plans(two_branch, 0.38)
    assert spp.depth == spp.num_stages == 8 and spp.stages[0].micro_batch_size == 1
    assert gpp.depth == 4 and gpp.stages[0].micro_batch_size == 2
    assert gpp.predicted_samples_per_s > spp.predicted_samples_per_s
    (a, b), join = _layers(two_branch[0])
    merge = next(stage for stage in gpp.stages if "head_fc" in stage.ops)
    assert set(join) <= set(merge.ops) and len(merge.ranks) == 1
    for branch in (a, b):  # M takes the tail of each branch's last layer, the rest of it ends that branch's chain
        assert set(merge.ops) & set(branch[3]) and not set(merge.ops) >= set(branch[3])
        assert not set(merge.ops) & set(op for layer in branch[:3] for op in layer)
    sources = [idx for idx, preds in gpp.predecessors.items() if not preds]
    assert len(sources) == 2


def test_depth_four_graph_with_a_merge_stage_and_twice_the_micro_batch(two_branch: tuple) -> None:
    gpp, spp = _plans(two_branch, 0.52)
    assert gpp.depth == 4 and gpp.num_stages == 7 and gpp.stages[0].micro_batch_size == 4
    assert spp.depth == 7 and spp.stages[0].micro_batch_size == 2
    assert gpp.predicted_samples_per_s > 1.15 * spp.predicted_samples_per_s
    (a, b), join = _layers(two_branch[0])
    merge = next(stage for stage in gpp.stages if "head_fc" in stage.ops)
    assert set(merge.ops) == set(a[3] + b[3] + join) and len(merge.ranks) == 2
    assert {frozenset(stage.ops) for stage in gpp.stages if stage is not merge} == {
        frozenset(layer) for layer in a[:3] + b[:3]}


def test_at_tighter_memory_the_branches_run_side_by_side_with_a_larger_micro_batch(two_branch: tuple) -> None:
    gpp, spp = _plans(two_branch, 0.4)
    assert spp.depth == spp.num_stages == 8 and spp.stages[0].micro_batch_size == 1
    assert gpp.num_stages == 8 and gpp.depth == 5
    assert gpp.stages[0].micro_batch_size == 2 > spp.stages[0].micro_batch_size
    assert gpp.predicted_samples_per_s > spp.predicted_samples_per_s
    for stage in gpp.stages:  # one layer per stage
        assert len({_layer_of(op) for op in stage.ops} - {""}) == 1
    sources = [idx for idx, preds in gpp.predecessors.items() if not preds]
    assert len(sources) == 2  # two chains start side by side, one per branch


@pytest.mark.parametrize("limit_gib", [0.38, 0.4, 0.45, 0.52, 0.6])
def test_never_worse_than_the_depth_four_graph_built_by_hand(two_branch: tuple, limit_gib: float) -> None:
    """Where the hand-built depth-4 graph fits, graphpipe's plan is at least as good."""
    graph, costs = two_branch
    cluster = cluster_preset("summit", 8)
    limit = limit_gib * GiB
    best = plan(graph, costs, cluster, BATCH, memory_limit=limit, rank_by="tps")
    model = make_request(graph, costs, cluster, BATCH, memory_limit=limit).model
    (a, b), join = _layers(graph)
    for size in (2, 4, 8):
        stages = [StageSpec(ops=layer, num_devices=1, micro_batch_size=size) for layer in a[:3] + b[:3]]
        stages.append(StageSpec(ops=a[3] + b[3] + join, num_devices=2, micro_batch_size=size))
        depth_four = build_plan(model, Partition(stages=tuple(stages)), "by hand")
        assert depth_four.depth == 4
        fits = all(stage.memory_bytes <= limit for stage in depth_four.stages)
        assert not fits or depth_four.predicted_tps_ms >= best.predicted_tps_ms * (1 - TOLERANCE)
