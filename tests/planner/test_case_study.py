"""The paper's case study (PAPER.md §6) on the zoo's `two_branch` model: 8 devices, memory-limited.

Two branches of 4 [attention + 2 linear] layers. Weights force one layer per device; the
sequential pipeline is then 8 stages deep and its first stage holds 8 micro-batches, while the
graph pipeline runs the branches side by side (depth 4, plus the concat absorbed into the
last stage of one branch: 5 stages on the longest path) and affords a larger micro-batch.
"""

from __future__ import annotations

import pytest

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.graph.capture import capture
from graphpipe.models import load_model
from graphpipe.planning import plan

GiB = 2**30


@pytest.fixture(scope="module")
def two_branch() -> tuple:
    zoo = load_model("two_branch", "paper", device="meta")
    graph = capture(zoo.model, zoo.inputs)
    return graph, analytic_costs(graph, "v100-16gb")


def test_graph_pipeline_is_shallower_with_a_larger_micro_batch(two_branch: tuple) -> None:
    graph, costs = two_branch
    cluster = cluster_preset("summit", 8)
    kwargs = {"memory_limit": 0.4 * GiB, "rank_by": "tps"}
    gpp = plan(graph, costs, cluster, 128, **kwargs)
    spp = plan(graph, costs, cluster, 128, planner="sequential", **kwargs)
    assert spp.depth == spp.num_stages == 8
    assert gpp.depth <= 5 < spp.depth
    assert gpp.stages[0].micro_batch_size > spp.stages[0].micro_batch_size
    assert gpp.predicted_samples_per_s > spp.predicted_samples_per_s
